package clustertest

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// benchProfiles takes a CPU profile of each of the nodes that has an
// admin address, for BERTH_BENCH_PROFILE_SECONDS (5 by default), when
// BERTH_BENCH_PROFILE names a directory: one file per node,
// <benchmark>-<node>.pprof, for `go tool pprof`. It returns at once; the
// function it returns waits for the profiles. Without the variable it
// does nothing.
func benchProfiles(b *testing.B, nodes []*node) (wait func()) {
	dir := os.Getenv("BERTH_BENCH_PROFILE")
	if dir == "" {
		return func() {}
	}
	secs := 5
	if s, err := strconv.Atoi(os.Getenv("BERTH_BENCH_PROFILE_SECONDS")); err == nil && s > 0 {
		secs = s
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	for _, n := range nodes {
		admin := n.flag("-admin")
		if admin == "" {
			continue
		}
		path := filepath.Join(dir, strings.ReplaceAll(b.Name(), "/", "_")+"-"+n.name+".pprof")
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := fetchProfile(admin, secs, path); err != nil {
				b.Logf("profile of %s: %v", n.name, err)
			}
		}()
	}
	return wg.Wait
}

// fetchProfile saves the CPU profile of secs seconds that admin serves
// at /debug/pprof/profile into path.
func fetchProfile(admin string, secs int, path string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(secs+30)*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", admin, secs), nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s", resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// flag is the value the node was started with for name, the last one
// given ("" if none).
func (n *node) flag(name string) string {
	v := ""
	for i := 0; i+1 < len(n.args); i++ {
		if n.args[i] == name {
			v = n.args[i+1]
		}
	}
	return v
}
