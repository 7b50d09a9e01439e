package console_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/internal/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }

// requireBrowserEnv, when set, turns a missing Chromium into a failure:
// .ci/run sets it after installing the browser, so CI never skips.
const requireBrowserEnv = "BERTH_REQUIRE_BROWSER"

// screenshotEnv names a file for the screenshot (docs/console.png is made
// with it); then the test also lets its traffic run for a minute first,
// so that the charts have history. Without it the screenshot goes to the
// test's artifact directory (kept with go test -artifacts).
const screenshotEnv = "BERTH_CONSOLE_SCREENSHOT"

func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv(requireBrowserEnv) != "" {
		t.Fatalf("%s is set but no chromium is on PATH (Debian: apt-get install chromium)", requireBrowserEnv)
	}
	t.Skipf("no chromium on PATH: the browser test needs it (Debian: apt-get install chromium); set %s=1 to fail instead of skipping", requireBrowserEnv)
	return ""
}

// berthd is a real berthd process for one test.
type berthd struct {
	client, admin string
}

func startBerthd(t *testing.T) berthd {
	t.Helper()
	b := berthd{client: testutil.FreeAddr(t), admin: testutil.FreeAddr(t)}
	dir := t.TempDir()
	p := testutil.StartBerthd(t, filepath.Join(dir, "berthd.log"),
		"-listen", b.client, "-admin", b.admin, "-controller", testutil.FreeAddr(t),
		"-data", filepath.Join(dir, "data"), "-shards", "2", "-loops", "1", "-log-level", "warn")
	t.Cleanup(func() { p.Stop(t, syscall.SIGTERM, 10*time.Second) })
	p.WaitPort(t, b.client, 20*time.Second)
	testutil.WaitReady(t, b.admin, 20*time.Second)
	return b
}

type queueRow struct {
	Name    string `json:"name"`
	Ready   int    `json:"ready"`
	Unacked int    `json:"unacked"`
}

// brokerQueues reads /v1/queues, the view berthctl queues prints.
func brokerQueues(t *testing.T, admin string) map[string]queueRow {
	t.Helper()
	resp, err := http.Get("http://" + admin + "/v1/queues")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var rows []queueRow
	if err := json.NewDecoder(resp.Body).Decode(&rows); err != nil {
		t.Fatal(err)
	}
	out := map[string]queueRow{}
	for _, r := range rows {
		out[r.Name] = r
	}
	return out
}

// TestConsoleInBrowser drives the console in headless Chromium against a
// real berthd with known traffic: it checks the queue table's depths,
// ready and unacked counts, the connections table, the filter and the
// sort; that cancelling the purge confirmation purges nothing and that
// accepting it empties the queue (checked in /v1/queues too) and no other;
// that a queue declared from the page appears; and that the page raised
// no script error. It writes a screenshot.
func TestConsoleInBrowser(t *testing.T) {
	chromium := chromiumPath(t)
	b := startBerthd(t)
	shot := os.Getenv(screenshotEnv)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	if shot != "" {
		ctx, cancel = context.WithTimeout(context.Background(), 3*time.Minute)
	}
	defer cancel()

	// Known traffic: fixed depths, and a consumer holding 4 unacked.
	want := map[string]int{"orders": 120, "emails": 45, "invoices": 30, "audit.log": 0}
	conn, err := client.Dial(ctx, b.client)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for name, n := range want {
		if err := conn.DeclareQueue(ctx, name, client.QueueOptions{Durable: name == "orders"}); err != nil {
			t.Fatal(err)
		}
		for i := range n {
			if err := conn.PublishAsync(ctx, "", name, []byte(fmt.Sprintf(`{"%s":%d}`, name, i)), client.PublishOptions{}, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := conn.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	holder, err := client.Dial(ctx, b.client)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	sub, err := holder.Subscribe(ctx, "invoices", client.SubscribeOptions{Credit: 4})
	if err != nil {
		t.Fatal(err)
	}
	for range 4 {
		if _, err := sub.Next(ctx); err != nil {
			t.Fatal(err)
		}
	}

	// Live traffic for the charts on a queue the checks leave alone: a
	// bounded trickle, published and accepted, that stops with the test.
	trafficCtx, stopTraffic := context.WithCancel(ctx)
	var traffic sync.WaitGroup
	defer func() { stopTraffic(); traffic.Wait() }()
	if err := conn.DeclareQueue(ctx, "events", client.QueueOptions{}); err != nil {
		t.Fatal(err)
	}
	traffic.Add(2)
	go func() {
		defer traffic.Done()
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for i := 0; i < 30000; i++ {
			select {
			case <-trafficCtx.Done():
				return
			case <-tick.C:
			}
			for j := range 1 + i/500%4 { // 100, 200, 300, 400 msg/s, 5 s each
				if conn.PublishAsync(trafficCtx, "", "events", []byte(fmt.Sprint(i, ".", j)), client.PublishOptions{}, nil) != nil {
					return
				}
			}
		}
	}()
	go func() {
		defer traffic.Done()
		es, err := holder.Subscribe(trafficCtx, "events", client.SubscribeOptions{Credit: 64, AutoCredit: true, AckMode: client.AckNone})
		if err != nil {
			return
		}
		for {
			if _, err := es.Next(trafficCtx); err != nil {
				return
			}
			time.Sleep(4 * time.Millisecond) // slower than the peaks: the depth moves
		}
	}()

	allocCtx, cancelAlloc := chromedp.NewExecAllocator(ctx,
		chromedp.ExecPath(chromium),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("hide-scrollbars", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1440, 980),
	)
	defer cancelAlloc()
	var pageErrs struct {
		sync.Mutex
		list []string
	}
	browser, cancelBrowser := chromedp.NewContext(allocCtx)
	defer cancelBrowser()
	// The first Run starts the browser; its context must be the browser's.
	if err := chromedp.Do(browser, chromedp.EmulateViewport(1440, 980)); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	messages := chromedp.Console(browser)
	go func() {
		for m, err := range messages {
			if err != nil {
				return
			}
			if m.IsException() || m.Type == "error" || m.Type == "assert" {
				pageErrs.Lock()
				pageErrs.list = append(pageErrs.list, m.String())
				pageErrs.Unlock()
			}
		}
	}()

	run := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		sctx, scancel := context.WithTimeout(browser, 10*time.Second)
		defer scancel()
		if err := chromedp.Do(sctx, steps...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	// waitJS waits until the expression is true, polling the page.
	waitJS := func(what, expr string) {
		t.Helper()
		sctx, scancel := context.WithTimeout(browser, 10*time.Second)
		defer scancel()
		if _, err := chromedp.Run(sctx, chromedp.Poll[bool](expr, chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(8*time.Second))); err != nil {
			var dump string
			dump, _ = chromedp.Run(browser, chromedp.Evaluate[string](`document.querySelector("#queue-table tbody").innerText + "\n--\n" + document.querySelector("#poll-state").innerText`))
			t.Fatalf("%s: %v\npage shows:\n%s", what, err, dump)
		}
	}
	cell := func(queue, col string) string {
		return fmt.Sprintf(`(document.querySelector('#queue-table tr[data-queue=%q] td[data-col=%q]') || {}).textContent`, queue, col)
	}

	run("open the console", chromedp.Navigate("http://"+b.admin+"/ui/"))
	for name, n := range want {
		waitJS(name+" depth", fmt.Sprintf(`%s === %q`, cell(name, "depth"), fmt.Sprint(n)))
	}
	waitJS("invoices ready and unacked", fmt.Sprintf(`%s === "26" && %s === "4" && %s === "1"`,
		cell("invoices", "ready"), cell("invoices", "unacked"), cell("invoices", "consumers")))
	waitJS("orders marked durable", `!!document.querySelector('#queue-table tr[data-queue="orders"] td[data-col="durable"] .tag')`)
	waitJS("overview", `document.querySelector("#ov-queues").textContent === "5" && document.querySelector("#hdr-ready").textContent === "ready"`)
	waitJS("connections table", `(() => {
		const rows = [...document.querySelectorAll("#conn-table tbody tr")];
		const consumers = rows.map(r => r.querySelector('[data-col="consumers"]').textContent).sort();
		return rows.length === 2 && consumers.join() === "0,2";
	})()`)

	// Filter, then sort by depth, largest first.
	run("filter", chromedp.SendKeys(chromedp.CSS("#queue-filter"), "voic"))
	waitJS("filtered to invoices", `[...document.querySelectorAll("#queue-table tbody tr")].map(r => r.dataset.queue).join() === "invoices"`)
	run("clear the filter", chromedp.Evaluate[chromedp.Void](`(() => {
		const f = document.querySelector("#queue-filter");
		f.value = "";
		f.dispatchEvent(new Event("input"));
	})()`))
	run("sort by depth", chromedp.Click(chromedp.CSS(`#queue-table th[data-sort="depth"]`)))
	waitJS("sorted by depth", `(() => {
		const names = [...document.querySelectorAll("#queue-table tbody tr")].map(r => r.dataset.queue).filter(n => n !== "events");
		return names.join() === "orders,emails,invoices,audit.log" &&
			document.querySelector('#queue-table th[data-sort="depth"]').getAttribute("aria-sort") === "descending";
	})()`)

	// Purge orders: cancelling the confirmation does nothing.
	purge := chromedp.Click(chromedp.CSS(`#queue-table tr[data-queue="orders"] button[data-action="purge"]`))
	run("ask to purge", purge)
	waitJS("confirmation shown", `document.querySelector("#confirm").open && document.querySelector("#confirm-title").textContent.includes("orders")`)
	run("cancel", chromedp.Click(chromedp.CSS("#confirm-cancel")))
	waitJS("confirmation closed", `!document.querySelector("#confirm").open`)
	renders, err := chromedp.Run(browser, chromedp.Evaluate[string](`document.querySelector("#queue-table tbody").dataset.renders`))
	if err != nil {
		t.Fatal(err)
	}
	waitJS("a poll after the cancel", fmt.Sprintf(`+document.querySelector("#queue-table tbody").dataset.renders > %s`, renders))
	if q := brokerQueues(t, b.admin)["orders"]; q.Ready != 120 {
		t.Fatalf("a cancelled purge changed orders: %+v", q)
	}
	waitJS("orders still 120", fmt.Sprintf(`%s === "120"`, cell("orders", "depth")))

	// Accepting it empties orders, and only orders.
	run("ask to purge again", purge)
	waitJS("confirmation shown again", `document.querySelector("#confirm").open`)
	run("confirm", chromedp.Click(chromedp.CSS("#confirm-ok")))
	waitJS("orders empty in the table", fmt.Sprintf(`%s === "0" && %s === "0"`, cell("orders", "depth"), cell("orders", "ready")))
	waitJS("purge reported", `document.querySelector("#toasts").textContent.includes("Purged 120 messages from orders")`)
	qs := brokerQueues(t, b.admin)
	if q, ok := qs["orders"]; !ok || q.Ready != 0 || q.Unacked != 0 {
		t.Fatalf("/v1/queues after the purge: orders %+v (present %t), want empty", q, ok)
	}
	if qs["emails"].Ready != 45 || qs["invoices"].Ready != 26 || qs["invoices"].Unacked != 4 {
		t.Fatalf("the purge touched other queues: %+v", qs)
	}

	// Declare a durable queue from the page.
	run("declare", chromedp.SendKeys(chromedp.CSS("#declare-name"), "payments"),
		chromedp.Click(chromedp.CSS("#declare-durable")),
		chromedp.Click(chromedp.CSS("#declare-submit")))
	waitJS("declared queue listed", `!!document.querySelector('#queue-table tr[data-queue="payments"] td[data-col="durable"] .tag')`)
	if _, ok := brokerQueues(t, b.admin)["payments"]; !ok {
		t.Fatal("the queue declared from the page is not in /v1/queues")
	}

	if shot != "" {
		// A minute of traffic, so that the charts show it.
		time.Sleep(70 * time.Second)
	} else {
		waitJS("charts drawn", `document.querySelectorAll("#chart-rates path.series").length > 0 && document.querySelectorAll("#chart-depth path.series").length > 0`)
	}
	run("scroll to top", chromedp.Evaluate[chromedp.Void](`window.scrollTo(0, 0)`))
	png, err := chromedp.Run(browser, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	if shot == "" {
		shot = filepath.Join(t.ArtifactDir(), "console.png")
	}
	if err := os.WriteFile(shot, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s (%d bytes)", shot, len(png))

	pageErrs.Lock()
	defer pageErrs.Unlock()
	if len(pageErrs.list) > 0 {
		t.Fatalf("the page logged errors:\n%s", strings.Join(pageErrs.list, "\n"))
	}
}
