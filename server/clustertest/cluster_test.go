// Package clustertest runs real berthd processes as a 3-member controller
// group (each broker embeds one member) and as a controller-only node, and
// checks that durable wiring goes through the group from any member and
// survives the loss of the controller leader.
package clustertest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/controlplane/ctlapi"
	"github.com/berthmq/berth/controlplane/ctlclient"
	"github.com/berthmq/berth/internal/testutil"
	"github.com/berthmq/berth/server"
)

func TestMain(m *testing.M) { testutil.Main(m) }

// node is one berthd process and what it needs to be restarted.
type node struct {
	name    string
	args    []string
	client  string // client address, "" for a controller-only node
	ctl     string // controller member address
	logPath string
	proc    *testutil.Proc // nil until started and after stop
}

func (n *node) start(t testing.TB) {
	t.Helper()
	n.proc = testutil.StartBerthd(t, n.logPath, n.args...)
}

// waitUp waits until the node's client port (or controller port) accepts
// a connection.
func (n *node) waitUp(t testing.TB, within time.Duration) {
	t.Helper()
	addr := n.client
	if addr == "" {
		addr = n.ctl
	}
	n.proc.WaitPort(t, addr, within)
}

func (n *node) stop(t testing.TB, sig syscall.Signal) {
	t.Helper()
	if n.proc == nil {
		return
	}
	n.proc.Stop(t, sig, 10*time.Second)
	n.proc = nil
}

// signal sends sig (SIGSTOP, SIGCONT) to a running node.
func (n *node) signal(sig syscall.Signal) {
	if n.proc != nil {
		_ = n.proc.Signal(sig)
	}
}

// kill ends the node's process at test cleanup.
func (n *node) kill() {
	if n.proc != nil {
		n.proc.Kill()
		n.proc = nil
	}
}

func (n *node) logTail() string { return testutil.FileTail(n.logPath, 4000) }

// keepLog copies a failed test's whole broker log into the directory
// BERTH_TEST_KEEP_LOGS names, if it names one (the test's own temporary
// directory goes when it ends).
func keepLog(t testing.TB, n *node) {
	dir := os.Getenv("BERTH_TEST_KEEP_LOGS")
	if dir == "" {
		return
	}
	b, err := os.ReadFile(n.logPath)
	if err == nil {
		err = os.MkdirAll(dir, 0o755)
	}
	if err == nil {
		name := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name()) + "." + n.name + ".log"
		err = os.WriteFile(filepath.Join(dir, name), b, 0o644)
	}
	if err != nil {
		t.Logf("keeping %s's log: %v", n.name, err)
	}
}

// startGroup starts len(roles) berthd processes forming one controller
// group; role "broker" embeds a member, "controller" runs only one.
func startGroup(t testing.TB, roles ...string) []*node {
	t.Helper()
	return startGroupArgs(t, nil, roles...)
}

// startGroupArgs is startGroup with extra berthd flags for every node.
func startGroupArgs(t testing.TB, extra []string, roles ...string) []*node {
	t.Helper()
	return startGroupEach(t, func(int, *node) []string { return extra }, roles...)
}

// startGroupEach is startGroup with extra berthd flags per node.
func startGroupEach(t testing.TB, each func(i int, n *node) []string, roles ...string) []*node {
	t.Helper()
	nodes := make([]*node, len(roles))
	var peers []string
	for i := range nodes {
		nodes[i] = &node{name: fmt.Sprintf("berthd-%d", i+1), ctl: testutil.FreeAddr(t)}
		peers = append(peers, fmt.Sprintf("%d=%s", i+1, nodes[i].ctl))
	}
	dir := t.TempDir()
	for i, n := range nodes {
		n.logPath = filepath.Join(dir, n.name+".log")
		n.args = []string{"-role", roles[i], "-data", filepath.Join(dir, n.name), "-admin", "",
			"-controller-id", fmt.Sprint(i + 1), "-controller-peers", strings.Join(peers, ","),
			"-shards", "1", "-loops", "1", "-log-level", "info"}
		n.args = append(n.args, each(i, n)...)
		if roles[i] == "broker" {
			n.client = testutil.FreeAddr(t)
			n.args = append(n.args, "-listen", n.client)
		}
	}
	t.Cleanup(func() {
		for _, n := range nodes {
			n.kill()
			if t.Failed() {
				t.Logf("%s log:\n%s", n.name, n.logTail())
				keepLog(t, n)
			}
		}
	})
	// All at once: each broker waits for a majority before it is up.
	for _, n := range nodes {
		n.start(t)
	}
	for _, n := range nodes {
		n.waitUp(t, 20*time.Second)
	}
	return nodes
}

func dial(t testing.TB, ctx context.Context, addr string) *client.Conn {
	t.Helper()
	c, err := client.Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func queueNames(w ctlapi.Wiring) []string {
	var names []string
	for _, q := range w.Queues {
		names = append(names, q.Name)
	}
	slices.Sort(names)
	return names
}

// TestThreeMemberController runs three brokers that embed a 3-member
// controller: a durable queue declared through one broker reaches another
// at its restart, and after the controller leader's process is killed the
// other two still commit a durable declare.
func TestThreeMemberController(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	nodes := startGroup(t, "broker", "broker", "broker")
	a, b := nodes[0], nodes[1]

	ca := dial(t, ctx, a.client)
	if err := ca.DeclareQueue(ctx, "q1", client.QueueOptions{Durable: true, MaxLength: 100}); err != nil {
		t.Fatal(err)
	}

	// (a) b learns q1 from the group when it restarts.
	b.stop(t, syscall.SIGTERM)
	b.start(t)
	b.waitUp(t, 20*time.Second)
	cb := dial(t, ctx, b.client)
	if err := cb.DeclareQueue(ctx, "q1", client.QueueOptions{Passive: true}); err != nil {
		t.Fatalf("b does not have q1 after its restart: %v", err)
	}
	// A redeclare with other options is refused from b's restored copy.
	if err := cb.DeclareQueue(ctx, "q1", client.QueueOptions{Durable: true, MaxLength: 5}); client.Code(err) == 0 {
		t.Fatal("b accepted q1 with different options")
	}
	// b proposes too, so both surviving brokers below have talked to the
	// leader that is then killed.
	if err := cb.DeclareQueue(ctx, "qb", client.QueueOptions{Durable: true}); err != nil {
		t.Fatal(err)
	}

	// Find the controller leader: a consistent read is served only there.
	var addrs []string
	for _, n := range nodes {
		addrs = append(addrs, n.ctl)
	}
	cc := ctlclient.NewClient(addrs)
	defer cc.Close()
	w, err := cc.GetWiring(ctx, ctlapi.ReadConsistent)
	if err != nil {
		t.Fatal(err)
	}
	if got := queueNames(w); !slices.Equal(got, []string{"q1", "qb"}) {
		t.Fatalf("controller queues %v, want [q1 qb]", got)
	}
	var leader *node
	for _, n := range nodes {
		if n.ctl == cc.Leader() {
			leader = n
		}
	}
	if leader == nil {
		t.Fatalf("leader %q is none of %v", cc.Leader(), addrs)
	}
	t.Logf("controller leader is %s; killing it", leader.name)

	// (b) kill -9 the leader; a surviving broker commits a new durable
	// declare through the other member.
	leader.stop(t, syscall.SIGKILL)
	var survivor *node
	var rest []string
	for _, n := range nodes {
		if n != leader {
			rest = append(rest, n.ctl)
			if survivor == nil {
				survivor = n
			}
		}
	}
	cs := dial(t, ctx, survivor.client)
	if err := cs.DeclareQueue(ctx, "q2", client.QueueOptions{Durable: true}); err != nil {
		t.Fatalf("declare through %s after the leader died: %v", survivor.name, err)
	}
	cr := ctlclient.NewClient(rest)
	defer cr.Close()
	w, err = cr.GetWiring(ctx, ctlapi.ReadConsistent)
	if err != nil {
		t.Fatal(err)
	}
	if got := queueNames(w); !slices.Equal(got, []string{"q1", "q2", "qb"}) {
		t.Fatalf("controller queues after the leader died %v, want [q1 q2 qb]", got)
	}

	// The killed node comes back and restores both queues.
	leader.start(t)
	leader.waitUp(t, 20*time.Second)
	cl := dial(t, ctx, leader.client)
	for _, q := range []string{"q1", "q2", "qb"} {
		if err := cl.DeclareQueue(ctx, q, client.QueueOptions{Passive: true}); err != nil {
			t.Fatalf("%s after its restart lacks %s: %v", leader.name, q, err)
		}
	}
}

// TestControllerOnly runs a one-member controller-only node: no client
// listener, the controller service and the admin HTTP answer.
func TestControllerOnly(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dir := t.TempDir()
	admin, ctl := testutil.FreeAddr(t), testutil.FreeAddr(t)
	n := &node{name: "controller-only", ctl: ctl, logPath: filepath.Join(dir, "berthd.log"),
		args: []string{"-role", "controller", "-data", filepath.Join(dir, "data"), "-admin", admin,
			"-controller-id", "1", "-controller-peers", "1=" + ctl, "-log-level", "info"}}
	t.Cleanup(func() {
		n.kill()
		if t.Failed() {
			t.Logf("log:\n%s", n.logTail())
		}
	})
	n.start(t)
	n.waitUp(t, 20*time.Second)

	cc := ctlclient.NewClient([]string{ctl})
	defer cc.Close()
	if err := cc.DeclareQueue(ctx, "only", ctlapi.QueueOptions{Durable: true}); err != nil {
		t.Fatal(err)
	}
	w, err := cc.GetWiring(ctx, ctlapi.ReadConsistent)
	if err != nil {
		t.Fatal(err)
	}
	if got := queueNames(w); !slices.Equal(got, []string{"only"}) {
		t.Fatalf("queues %v", got)
	}

	get := func(path string) []byte {
		t.Helper()
		resp, err := http.Get("http://" + admin + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %s: %s", path, resp.Status, body)
		}
		return body
	}
	if body := get("/healthz"); !bytes.Contains(body, []byte("ok")) {
		t.Fatalf("/healthz: %q", body)
	}
	if body := get("/debug/pprof/"); !bytes.Contains(body, []byte("goroutine")) {
		t.Fatalf("/debug/pprof/: %q", body)
	}
	var st struct {
		Role       string
		Controller struct {
			ID, Leader, Applied uint64
		}
	}
	if err := json.Unmarshal(get("/v1/status"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Role != "controller" || st.Controller.ID != 1 || st.Controller.Leader != 1 || st.Controller.Applied == 0 {
		t.Fatalf("/v1/status: %+v", st)
	}
	n.stop(t, syscall.SIGTERM)
}

// TestNoMajority: a broker whose controller group never gets a majority
// gives up after ControllerWait with a clear error instead of hanging.
func TestNoMajority(t *testing.T) {
	cfg := server.DefaultConfig()
	cfg.ClientAddr, cfg.AdminAddr, cfg.DataDir = "127.0.0.1:0", "", t.TempDir()
	cfg.Shards, cfg.Loops = 1, 1
	cfg.ControllerID = 1
	cfg.ControllerPeers = map[uint64]string{1: testutil.FreeAddr(t), 2: testutil.FreeAddr(t), 3: testutil.FreeAddr(t)}
	cfg.ControllerWait = 500 * time.Millisecond
	start := time.Now()
	s, err := server.Start(cfg)
	if err == nil {
		s.Close()
		t.Fatal("a broker started with one of three controller members")
	}
	if !strings.Contains(err.Error(), "elected no leader") || !strings.Contains(err.Error(), "2 of its 3") {
		t.Fatalf("error %q", err)
	}
	if waited := time.Since(start); waited < cfg.ControllerWait {
		t.Fatalf("gave up after %v, before the %v wait", waited, cfg.ControllerWait)
	}
	// The member it started was stopped: its port is free again.
	ln, err := net.Listen("tcp", cfg.ControllerPeers[1])
	if err != nil {
		t.Fatalf("controller port still held: %v", err)
	}
	ln.Close()
}
