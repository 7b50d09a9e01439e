package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berthmq/berth/controlplane"
	"github.com/berthmq/berth/controlplane/ctlapi"
	"github.com/berthmq/berth/controlplane/ctlclient"
	"github.com/berthmq/berth/internal/testutil"
	"github.com/berthmq/berth/journal"
	"github.com/berthmq/berth/server"
)

// startBroker runs a real broker with its in-process controller on
// loopback ports picked by the kernel.
func startBroker(t *testing.T) *server.Server {
	t.Helper()
	return startBrokerWith(t, nil)
}

// startBrokerWith is startBroker with the configuration changed by set.
func startBrokerWith(t *testing.T, set func(*server.Config)) *server.Server {
	t.Helper()
	cfg := server.DefaultConfig()
	cfg.ClientAddr = "127.0.0.1:0"
	cfg.AdminAddr = "127.0.0.1:0"
	cfg.ControllerAddr = "127.0.0.1:0"
	cfg.DataDir = t.TempDir()
	cfg.Fsync = journal.FsyncNever // the test is about the CLI, not durability
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	if set != nil {
		set(&cfg)
	}
	s, err := server.Start(cfg)
	if err != nil {
		t.Fatalf("start broker: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	if s.AdminAddr() == "" || s.ControllerAddr() == "" {
		t.Fatalf("broker without admin (%q) or controller (%q)", s.AdminAddr(), s.ControllerAddr())
	}
	return s
}

// ctl runs berthctl against s and returns its exit code and outputs.
func ctl(t *testing.T, s *server.Server, args ...string) (int, string, string) {
	t.Helper()
	full := append([]string{"--broker", s.ClientAddr(), "--admin", s.AdminAddr(), "--controller", s.ControllerAddr(), "--timeout", "5s"}, args...)
	var stdout, stderr bytes.Buffer
	code := run(full, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

func mustCtl(t *testing.T, s *server.Server, args ...string) string {
	t.Helper()
	code, out, errOut := ctl(t, s, args...)
	if code != exitOK {
		t.Fatalf("berthctl %v: exit %d, stderr: %s", args, code, errOut)
	}
	return out
}

func wiringQueues(t *testing.T, s *server.Server) map[string]queueJSON {
	t.Helper()
	var w wiringJSON
	out := mustCtl(t, s, "--json", "wiring")
	if err := json.Unmarshal([]byte(out), &w); err != nil {
		t.Fatalf("wiring --json is not JSON: %v\n%s", err, out)
	}
	m := map[string]queueJSON{}
	for _, q := range w.Queues {
		m[q.Name] = q
	}
	return m
}

func brokerQueues(t *testing.T, s *server.Server) map[string]queueInfo {
	t.Helper()
	var qs []queueInfo
	out := mustCtl(t, s, "queues", "--json") // global flag after the command
	if err := json.Unmarshal([]byte(out), &qs); err != nil {
		t.Fatalf("queues --json is not JSON: %v\n%s", err, out)
	}
	m := map[string]queueInfo{}
	for _, q := range qs {
		m[q.Name] = q
	}
	return m
}

func TestDeclareListDelete(t *testing.T) {
	s := startBroker(t)

	// Flags after the name, as operators type them.
	mustCtl(t, s, "declare-queue", "orders", "--durable", "--max-length", "10", "--ttl", "1500ms")
	mustCtl(t, s, "declare-queue", "scratch") // transient: the controller must not hold it

	wq := wiringQueues(t, s)
	q, ok := wq["orders"]
	if !ok {
		t.Fatalf("durable queue missing from the controller's wiring: %v", wq)
	}
	if !q.Durable || q.MaxLength != 10 || q.TTLMs != 1500 {
		t.Fatalf("controller holds orders as %+v, want durable, max-length 10, ttl 1500ms", q)
	}
	if _, ok := wq["scratch"]; ok {
		t.Fatalf("transient queue recorded in the controller: %v", wq)
	}

	bq := brokerQueues(t, s)
	if info, ok := bq["orders"]; !ok || !info.Durable {
		t.Fatalf("broker lists orders as %+v (present %t), want a durable queue", info, ok)
	}
	if _, ok := bq["scratch"]; !ok {
		t.Fatalf("broker does not list the transient queue: %v", bq)
	}
	text := mustCtl(t, s, "queues")
	if !strings.HasPrefix(text, "NAME") || !strings.Contains(text, "orders") {
		t.Fatalf("queues table lacks its header or the queue:\n%s", text)
	}
	text = mustCtl(t, s, "wiring", "--read", "unsafe")
	if !strings.Contains(text, "max-length=10") {
		t.Fatalf("wiring table lacks the queue's options:\n%s", text)
	}

	mustCtl(t, s, "delete-queue", "orders")
	if _, ok := wiringQueues(t, s)["orders"]; ok {
		t.Fatal("deleted queue still in the controller's wiring")
	}
	if _, ok := brokerQueues(t, s)["orders"]; ok {
		t.Fatal("deleted queue still listed by the broker")
	}

	// Deleting it again is the broker's not-found, reported as a failure.
	code, _, errOut := ctl(t, s, "delete-queue", "orders")
	if code != exitFail || !strings.Contains(errOut, "not-found") {
		t.Fatalf("second delete: exit %d, stderr %q; want exit %d and not-found", code, errOut, exitFail)
	}
}

func TestBindShowsInWiring(t *testing.T) {
	s := startBroker(t)
	mustCtl(t, s, "declare-exchange", "events", "--type", "topic", "--durable")
	mustCtl(t, s, "declare-queue", "audit", "--durable")
	mustCtl(t, s, "bind", "events", "audit", "order.*")
	var w wiringJSON
	if err := json.Unmarshal([]byte(mustCtl(t, s, "--json", "wiring")), &w); err != nil {
		t.Fatal(err)
	}
	want := bindingJSON{Exchange: "events", Queue: "audit", Key: "order.*"}
	if len(w.Bindings) != 1 || w.Bindings[0] != want {
		t.Fatalf("bindings %+v, want [%+v]", w.Bindings, want)
	}
	mustCtl(t, s, "unbind", "events", "audit", "order.*")
	w = wiringJSON{}
	if err := json.Unmarshal([]byte(mustCtl(t, s, "--json", "wiring")), &w); err != nil {
		t.Fatal(err)
	}
	if len(w.Bindings) != 0 {
		t.Fatalf("bindings after unbind: %+v", w.Bindings)
	}
}

func TestStatus(t *testing.T) {
	s := startBroker(t)
	var st struct {
		Controller controllerStatus `json:"controller"`
		Broker     brokerStatus     `json:"broker"`
	}
	out := mustCtl(t, s, "--json", "status")
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("status --json: %v\n%s", err, out)
	}
	if st.Controller.Leader != s.ControllerAddr() || st.Controller.AppliedIndex == 0 {
		t.Fatalf("controller status %+v: want leader %s and an applied index", st.Controller, s.ControllerAddr())
	}
	if st.Broker.Clients != s.ClientAddr() {
		t.Fatalf("broker status names clients %q, want %q", st.Broker.Clients, s.ClientAddr())
	}
}

func TestBadUsage(t *testing.T) {
	s := startBroker(t)
	for _, args := range [][]string{
		{"no-such-command"},
		{},
		{"declare-queue"},
		{"declare-queue", "a", "b"},
		{"declare-queue", "q", "--overflow", "sideways"},
		{"declare-exchange", "x", "--type", "headers"},
		{"wiring", "--read", "stale"},
		{"elect"},
		{"elect", "minus-one"},
		{"clean-broker", "0"},
		{"queues", "--no-such-flag"},
	} {
		code, _, errOut := ctl(t, s, args...)
		if code != exitUsage {
			t.Errorf("berthctl %v: exit %d, want %d", args, code, exitUsage)
		}
		if !strings.Contains(errOut, "usage:") {
			t.Errorf("berthctl %v: no usage on stderr: %q", args, errOut)
		}
	}
	// A name starting with "-" can still be given after "--".
	mustCtl(t, s, "declare-queue", "--", "-dash")
	if _, ok := brokerQueues(t, s)["-dash"]; !ok {
		t.Fatal(`queue "-dash" not declared`)
	}
}

// TestGroupsAndElect gives the controller groups and a live broker, then
// pages through the groups, forces an election and cleans the broker out.
func TestGroupsAndElect(t *testing.T) {
	s := startBroker(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c := ctlclient.NewClient([]string{s.ControllerAddr()})
	defer c.Close()
	const groups = 3
	id, err := c.ApplyBrokerID(ctx, 0)
	if err != nil {
		t.Fatalf("apply broker id: %v", err)
	}
	if err := c.RegisterBroker(ctx, id, []string{"127.0.0.1:1"}, 1); err != nil {
		t.Fatalf("register broker: %v", err)
	}
	// Placed after both brokers registered: each holds every group.
	if err := c.SetClusterConfig(ctx, ctlapi.ClusterConfig{Groups: groups, Replicas: 2}); err != nil {
		t.Fatalf("set cluster config: %v", err)
	}
	var ends []ctlapi.GroupLogEnd
	for g := uint32(0); g < groups; g++ {
		ends = append(ends, ctlapi.GroupLogEnd{Group: g})
	}
	if err := c.Heartbeat(ctx, id, ends); err != nil {
		t.Fatalf("heartbeat: %v", err)
	}

	var page struct {
		Total  uint32      `json:"total"`
		Groups []groupJSON `json:"groups"`
	}
	// A page of two from group 1 sees groups 1 and 2 only.
	out := mustCtl(t, s, "--json", "groups", "--start", "1", "--count", "2")
	if err := json.Unmarshal([]byte(out), &page); err != nil {
		t.Fatalf("groups --json: %v\n%s", err, out)
	}
	if page.Total != groups || len(page.Groups) != 2 || page.Groups[0].ID != 1 || page.Groups[1].ID != 2 {
		t.Fatalf("groups page %+v, want total %d and groups 1, 2", page, groups)
	}

	var elected struct {
		NewMasters uint64      `json:"new_masters"`
		Groups     []groupJSON `json:"groups"`
	}
	out = mustCtl(t, s, "--json", "elect", "0", "2", "--preferred", strconv.FormatUint(uint64(id), 10))
	if err := json.Unmarshal([]byte(out), &elected); err != nil {
		t.Fatalf("elect --json: %v\n%s", err, out)
	}
	if elected.NewMasters != 2 {
		t.Fatalf("elect moved %d masters, want 2: %s", elected.NewMasters, out)
	}
	for _, g := range elected.Groups {
		if g.Master != id || g.Epoch == 0 {
			t.Fatalf("group %d after election: master %d epoch %d, want master %d", g.ID, g.Master, g.Epoch, id)
		}
	}
	text := mustCtl(t, s, "groups", "1")
	if !strings.Contains(text, "1 of 1 groups shown") {
		t.Fatalf("groups 1 table:\n%s", text)
	}
	// Lag, from the heartbeats: the master reports 7 entries in group 0,
	// the other replica (the test's broker, which runs no groups) none.
	ends[0].LogEnd = ctlapi.LogEnd{Epoch: elected.Groups[0].Epoch, Index: 7}
	if err := c.Heartbeat(ctx, id, ends); err != nil {
		t.Fatalf("heartbeat: %v", err)
	}
	out = mustCtl(t, s, "--json", "groups", "0")
	if err := json.Unmarshal([]byte(out), &page); err != nil {
		t.Fatalf("groups 0 --json: %v\n%s", err, out)
	}
	if lag := page.Groups[0].Lag; len(lag) != 1 || lag[0].Broker == id || lag[0].Entries != 7 {
		t.Fatalf("group 0's lag %+v, want one replica other than %d, 7 entries behind: %s", lag, id, out)
	}
	text = mustCtl(t, s, "groups", "0")
	want := fmt.Sprintf("[%d:7]", page.Groups[0].Lag[0].Broker)
	if !page.Groups[0].Lag[0].Alive { // the test's broker does not heartbeat its groups
		want = fmt.Sprintf("[%d:dead]", page.Groups[0].Lag[0].Broker)
	}
	if !strings.Contains(text, "LAG") || !strings.Contains(text, want) {
		t.Fatalf("groups 0 table lacks the LAG column or %s:\n%s", want, text)
	}

	mustCtl(t, s, "clean-broker", strconv.FormatUint(uint64(id), 10))
	brokers, err := c.GetBrokers(ctx, ctlapi.ReadConsistent)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range brokers {
		if b.ID == id {
			t.Fatalf("broker %d still registered after clean-broker", id)
		}
	}
}

// TestPrimary switches the in-process controller to active-passive with two
// heartbeating brokers, waits for the failure detector to elect a primary
// and hands the role to the other broker.
func TestPrimary(t *testing.T) {
	s := startBroker(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := ctlclient.NewClient([]string{s.ControllerAddr()})
	defer c.Close()
	if err := c.SetClusterConfig(ctx, ctlapi.ClusterConfig{Groups: 2}); err != nil {
		t.Fatalf("set cluster config: %v", err)
	}
	readPrimary := func() primaryJSON {
		t.Helper()
		var p primaryJSON
		out := mustCtl(t, s, "--json", "primary")
		if err := json.Unmarshal([]byte(out), &p); err != nil {
			t.Fatalf("primary --json: %v\n%s", err, out)
		}
		return p
	}
	if p := readPrimary(); p.Mode != "active-active" || p.Primary != 0 {
		t.Fatalf("active-active primary: %+v", p)
	}
	if code, _, errOut := ctl(t, s, "primary", "elect", "1"); code != exitFail || !strings.Contains(errOut, "active-active") {
		t.Fatalf("elect in active-active: exit %d, stderr %s", code, errOut)
	}
	for _, bad := range [][]string{{"primary", "elect"}, {"primary", "elect", "0"}, {"primary", "nonsense"}} {
		if code, _, _ := ctl(t, s, bad...); code != exitUsage {
			t.Fatalf("berthctl %v: exit %d, want %d", bad, code, exitUsage)
		}
	}

	var ids []uint32
	for i := 0; i < 2; i++ {
		id, err := c.ApplyBrokerID(ctx, 0)
		if err != nil {
			t.Fatalf("apply broker id: %v", err)
		}
		if err := c.RegisterBroker(ctx, id, []string{"127.0.0.1:" + strconv.Itoa(9000+int(id))}, 1); err != nil {
			t.Fatalf("register broker: %v", err)
		}
		ids = append(ids, id)
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			for _, id := range ids {
				hctx, hcancel := context.WithTimeout(ctx, time.Second)
				_ = c.Heartbeat(hctx, id, []ctlapi.GroupLogEnd{{Group: 0}}) // a missed beat is retried
				hcancel()
			}
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	defer func() { close(stop); <-done }()
	if err := c.SetClusterConfig(ctx, ctlapi.ClusterConfig{Groups: 2, Mode: ctlapi.ModeActivePassive}); err != nil {
		t.Fatalf("set active-passive: %v", err)
	}
	var first primaryJSON
	testutil.WaitFor(t, 10*time.Second, func() error {
		if first = readPrimary(); first.Primary == 0 {
			return fmt.Errorf("no primary elected: %+v", first)
		}
		return nil
	})
	if first.Mode != "active-passive" || first.Epoch == 0 || len(first.Addrs) != 1 ||
		first.Addrs[0] != "127.0.0.1:"+strconv.Itoa(9000+int(first.Primary)) {
		t.Fatalf("first primary %+v", first)
	}
	other := ids[0]
	if other == first.Primary {
		other = ids[1]
	}
	var after primaryJSON
	out := mustCtl(t, s, "--json", "primary", "elect", strconv.FormatUint(uint64(other), 10))
	if err := json.Unmarshal([]byte(out), &after); err != nil {
		t.Fatalf("primary elect --json: %v\n%s", err, out)
	}
	if after.Primary != other || after.Epoch != first.Epoch+1 || after.Changed == nil || !*after.Changed {
		t.Fatalf("after handover to %d: %+v (before %+v)", other, after, first)
	}
	text := mustCtl(t, s, "primary", "elect", strconv.FormatUint(uint64(other), 10))
	if !strings.Contains(text, "did not change") || !strings.Contains(text, "active-passive") {
		t.Fatalf("repeated handover:\n%s", text)
	}
}

// startControllers runs a real controller group of size members on
// loopback listeners picked by the kernel, and returns the members and
// their addresses.
func startControllers(t *testing.T, size int) (map[uint64]*controlplane.Node, map[uint64]string) {
	t.Helper()
	lns := map[uint64]net.Listener{}
	addrs := map[uint64]string{}
	for id := uint64(1); id <= uint64(size); id++ {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns[id], addrs[id] = ln, ln.Addr().String()
	}
	nodes := map[uint64]*controlplane.Node{}
	dir := t.TempDir()
	for id := uint64(1); id <= uint64(size); id++ {
		n, err := controlplane.Start(controllerConfig(id, addrs, lns[id], dir))
		if err != nil {
			t.Fatal(err)
		}
		nodes[id] = n
	}
	t.Cleanup(func() {
		for _, n := range nodes {
			n.Stop()
		}
	})
	return nodes, addrs
}

func controllerConfig(id uint64, peers map[uint64]string, ln net.Listener, dir string) controlplane.Config {
	return controlplane.Config{ID: id, Peers: maps.Clone(peers), Listener: ln, Dir: filepath.Join(dir, strconv.FormatUint(id, 10)),
		TickInterval: 10 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
}

// ctlAt runs berthctl against the controllers at addrs.
func ctlAt(addrs []string, args ...string) (int, string, string) {
	full := append([]string{"--controller", strings.Join(addrs, ","), "--timeout", "10s"}, args...)
	var stdout, stderr bytes.Buffer
	code := run(full, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

type membersOut struct {
	Leader  uint64       `json:"leader"`
	Members []memberJSON `json:"members"`
}

// TestMembers lists a 3-member controller group, adds a joining fourth
// member and removes one of the first three with berthctl, and checks
// usage errors.
func TestMembers(t *testing.T) {
	nodes, addrs := startControllers(t, 3)
	list := []string{addrs[1], addrs[2], addrs[3]}
	readMembers := func() membersOut {
		t.Helper()
		code, out, errOut := ctlAt(list, "members", "--json")
		if code != exitOK {
			t.Fatalf("members --json: exit %d: %s", code, errOut)
		}
		var m membersOut
		if err := json.Unmarshal([]byte(out), &m); err != nil {
			t.Fatalf("members --json: %v\n%s", err, out)
		}
		return m
	}
	m := readMembers()
	if len(m.Members) != 3 || m.Leader == 0 {
		t.Fatalf("members %+v, want three and a leader", m)
	}
	leaders := 0
	for _, x := range m.Members {
		if x.Addr != addrs[x.ID] {
			t.Fatalf("member %d at %s, want %s", x.ID, x.Addr, addrs[x.ID])
		}
		if x.Leader {
			leaders++
			if x.ID != m.Leader || !nodes[x.ID].IsLeader() {
				t.Fatalf("member %d marked leader; leader is %d", x.ID, m.Leader)
			}
		}
	}
	if leaders != 1 {
		t.Fatalf("%d members marked leader: %+v", leaders, m)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addrs[4] = ln.Addr().String()
	cfg := controllerConfig(4, addrs, ln, t.TempDir())
	cfg.Join = true
	n4, err := controlplane.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	nodes[4] = n4
	code, out, errOut := ctlAt(list, "members", "add", "4="+addrs[4])
	if code != exitOK {
		t.Fatalf("members add: exit %d: %s", code, errOut)
	}
	if !strings.HasPrefix(out, "ID") || !strings.Contains(out, addrs[4]) || !strings.Contains(out, "*") {
		t.Fatalf("members add table:\n%s", out)
	}
	gone := uint64(1)
	if m.Leader == 1 {
		gone = 2
	}
	if code, _, errOut := ctlAt(list, "members", "remove", strconv.FormatUint(gone, 10)); code != exitOK {
		t.Fatalf("members remove %d: exit %d: %s", gone, code, errOut)
	}
	m = readMembers()
	var ids []uint64
	for _, x := range m.Members {
		ids = append(ids, x.ID)
	}
	want := []uint64{1, 2, 3, 4}
	want = slices.DeleteFunc(want, func(id uint64) bool { return id == gone })
	if !slices.Equal(ids, want) {
		t.Fatalf("members %v after add 4 and remove %d, want %v", ids, gone, want)
	}
	nodes[gone].Stop()
	delete(nodes, gone)
	// The group still commits, and the new member applies it.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := ctlclient.NewClient(list)
	defer c.Close()
	if err := c.DeclareQueue(ctx, "after-change", ctlapi.QueueOptions{Durable: true}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, func() error {
		var found bool
		err := n4.Read(ctx, ctlapi.ReadFollower, func(s *controlplane.State) {
			for _, q := range s.Wiring().Queues {
				found = found || q.Name == "after-change"
			}
		})
		if err == nil && !found {
			err = errors.New("not there")
		}
		if err != nil {
			return fmt.Errorf("member 4 does not hold the queue declared after the change: %v", err)
		}
		return nil
	})

	// The controller refuses what it cannot do, with its reason.
	if code, _, errOut := ctlAt(list, "members", "add", "5="+addrs[4]); code != exitFail || !strings.Contains(errOut, "already has the address") {
		t.Fatalf("add at a member's address: exit %d, stderr %s", code, errOut)
	}
	if code, _, errOut := ctlAt(list, "members", "add", "6=127.0.0.1:1", "7=127.0.0.1:2", "8=127.0.0.1:3"); code != exitFail || !strings.Contains(errOut, "at most 5") {
		t.Fatalf("growing to 6: exit %d, stderr %s", code, errOut)
	}
	for _, bad := range [][]string{
		{"members", "add"},
		{"members", "add", "4"},
		{"members", "add", "0=127.0.0.1:1"},
		{"members", "add", "x=127.0.0.1:1"},
		{"members", "add", "5=nohost"},
		{"members", "add", "5=127.0.0.1:0"},
		{"members", "add", "5=127.0.0.1:1", "5=127.0.0.1:2"},
		{"members", "add", "5=a:1", "6=a:2", "7=a:3", "8=a:4", "9=a:5", "10=a:6"},
		{"members", "remove"},
		{"members", "remove", "0"},
		{"members", "remove", "one"},
		{"members", "remove", "3", "3"},
		{"members", "promote", "3"},
	} {
		code, _, errOut := ctlAt(list, bad...)
		if code != exitUsage || !strings.Contains(errOut, "usage:") {
			t.Errorf("berthctl %v: exit %d, stderr %q; want exit %d and usage", bad, code, errOut, exitUsage)
		}
	}
}

// TestMembersSingle lists the one-member controller a broker embeds.
func TestMembersSingle(t *testing.T) {
	s := startBroker(t)
	var m membersOut
	if err := json.Unmarshal([]byte(mustCtl(t, s, "members", "--json")), &m); err != nil {
		t.Fatal(err)
	}
	if len(m.Members) != 1 || !m.Members[0].Leader || m.Members[0].ID != m.Leader {
		t.Fatalf("single controller members %+v", m)
	}
	text := mustCtl(t, s, "members")
	if !strings.HasPrefix(text, "ID") || !strings.Contains(text, "*") {
		t.Fatalf("members table:\n%s", text)
	}
}

// TestQueuesPaged lists queues a page at a time with --limit, --prefix and
// --after, following the next page's --after that berthctl prints.
func TestQueuesPaged(t *testing.T) {
	s := startBroker(t)
	for _, q := range []string{"dev-c", "dev-a", "dev-b", "other"} {
		mustCtl(t, s, "declare-queue", q)
	}
	var names []string
	after := ""
	for pages := 0; pages < 5; pages++ {
		code, out, errOut := ctl(t, s, "--json", "queues", "--limit", "2", "--prefix", "dev-", "--after", after)
		if code != exitOK {
			t.Fatalf("queues page: exit %d, stderr: %s", code, errOut)
		}
		var qs []queueInfo
		if err := json.Unmarshal([]byte(out), &qs); err != nil || len(qs) > 2 {
			t.Fatalf("page after %q: %v\n%s", after, err, out)
		}
		for _, q := range qs {
			names = append(names, q.Name)
		}
		_, next, ok := strings.Cut(strings.TrimSpace(errOut), "--after ")
		if !ok {
			break
		}
		after = next
	}
	if strings.Join(names, ",") != "dev-a,dev-b,dev-c" {
		t.Fatalf("pages listed %v, want dev-a, dev-b, dev-c", names)
	}
	if code, _, _ := ctl(t, s, "queues", "--limit", "-1"); code == exitOK {
		t.Fatal("--limit -1 accepted")
	}
}
