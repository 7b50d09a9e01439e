package main

import (
	"strings"
	"testing"
)

func TestParseMemoryLimit(t *testing.T) {
	for text, want := range map[string]int64{
		"0": 0, "1048576": 1 << 20, "512MiB": 512 << 20, "2GiB": 2 << 30, "1.5 GiB": 3 << 29, "64KB": 64000, "10B": 10,
	} {
		got, err := parseMemoryLimit(text)
		if err != nil || got != want {
			t.Errorf("parseMemoryLimit(%q) = %d, %v; want %d", text, got, err, want)
		}
	}
	for _, text := range []string{"", "lots", "-1GiB", "0%", "101%", "2XB", "1e400"} {
		if got, err := parseMemoryLimit(text); err == nil {
			t.Errorf("parseMemoryLimit(%q) = %d, want an error", text, got)
		}
	}
	ram, err := machineMemory()
	if err != nil {
		t.Skip(err)
	}
	got, err := parseMemoryLimit("40%")
	if err != nil || got <= 0 || got > ram {
		t.Errorf("40%% of %d bytes: %d, %v", ram, got, err)
	}
	o, err := parseArgs([]string{"-memory-limit", "256MiB"})
	if err != nil || o.cfg.MemoryLimit != 256<<20 {
		t.Errorf("-memory-limit 256MiB: %d, %v", o.cfg.MemoryLimit, err)
	}
}

func TestGoMemoryLimit(t *testing.T) {
	for _, c := range []struct {
		limit int64
		env   string
		want  int64
	}{
		{0, "", 0},                    // no budget: the runtime's default
		{2 << 30, "", 2 << 30},        // the budget
		{16 << 20, "", goMemoryFloor}, // a tiny budget gets the floor
		{2 << 30, "3GiB", 0},          // the operator's GOMEMLIMIT stands
	} {
		if got := goMemoryLimit(c.limit, c.env); got != c.want {
			t.Errorf("goMemoryLimit(%d, %q) = %d, want %d", c.limit, c.env, got, c.want)
		}
	}
}

// TestFrameSizeMax: -frame-size-max (BERTH_FRAME_SIZE_MAX, key
// frame-size-max) sets the server's frame limit, 1 MiB by default, 4 KiB
// to 64 MiB; anything else stops the start naming the flag.
func TestFrameSizeMax(t *testing.T) {
	o, err := parseArgs(nil)
	if err != nil || o.cfg.FrameSizeMax != 1<<20 {
		t.Fatalf("default: %d, %v; want 1 MiB", o.cfg.FrameSizeMax, err)
	}
	for text, want := range map[string]uint32{"16MiB": 16 << 20, "4096": 4096, "64MiB": 64 << 20, "2 MiB": 2 << 20} {
		if o, err := parseArgs([]string{"-frame-size-max", text}); err != nil || o.cfg.FrameSizeMax != want {
			t.Errorf("-frame-size-max %q: %d, %v; want %d", text, o.cfg.FrameSizeMax, err, want)
		}
	}
	for _, text := range []string{"4095", "65MiB", "big", "-1", ""} {
		if _, err := parseArgs([]string{"-frame-size-max", text}); err == nil || !strings.Contains(err.Error(), "-frame-size-max") {
			t.Errorf("-frame-size-max %q: %v, want an error naming the flag", text, err)
		}
	}
	t.Setenv("BERTH_FRAME_SIZE_MAX", "8MiB")
	if o, err := parseArgs(nil); err != nil || o.cfg.FrameSizeMax != 8<<20 {
		t.Errorf("BERTH_FRAME_SIZE_MAX=8MiB: %d, %v", o.cfg.FrameSizeMax, err)
	}
}
