package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// profileBytesMax bounds one downloaded profile.
const profileBytesMax = 256 << 20

// Profiler fetches pprof profiles from a server's admin HTTP endpoint
// (/debug/pprof/...) into Dir: a CPU profile over the measured phase, then
// heap, allocs, mutex and block snapshots when it ends.
type Profiler struct {
	Admin string // host:port or http://host:port
	Dir   string
	// Seconds is the CPU profile length when the run has no duration.
	Seconds int
	// Client defaults to one with a timeout beyond the CPU profile's span.
	Client *http.Client

	cpuDone chan error
}

// NewProfiler checks dir is writable and returns a Profiler.
func NewProfiler(admin, dir string) (*Profiler, error) {
	if admin == "" {
		return nil, errors.New("bench: --profile needs the server's admin address (--admin)")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("bench: profile dir: %w", err)
	}
	return &Profiler{Admin: admin, Dir: dir}, nil
}

func (p *Profiler) url(path string) string {
	base := p.Admin
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	return strings.TrimSuffix(base, "/") + "/debug/pprof/" + path
}

func (p *Profiler) client() *http.Client {
	if p.Client != nil {
		return p.Client
	}
	return &http.Client{Timeout: 10 * time.Minute}
}

// Start begins a CPU profile of seconds in the background.
func (p *Profiler) Start(ctx context.Context, seconds int) {
	p.cpuDone = make(chan error, 1)
	go func() {
		p.cpuDone <- p.fetch(ctx, fmt.Sprintf("profile?seconds=%d", seconds), "cpu.pprof")
	}()
}

// Finish waits for the CPU profile, fetches the others and returns notes
// on anything missing or empty.
func (p *Profiler) Finish(ctx context.Context) []string {
	var notes []string
	if p.cpuDone != nil {
		if err := <-p.cpuDone; err != nil {
			notes = append(notes, err.Error())
		}
	}
	for _, name := range []string{"heap", "allocs", "mutex", "block"} {
		if err := p.fetch(ctx, name, name+".pprof"); err != nil {
			notes = append(notes, err.Error())
			continue
		}
		if name == "mutex" || name == "block" {
			empty, err := p.emptyContention(ctx, name)
			if err != nil {
				notes = append(notes, err.Error())
			} else if empty {
				notes = append(notes, fmt.Sprintf("%s profile has no samples: the server does not set runtime.%s", name,
					map[string]string{"mutex": "SetMutexProfileFraction", "block": "SetBlockProfileRate"}[name]))
			}
		}
	}
	return notes
}

func (p *Profiler) fetch(ctx context.Context, path, file string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.url(path), nil)
	if err != nil {
		return fmt.Errorf("bench: profile %s: %w", path, err)
	}
	resp, err := p.client().Do(req)
	if err != nil {
		return fmt.Errorf("bench: profile %s: %w", path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("bench: profile %s: HTTP %d: %s", path, resp.StatusCode, strings.TrimSpace(string(msg)))
	}
	f, err := os.Create(filepath.Join(p.Dir, file))
	if err != nil {
		return fmt.Errorf("bench: profile %s: %w", path, err)
	}
	n, err := io.Copy(f, io.LimitReader(resp.Body, profileBytesMax+1))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && n > profileBytesMax {
		err = fmt.Errorf("larger than %d bytes", profileBytesMax)
	}
	if err != nil {
		return fmt.Errorf("bench: profile %s: %w", path, err)
	}
	return nil
}

// contentionLine is a sample line of the legacy text format:
// "<cycles> <count> @ <pcs>".
var contentionLine = regexp.MustCompile(`(?m)^\d+ \d+ @`)

// emptyContention tells whether a mutex or block profile holds no samples,
// which is what a server that never enabled them serves.
func (p *Profiler) emptyContention(ctx context.Context, name string) (bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.url(name+"?debug=1"), nil)
	if err != nil {
		return false, fmt.Errorf("bench: profile %s: %w", name, err)
	}
	resp, err := p.client().Do(req)
	if err != nil {
		return false, fmt.Errorf("bench: profile %s: %w", name, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, profileBytesMax))
	if err != nil {
		return false, fmt.Errorf("bench: profile %s: %w", name, err)
	}
	return !contentionLine.Match(body), nil
}
