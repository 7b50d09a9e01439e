package server_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/internal/testutil"
	"github.com/berthmq/berth/journal"
	"github.com/berthmq/berth/server"
)

// freeAddrs returns n distinct loopback addresses that were free a moment
// ago, for servers whose addresses a test needs before Start returns.
func freeAddrs(t *testing.T, n int) []string {
	t.Helper()
	var out []string
	for range n {
		out = append(out, testutil.FreeAddr(t))
	}
	return out
}

// readyz returns /readyz's status code and body; code 0 while the admin
// HTTP is not up.
func readyz(t *testing.T, admin string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + admin + "/readyz")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// waitReadyz polls /readyz until ok accepts the answer.
func waitReadyz(t *testing.T, admin string, within time.Duration, ok func(code int, body string) bool) (int, string) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		code, body := readyz(t, admin)
		if ok(code, body) {
			return code, body
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz still answers %d %q after %v", code, body, within)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// startAsync runs server.Start in the background; the channel yields its
// result. The test's cleanup closes a server that started.
func startAsync(t *testing.T, cfg server.Config) <-chan error {
	done, _ := startAsyncServer(t, cfg)
	return done
}

// startAsyncServer is startAsync, with a function that gives the server
// once Start returned it (nil before, or if it failed).
func startAsyncServer(t *testing.T, cfg server.Config) (<-chan error, func() *server.Server) {
	t.Helper()
	done := make(chan error, 1)
	var mu sync.Mutex
	var s *server.Server
	go func() {
		srv, err := server.Start(cfg)
		mu.Lock()
		s = srv
		mu.Unlock()
		done <- err
	}()
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		if s != nil {
			_ = s.Close()
		}
	})
	return done, func() *server.Server { mu.Lock(); defer mu.Unlock(); return s }
}

func brokerConfig(t *testing.T) server.Config {
	cfg := server.DefaultConfig()
	cfg.ClientAddr, cfg.AdminAddr = "127.0.0.1:0", ""
	cfg.DataDir = t.TempDir()
	cfg.Shards, cfg.Loops = 2, 2
	cfg.Logger = testLogger(t)
	return cfg
}

func mustContain(t *testing.T, body string, want []string, not []string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(body, w) {
			t.Errorf("/readyz body %q lacks %q", body, w)
		}
	}
	for _, n := range not {
		if strings.Contains(body, n) {
			t.Errorf("/readyz body %q names %q", body, n)
		}
	}
}

// TestReadyzWaitsForJournalRecovery restarts a broker that holds journaled
// messages and holds shard 0's journal recovery on a file system that
// blocks:
// /readyz answers 503 naming the journal (and the client listener, which
// comes after it), not the wiring, restored by then, nor the one-member
// controller, which leads; /metrics answers without asking the shards.
// Released, the broker starts and /readyz answers 200.
func TestReadyzWaitsForJournalRecovery(t *testing.T) {
	cfg := brokerConfig(t)
	cfg.ControllerAddr = "127.0.0.1:0"
	first := startServer(t, func(c *server.Config) { *c = cfg })
	c := dial(t, first)
	ctx := ctxT(t)
	if err := c.DeclareQueue(ctx, "kept", client.QueueOptions{Durable: true}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		if err := c.Publish(ctx, "", "kept", []byte("m"), client.PublishOptions{Persistent: true}); err != nil {
			t.Fatal(err)
		}
	}
	_ = c.Close()
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}

	ffs := journal.NewFaultFS(nil)
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	ffs.SetRule(func(op journal.Op, name string, n int) error {
		if op == journal.OpMkdirAll && strings.Contains(name, "shard-000") {
			once.Do(func() { close(entered); <-release })
		}
		return nil
	})
	cfg.JournalFS = ffs
	cfg.AdminAddr = freeAddrs(t, 1)[0]
	done := startAsync(t, cfg)
	select {
	case <-entered:
	case err := <-done:
		t.Fatalf("Start returned %v with its journal recovery held", err)
	case <-time.After(20 * time.Second):
		close(release)
		t.Fatal("journal recovery never began")
	}
	code, body := readyz(t, cfg.AdminAddr)
	if code != http.StatusServiceUnavailable {
		close(release)
		t.Fatalf("/readyz during journal recovery: %d %q", code, body)
	}
	// The shards recover at once; shard 1 may be done while shard 0 is
	// held.
	mustContain(t, body, []string{"journal: recovery not finished (", " of 2 shards recovered)", "clients: listener not started"},
		[]string{"wiring", "controller", "(2 of 2"})
	m := scrape(t, cfg.AdminAddr)
	if m["berth_ready"] != 0 || m["berth_controller_is_leader"] != 1 {
		t.Errorf("during recovery: berth_ready %v, berth_controller_is_leader %v", m["berth_ready"], m["berth_controller_is_leader"])
	}
	if _, ok := m[`berth_queue_depth{queue="kept"}`]; ok {
		t.Error("queue metrics exported before recovery")
	}
	if resp, err := http.Get("http://" + cfg.AdminAddr + "/v1/queues"); err != nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("/v1/queues during recovery: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	code, body = readyz(t, cfg.AdminAddr)
	if code != http.StatusOK || body != "ready\n" {
		t.Fatalf("/readyz after start: %d %q", code, body)
	}
	m = scrape(t, cfg.AdminAddr)
	if m[`berth_queue_depth{queue="kept"}`] != 5 || m[`berth_queue_published_total{queue="kept"}`] != 0 || m["berth_ready"] != 1 {
		t.Errorf("after recovery: depth %v published %v ready %v", m[`berth_queue_depth{queue="kept"}`],
			m[`berth_queue_published_total{queue="kept"}`], m["berth_ready"])
	}
	var recovered float64
	for shard := 0; shard < 2; shard++ {
		recovered += m[fmt.Sprintf("berth_shard_recovered_messages{shard=\"%d\"}", shard)]
	}
	if recovered != 5 {
		t.Errorf("berth_shard_recovered_messages sums to %v, want 5", recovered)
	}
}

// TestReadyzWaitsForControllerLeader runs a broker as member 1 of a
// 3-member controller. Alone, its member knows no leader: /readyz answers
// 503 naming the controller and the wiring and journal, which wait for
// it. Once member 2 (a controller-only node) runs, the group elects a
// leader, the broker starts and /readyz answers 200. When member 2 stops,
// the group loses its leader and /readyz answers 503 naming only the
// controller; when member 2 is back, 200 again.
func TestReadyzWaitsForControllerLeader(t *testing.T) {
	addrs := freeAddrs(t, 5)
	peers := map[uint64]string{1: addrs[0], 2: addrs[1], 3: addrs[2]}
	cfg := brokerConfig(t)
	cfg.ControllerID, cfg.ControllerPeers = 1, peers
	cfg.ControllerWait = time.Minute
	cfg.AdminAddr = addrs[3]
	done, started := startAsyncServer(t, cfg)

	_, body := waitReadyz(t, cfg.AdminAddr, 20*time.Second, func(code int, body string) bool {
		return code == http.StatusServiceUnavailable && strings.Contains(body, "controller: no leader known")
	})
	mustContain(t, body, []string{"wiring: not restored", "journal: recovery not finished", "clients: listener not started"}, nil)
	select {
	case err := <-done:
		t.Fatalf("Start returned %v with one of three members", err)
	default:
	}

	m2dir := t.TempDir() // kept across member 2's restart
	member2 := func() *server.Server {
		c := server.DefaultConfig()
		c.Role = server.RoleController
		c.ControllerID, c.ControllerPeers = 2, peers
		c.DataDir = m2dir
		c.AdminAddr = addrs[4]
		c.Logger = testLogger(t)
		s, err := server.Start(c)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	m2 := member2()
	defer func() { _ = m2.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the broker did not start once its controller group had a majority")
	}
	if code, body := readyz(t, cfg.AdminAddr); code != http.StatusOK {
		t.Fatalf("/readyz after start: %d %q", code, body)
	}
	// The controller-only node's admin HTTP is built by the same function:
	// ready with a leader, and its member's metrics but no broker's.
	waitReadyz(t, addrs[4], 10*time.Second, func(code int, _ string) bool { return code == http.StatusOK })
	mc := scrape(t, addrs[4])
	if mc["berth_controller_leader"] == 0 || mc["berth_ready"] != 1 {
		t.Errorf("controller-only node: leader %v ready %v", mc["berth_controller_leader"], mc["berth_ready"])
	}
	if _, ok := mc["berth_connections"]; ok {
		t.Error("controller-only node exports broker metrics")
	}

	if err := m2.Close(); err != nil {
		t.Fatal(err)
	}
	_, body = waitReadyz(t, cfg.AdminAddr, 20*time.Second, func(code int, _ string) bool { return code == http.StatusServiceUnavailable })
	mustContain(t, body, []string{"controller: no leader known"}, []string{"wiring", "journal", "clients"})
	if m := scrape(t, cfg.AdminAddr); m["berth_controller_leader"] != 0 || m["berth_ready"] != 0 {
		t.Errorf("without a majority: berth_controller_leader %v, berth_ready %v", m["berth_controller_leader"], m["berth_ready"])
	}

	m2 = member2()
	waitReadyz(t, cfg.AdminAddr, 20*time.Second, func(code int, _ string) bool { return code == http.StatusOK })

	// Stopped while its controller group has no leader, the broker does
	// not wait out a controller call's timeout: its wiring sync, waiting
	// for a leader, held Close for all of its 10 s.
	if err := m2.Close(); err != nil {
		t.Fatal(err)
	}
	waitReadyz(t, cfg.AdminAddr, 20*time.Second, func(code int, _ string) bool { return code == http.StatusServiceUnavailable })
	start := time.Now()
	if err := started().Close(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("Close took %v without a controller leader", took)
	}
}
