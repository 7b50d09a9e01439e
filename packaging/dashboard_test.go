package packaging

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/internal/testutil"
)

var metricRE = regexp.MustCompile(`\b(?:berth|process|go)_[a-z0-9_]+`)

// dashboardMetrics returns every metric the dashboard's queries name, a
// histogram's _bucket, _sum and _count series under the histogram's name.
func dashboardMetrics(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Title  string `json:"title"`
		UID    string `json:"uid"`
		Panels []struct {
			Type    string `json:"type"`
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("grafana-dashboard.json: %v", err)
	}
	if dash.Title == "" || dash.UID == "" || len(dash.Panels) < 10 {
		t.Fatalf("dashboard title %q, uid %q, %d panels", dash.Title, dash.UID, len(dash.Panels))
	}
	seen := map[string]bool{}
	add := func(expr string) {
		for _, m := range metricRE.FindAllString(expr, -1) {
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				m = strings.TrimSuffix(m, suffix)
			}
			seen[m] = true
		}
	}
	for _, p := range dash.Panels {
		if p.Type != "row" && len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			if tg.Expr == "" {
				t.Errorf("panel %q has an empty query", p.Title)
			}
			add(tg.Expr)
		}
	}
	for _, v := range dash.Templating.List {
		add(v.Definition)
	}
	var names []string
	for m := range seen {
		names = append(names, m)
	}
	slices.Sort(names)
	return names
}

// documentedMetrics returns the berth_ metric names docs/METRICS.md lists,
// expanding its berth_messages_{published,delivered}_total shorthand.
func documentedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile("../docs/METRICS.md")
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, tok := range regexp.MustCompile("`(berth_[a-z0-9_{},]+)`").FindAllStringSubmatch(string(b), -1) {
		name := tok[1]
		pre, rest, ok := strings.Cut(name, "{")
		if !ok {
			names[name] = true
			continue
		}
		alts, post, _ := strings.Cut(rest, "}")
		for _, a := range strings.Split(alts, ",") {
			names[pre+a+post] = true
		}
	}
	return names
}

// TestDashboardMetrics: every berth_ metric the dashboard queries is one
// docs/METRICS.md lists, and every metric it queries is one a running
// broker with a durable queue and a persistent message exports.
func TestDashboardMetrics(t *testing.T) {
	used := dashboardMetrics(t)
	doc := documentedMetrics(t)
	if len(doc) < 30 {
		t.Fatalf("found only %d metric names in docs/METRICS.md", len(doc))
	}
	for _, m := range used {
		if strings.HasPrefix(m, "berth_") && !doc[m] {
			t.Errorf("the dashboard queries %s, which docs/METRICS.md does not list", m)
		}
	}
	for m := range doc {
		if !slices.Contains(used, m) {
			t.Logf("docs/METRICS.md lists %s; the dashboard has no panel for it", m)
		}
	}

	exported := scrapeBroker(t)
	for _, m := range used {
		if !exported[m] {
			t.Errorf("the dashboard queries %s, which berthd does not export", m)
		}
	}
}

// scrapeBroker starts a single-node berthd, declares a durable queue and
// publishes a persistent message to it, so that queue, journal and
// controller metrics all exist, and returns the metric families /metrics
// lists.
func scrapeBroker(t *testing.T) map[string]bool {
	t.Helper()
	dir := t.TempDir()
	addr, admin, ctl := testutil.FreeAddr(t), testutil.FreeAddr(t), testutil.FreeAddr(t)
	p := testutil.StartBerthd(t, filepath.Join(dir, "berthd.log"), "-listen", addr, "-admin", admin,
		"-controller", ctl, "-data", filepath.Join(dir, "data"), "-shards", "1", "-loops", "1", "-log-level", "warn")
	p.WaitPort(t, addr, 30*time.Second)
	get := func(path string) (int, string, error) {
		resp, err := http.Get("http://" + admin + path)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), err
	}
	testutil.WaitFor(t, 30*time.Second, func() error {
		code, body, err := get("/readyz")
		if err == nil && code != http.StatusOK {
			err = fmt.Errorf("/readyz %d: %s", code, body)
		}
		return err
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.DeclareQueue(ctx, "dashboard", client.QueueOptions{Durable: true}); err != nil {
		t.Fatal(err)
	}
	if err := c.Publish(ctx, "", "dashboard", []byte("hello"), client.PublishOptions{Persistent: true}); err != nil {
		t.Fatal(err)
	}
	code, body, err := get("/metrics")
	if err != nil || code != http.StatusOK {
		t.Fatalf("/metrics: %d %v", code, err)
	}
	families := map[string]bool{}
	for _, line := range strings.Split(body, "\n") {
		if f := strings.Fields(line); len(f) >= 3 && f[0] == "#" && f[1] == "TYPE" {
			families[f[2]] = true
		}
	}
	if !families["berth_queue_depth"] {
		t.Fatalf("/metrics has no berth_queue_depth after a declare and a publish:\n%s", body)
	}
	return families
}
