package main

import (
	"bufio"
	"bytes"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"

	"github.com/berthmq/berth/wire"
)

// memoryLimitDefault is -memory-limit's default: a share of the machine's
// RAM (or of the cgroup's limit, if lower), leaving the rest to the page
// cache the journal and the paging files read through, to the runtime's
// slack, and to what the budget does not count.
const memoryLimitDefault = "40%"

// parseMemoryLimit turns -memory-limit into bytes: "0" for no budget, a
// byte count with an optional unit (KiB, MiB, GiB, TiB, or KB, MB, GB,
// TB), or a percentage of the machine's RAM ("40%").
func parseMemoryLimit(text string) (int64, error) {
	text = strings.TrimSpace(text)
	bad := fmt.Errorf("-memory-limit %q: want bytes such as 2GiB or 512MiB, a share of RAM such as 40%%, or 0 for no limit", text)
	if pct, ok := strings.CutSuffix(text, "%"); ok {
		p, err := strconv.ParseFloat(strings.TrimSpace(pct), 64)
		if err != nil || p <= 0 || p > 100 {
			return 0, bad
		}
		ram, err := machineMemory()
		if err != nil {
			return 0, fmt.Errorf("-memory-limit %q: %w; give bytes instead", text, err)
		}
		return int64(float64(ram) * p / 100), nil
	}
	v, ok := parseBytes(text)
	if !ok {
		return 0, bad
	}
	return v, nil
}

// parseBytes reads a byte count with an optional unit (KiB, MiB, GiB,
// TiB, or KB, MB, GB, TB, or B): "16MiB", "1048576".
func parseBytes(text string) (int64, bool) {
	text = strings.TrimSpace(text)
	units := []struct {
		suffix string
		mult   float64
	}{
		{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
		{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"B", 1},
	}
	mult := 1.0
	for _, u := range units {
		if n, ok := strings.CutSuffix(text, u.suffix); ok {
			text, mult = strings.TrimSpace(n), u.mult
			break
		}
	}
	v, err := strconv.ParseFloat(text, 64)
	if err != nil || v < 0 || math.IsInf(v, 0) || v*mult > math.MaxInt64/2 {
		return 0, false
	}
	return int64(v * mult), true
}

// frameSizeDefault is -frame-size-max's default, wire.FrameSizeDefault.
const frameSizeDefault = "1MiB"

// parseFrameSize turns -frame-size-max into bytes: a byte count with an
// optional unit, from wire.FrameSizeMin to wire.FrameSizeMax.
func parseFrameSize(text string) (uint32, error) {
	v, ok := parseBytes(text)
	if !ok || v < wire.FrameSizeMin || v > wire.FrameSizeMax {
		return 0, fmt.Errorf("-frame-size-max %q: want bytes from 4KiB (%d) to 64MiB (%d), such as 1MiB or 16MiB",
			text, wire.FrameSizeMin, wire.FrameSizeMax)
	}
	return uint32(v), nil
}

// machineMemory is the RAM berthd may use: MemTotal, or the cgroup v2
// memory.max when that is lower.
func machineMemory() (int64, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, fmt.Errorf("cannot read the machine's memory: %w", err)
	}
	defer f.Close()
	var total int64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := bytes.CutPrefix(sc.Bytes(), []byte("MemTotal:")); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(string(rest)), " kB"), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("cannot parse MemTotal in /proc/meminfo: %w", err)
			}
			total = kb << 10
		}
	}
	if total == 0 {
		return 0, fmt.Errorf("no MemTotal in /proc/meminfo")
	}
	if b, err := os.ReadFile("/sys/fs/cgroup/memory.max"); err == nil {
		if limit, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil && limit > 0 && limit < total {
			total = limit
		}
	}
	return total, nil
}

// goMemoryFloor is the least soft limit berthd gives the Go runtime: a
// tiny budget (tests run with 16 MiB) must not have the collector run
// without pause over a process whose own base is about 30 MiB.
const goMemoryFloor = 128 << 20

// goMemoryLimit is the soft memory limit berthd sets for the Go runtime
// under a message budget of limit bytes, or 0 to leave the runtime's
// alone: with no budget, or when the operator set GOMEMLIMIT (goEnv).
//
// The budget counts what the broker holds; the heap of a collected
// language holds that plus garbage, up to twice the live heap at the
// default GOGC. Consuming a paged backlog allocates a body per message
// read back and frees it once delivered: under -memory-limit 2GiB the
// process reached 2.18 GiB of RSS with 1 GiB counted. With the runtime
// told the same limit, it collects harder as the heap nears it instead
// (the collector's CPU is capped by the runtime, so a live heap over the
// limit slows the broker rather than stopping it).
func goMemoryLimit(limit int64, goEnv string) int64 {
	if limit <= 0 || goEnv != "" {
		return 0
	}
	return max(limit, goMemoryFloor)
}
