package wiring

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthmq/berth/shards"
	"github.com/berthmq/berth/wire"
)

// gateLog is a wiring log that holds the changes of chosen names until
// released, and refuses those it is told to: it stands in for a
// controller whose consensus rounds take as long as the test wants.
type gateLog struct {
	mu     sync.Mutex
	held   map[string]chan struct{}
	refuse map[string]bool
	order  []string
}

func newGateLog() *gateLog {
	return &gateLog{held: map[string]chan struct{}{}, refuse: map[string]bool{}}
}

func (g *gateLog) pass(op, name string) error {
	g.mu.Lock()
	gate := g.held[name]
	refuse := g.refuse[name]
	g.mu.Unlock()
	if gate != nil {
		<-gate
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if refuse {
		return shards.Errorf(wire.CodeInternal, "controller: refused %s %s", op, name)
	}
	g.order = append(g.order, op+" "+name)
	return nil
}

func (g *gateLog) DeclareExchange(name string, _ uint8, _ ExchangeOptions) error {
	return g.pass("exchange", name)
}
func (g *gateLog) DeclareQueue(name string, _ shards.QueueOptions) error {
	return g.pass("queue", name)
}
func (g *gateLog) Bind(_, queue, _ string) error   { return g.pass("bind", queue) }
func (g *gateLog) Unbind(_, queue, _ string) error { return g.pass("unbind", queue) }
func (g *gateLog) DeleteQueue(name string) error   { return g.pass("delete", name) }
func (g *gateLog) DeleteExchange(name string) error {
	return g.pass("delete-exchange", name)
}
func (g *gateLog) Load() (*Snapshot, error) { return &Snapshot{}, nil }

func startWiring(t testing.TB, log Log) *Wiring {
	t.Helper()
	b := shards.New(shards.Config{Shards: 2, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	cfg := Config{Broker: b, Log: log, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if log != nil {
		cfg.Dir = t.TempDir() // Restore reads the log only for a broker with a data directory
	}
	w := New(cfg)
	if err := b.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Stop)
	if err := w.Restore(); err != nil {
		t.Fatal(err)
	}
	return w
}

// TestDeclaresDoNotWaitForOtherNames: while the log holds the durable
// declare of one queue (a slow consensus round), declares of other
// queues complete; the held queue is neither routable nor on its shard
// until its round commits.
func TestDeclaresDoNotWaitForOtherNames(t *testing.T) {
	g := newGateLog()
	release := make(chan struct{})
	g.held["slow"] = release
	w := startWiring(t, g)
	durable := shards.QueueOptions{Durable: true}
	slowDone := make(chan error, 1)
	go func() { _, err := w.DeclareQueue("slow", durable, false, nil); slowDone <- err }()
	// Wait until the slow declare is inside its round: it holds its name.
	deadline := time.Now().Add(10 * time.Second)
	for {
		if !w.names[stripe("slow")].TryLock() {
			break
		}
		w.names[stripe("slow")].Unlock()
		if time.Now().After(deadline) {
			t.Fatal("the slow declare never started")
		}
		time.Sleep(time.Millisecond)
	}
	for i := range 50 {
		name := "fast" + string(rune('a'+i%26)) + string(rune('a'+i/26))
		if stripe(name) == stripe("slow") {
			continue // shares the slow name's lock: it would wait, by design
		}
		done := make(chan error, 1)
		go func() { _, err := w.DeclareQueue(name, durable, false, nil); done <- err }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("declare %s: %v", name, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("declare of %s waited for the round of another queue", name)
		}
	}
	if w.Routing().Queue([]byte("slow")) != nil {
		t.Fatal("a queue is routable before its declare committed")
	}
	select {
	case err := <-slowDone:
		t.Fatalf("the held declare finished before its round: %v", err)
	default:
	}
	close(release)
	if err := <-slowDone; err != nil {
		t.Fatal(err)
	}
	if w.Routing().Queue([]byte("slow")) == nil {
		t.Fatal("the committed queue is not routable")
	}
}

// TestRefusedDeleteKeepsQueue: a durable queue whose deletion the log
// refuses stays, with its messages' shard state untouched.
func TestRefusedDeleteKeepsQueue(t *testing.T) {
	g := newGateLog()
	w := startWiring(t, g)
	if _, err := w.DeclareQueue("q", shards.QueueOptions{Durable: true}, false, nil); err != nil {
		t.Fatal(err)
	}
	g.mu.Lock()
	g.refuse["q"] = true
	g.mu.Unlock()
	if _, err := w.DeleteQueue("q", false, false); err == nil {
		t.Fatal("delete succeeded although the log refused it")
	}
	q := w.Routing().Queue([]byte("q"))
	if q == nil {
		t.Fatal("the queue is gone although its deletion was refused")
	}
	deleted := true
	if err := w.b.Call(w.b.Shards()[q.Shard()], func(*shards.Shard) { deleted = q.Deleted() }); err != nil {
		t.Fatal(err)
	}
	if deleted {
		t.Fatal("the shard dropped the queue although its deletion was refused")
	}
	g.mu.Lock()
	g.refuse["q"] = false
	g.mu.Unlock()
	if _, err := w.DeleteQueue("q", false, false); err != nil {
		t.Fatal(err)
	}
	if w.Routing().Queue([]byte("q")) != nil {
		t.Fatal("deleted queue still routable")
	}
}

// TestWiringFileFromBeforeWireOptions: a wiring file written when queue
// options held the TTL in nanoseconds restores the same TTL.
func TestWiringFileFromBeforeWireOptions(t *testing.T) {
	dir := t.TempDir()
	old := `{"version":1,"shards":1,"exchanges":[{"name":"dlx","kind":1,"options":{"Durable":true,"AutoDelete":false}}],
"queues":[{"name":"q","options":{"Durable":true,"Exclusive":false,"AutoDelete":false,"MaxDeliveries":3,
"MessageTTLNanos":60000000000,"MaxLength":10,"MaxLengthBytes":0,"Overflow":1,"DeadLetterExchange":"dlx","DeadLetterKey":"k"}}],
"bindings":[{"Exchange":"dlx","Queue":"q","Key":""}]}`
	if err := os.WriteFile(filepath.Join(dir, wiringFile), []byte(old), 0o644); err != nil {
		t.Fatal(err)
	}
	b := shards.New(shards.Config{Shards: 1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	w := New(Config{Broker: b, Dir: dir, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err := b.Start(); err != nil {
		t.Fatal(err)
	}
	defer b.Stop()
	if err := w.Restore(); err != nil {
		t.Fatal(err)
	}
	q := w.Routing().Queue([]byte("q"))
	if q == nil {
		t.Fatal("queue not restored")
	}
	want := shards.QueueOptions{Durable: true, MaxDeliveries: 3, MessageTTLMs: 60000, MaxLength: 10,
		Overflow: wire.OverflowDropHead, DeadLetterExchange: "dlx", DeadLetterKey: "k"}
	if *q.Options != want {
		t.Fatalf("restored options %+v, want %+v", q.Options, want)
	}
	if got, _ := w.Routing().Route([]byte("dlx"), nil, nil); len(got) != 1 || got[0] != q {
		t.Fatalf("binding not restored: %v", got)
	}
}

// snapLog is a wiring log that loads a fixed snapshot and refuses changes.
type snapLog struct{ snap *Snapshot }

func (l snapLog) DeclareExchange(string, uint8, ExchangeOptions) error { return errRefused }
func (l snapLog) DeclareQueue(string, shards.QueueOptions) error       { return errRefused }
func (l snapLog) Bind(_, _, _ string) error                            { return errRefused }
func (l snapLog) Unbind(_, _, _ string) error                          { return errRefused }
func (l snapLog) DeleteQueue(string) error                             { return errRefused }
func (l snapLog) DeleteExchange(string) error                          { return errRefused }
func (l snapLog) Load() (*Snapshot, error)                             { return l.snap, nil }

var errRefused = shards.Errorf(wire.CodeInternal, "controller: refused")

// bigSnapshot is n durable queues named q<i>, every tenth bound to a
// durable topic exchange by "dev<i>.*.temp".
func bigSnapshot(n int) *Snapshot {
	s := &Snapshot{Exchanges: []WiringExchange{{Name: "t", Kind: KindTopic, Options: ExchangeOptions{Durable: true}}}}
	s.Queues = make([]WiringQueue, n)
	for i := range s.Queues {
		s.Queues[i] = WiringQueue{Name: "q" + strconv.Itoa(i), Options: shards.QueueOptions{Durable: true}}
		if i%10 == 0 {
			s.Bindings = append(s.Bindings, Binding{Exchange: "t", Queue: s.Queues[i].Name, Key: "dev" + strconv.Itoa(i) + ".*.temp"})
		}
	}
	return s
}

// TestRestoreFromLog restores a snapshot with a queue listed twice and a
// binding to a topic pattern over the word cap (accepted before the cap),
// and checks queues, bindings and routes.
func TestRestoreFromLog(t *testing.T) {
	snap := bigSnapshot(1000)
	snap.Queues = append(snap.Queues, snap.Queues[3])
	long := strings.Repeat("a.", topicWordsMax) + "a"
	snap.Bindings = append(snap.Bindings, Binding{Exchange: "t", Queue: "q1", Key: long})
	w := startWiring(t, snapLog{snap})
	r := w.Routing()
	if r.Len() != 1000 {
		t.Fatalf("%d queues restored, want 1000", r.Len())
	}
	for _, i := range []int{0, 3, 999} {
		if q := r.Queue([]byte("q" + strconv.Itoa(i))); q == nil || !q.Options.Durable {
			t.Fatalf("queue q%d not restored as durable: %v", i, q)
		}
	}
	for _, i := range []int{0, 10, 990} {
		got := routeNames(t, r, "t", "dev"+strconv.Itoa(i)+".x.temp")
		if want := []string{"q" + strconv.Itoa(i)}; !slices.Equal(got, want) {
			t.Fatalf("route dev%d = %v, want %v", i, got, want)
		}
	}
	if got := routeNames(t, r, "t", "dev1.x.temp"); len(got) != 0 {
		t.Fatalf("an unbound key routes to %v", got)
	}
	if !r.hasBinding("t", "q1", long) {
		t.Fatal("the over-long pattern was not kept")
	}
	if got := routeNames(t, r, "t", strings.Repeat("a.", topicWordsMax-1)+"a"); len(got) != 0 {
		t.Fatalf("the over-long pattern matches %v", got)
	}
}

// TestRestoreWiringFile: without a log, a restart restores the wiring file,
// and the file still holds the wiring afterwards (Restore does not write it
// empty first).
func TestRestoreWiringFile(t *testing.T) {
	dir := t.TempDir()
	start := func() (*Wiring, func()) {
		b := shards.New(shards.Config{Shards: 2, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		w := New(Config{Broker: b, Dir: dir, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err := b.Start(); err != nil {
			t.Fatal(err)
		}
		if err := w.Restore(); err != nil {
			b.Stop()
			t.Fatal(err)
		}
		return w, b.Stop
	}
	w, stop := start()
	if err := w.DeclareExchange("x", KindDirect, ExchangeOptions{Durable: true}, false); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"a", "b"} {
		if _, err := w.DeclareQueue(q, shards.QueueOptions{Durable: true}, false, nil); err != nil {
			t.Fatal(err)
		}
		if err := w.Bind("x", q, "k"); err != nil {
			t.Fatal(err)
		}
	}
	stop()
	for range 2 {
		w, stop = start()
		if got := routeNames(t, w.Routing(), "x", "k"); !slices.Equal(got, []string{"a", "b"}) {
			t.Fatalf("after restart: route x k = %v", got)
		}
		stop()
		st, err := loadWiring(dir)
		if err != nil || st == nil || len(st.Queues) != 2 || len(st.Bindings) != 2 {
			t.Fatalf("wiring file after restore: %+v, %v", st, err)
		}
	}
}

// BenchmarkRestore restores n durable queues (a tenth of them bound) from
// a log, as a broker's start-up does after the controller's Load. With
// tick=100ms the shards run their expiry tick as berthd does (it visits
// only queues holding messages with a TTL, none here); tick=off leaves it
// out.
func BenchmarkRestore(b *testing.B) {
	for _, n := range benchRestoreSizes {
		snap := bigSnapshot(n)
		for _, tick := range []time.Duration{100 * time.Millisecond, time.Hour} {
			tickName := "100ms"
			if tick == time.Hour {
				tickName = "off"
			}
			b.Run(fmt.Sprintf("queues=%d/tick=%s", n, tickName), func(b *testing.B) {
				b.ReportAllocs()
				for range b.N {
					br := shards.New(shards.Config{Shards: 2, TickInterval: tick, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
					w := New(Config{Broker: br, Log: snapLog{snap}, Dir: b.TempDir(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
					if err := br.Start(); err != nil {
						b.Fatal(err)
					}
					if err := w.Restore(); err != nil {
						b.Fatal(err)
					}
					if w.Routing().Len() != n {
						b.Fatalf("%d queues", w.Routing().Len())
					}
					b.StopTimer()
					br.Stop()
					b.StartTimer()
				}
			})
		}
	}
}

var benchRestoreSizes = []int{100_000, 300_000, 1_000_000}

// TestQueuePage lists 2,500 queues (and some that the prefix leaves out)
// in pages of several sizes and checks that the pages, put together, are
// every matching name once, in order.
func TestQueuePage(t *testing.T) {
	w := startWiring(t, nil)
	var want []string
	for i := range 2500 {
		name := fmt.Sprintf("p-%05d", (i*7919)%2500) // declared out of order
		if _, err := w.DeclareQueue(name, shards.QueueOptions{}, false, nil); err != nil {
			t.Fatal(err)
		}
		want = append(want, name)
		if _, err := w.DeclareQueue(fmt.Sprintf("o-%d", i), shards.QueueOptions{}, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	slices.Sort(want)
	for _, limit := range []int{1, 7, 1000, 2500, 5000} {
		var got []string
		after := ""
		for pages := 0; ; pages++ {
			if pages > 2600 {
				t.Fatalf("limit %d: too many pages", limit)
			}
			page, more := w.QueuePage(after, "p-", limit)
			if len(page) > limit || (more && len(page) != limit) {
				t.Fatalf("limit %d: page of %d, more=%v", limit, len(page), more)
			}
			for _, q := range page {
				got = append(got, q.Name)
			}
			if !more {
				break
			}
			after = page[len(page)-1].Name
		}
		if !slices.Equal(got, want) {
			t.Fatalf("limit %d: pages hold %d names (first %v), want %d", limit, len(got), got[:min(3, len(got))], len(want))
		}
	}
	if page, more := w.QueuePage("p-02497", "p-", 10); len(page) != 2 || more {
		t.Fatalf("the last page is %d queues, more=%v", len(page), more)
	}
}

// BenchmarkRestoreBindings restores 1,000,000 topic bindings spread over
// 1,000 queues (a thousand per queue), the shape whose per-queue binding
// lists a restore once copied at each binding.
func BenchmarkRestoreBindings(b *testing.B) {
	const queues, bindings = 1000, 1_000_000
	s := &Snapshot{Exchanges: []WiringExchange{{Name: "t", Kind: KindTopic, Options: ExchangeOptions{Durable: true}}}}
	for i := range queues {
		s.Queues = append(s.Queues, WiringQueue{Name: "q" + strconv.Itoa(i), Options: shards.QueueOptions{Durable: true}})
	}
	for i := range bindings {
		s.Bindings = append(s.Bindings, Binding{Exchange: "t", Queue: "q" + strconv.Itoa(i%queues), Key: "dev" + strconv.Itoa(i) + ".*.temp"})
	}
	b.ReportAllocs()
	for range b.N {
		br := shards.New(shards.Config{Shards: 2, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		w := New(Config{Broker: br, Log: snapLog{s}, Dir: b.TempDir(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err := br.Start(); err != nil {
			b.Fatal(err)
		}
		if err := w.Restore(); err != nil {
			b.Fatal(err)
		}
		if got, _ := w.Routing().Route([]byte("t"), []byte("dev7.x.temp"), nil); len(got) != 1 || got[0].Name != "q7" {
			b.Fatalf("route dev7.x.temp = %v", got)
		}
		b.StopTimer()
		br.Stop()
		b.StartTimer()
	}
}

// BenchmarkLiveBind times binds made one at a time on a running wiring
// (Wiring.Bind, each its own snapshot), n of them per op, in the shapes
// whose lists a bind extends: n queues bound to one fanout exchange, n
// queues bound by one key to a direct exchange, and one queue bound by n
// topic patterns.
//
//	go test ./server/wiring -run '^$' -bench LiveBind -benchtime 1x
func BenchmarkLiveBind(b *testing.B) {
	for _, n := range []int{10_000, 100_000} {
		for _, shape := range []string{"fanout", "direct-one-key", "topic-one-queue"} {
			b.Run(fmt.Sprintf("%s/binds=%d", shape, n), func(b *testing.B) {
				for range b.N {
					b.StopTimer()
					w := startWiring(b, nil)
					kind := map[string]uint8{"fanout": KindFanout, "direct-one-key": KindDirect, "topic-one-queue": KindTopic}[shape]
					if err := w.DeclareExchange("x", kind, ExchangeOptions{}, false); err != nil {
						b.Fatal(err)
					}
					queues := n
					if shape == "topic-one-queue" {
						queues = 1
					}
					for i := range queues {
						if _, err := w.DeclareQueue("q"+strconv.Itoa(i), shards.QueueOptions{}, false, nil); err != nil {
							b.Fatal(err)
						}
					}
					b.StartTimer()
					for i := range n {
						q, key := "q"+strconv.Itoa(i), "k"
						if shape == "topic-one-queue" {
							q, key = "q0", "dev"+strconv.Itoa(i)+".*.temp"
						}
						if err := w.Bind("x", q, key); err != nil {
							b.Fatal(err)
						}
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/bind")
			})
		}
	}
}

// BenchmarkLiveUnbind times unbinds made one at a time on a running
// wiring (Wiring.Unbind, each its own snapshot) from lists of n: n queues
// bound to one fanout exchange, n queues bound by one key to a direct
// exchange, and n queues bound by one pattern to a topic exchange (one
// trie node's list). Each op binds the n untimed, then unbinds
// unbindsPerOp of them, spread over the list.
//
//	go test ./server/wiring -run '^$' -bench LiveUnbind -benchtime 1x
func BenchmarkLiveUnbind(b *testing.B) {
	const unbindsPerOp = 1000
	for _, n := range []int{10_000, 100_000} {
		for _, shape := range []string{"fanout", "direct-one-key", "topic-one-pattern"} {
			b.Run(fmt.Sprintf("%s/queues=%d", shape, n), func(b *testing.B) {
				key := map[string]string{"fanout": "", "direct-one-key": "k", "topic-one-pattern": "a.*.c"}[shape]
				for range b.N {
					b.StopTimer()
					w := startWiring(b, nil)
					kind := map[string]uint8{"fanout": KindFanout, "direct-one-key": KindDirect, "topic-one-pattern": KindTopic}[shape]
					if err := w.DeclareExchange("x", kind, ExchangeOptions{}, false); err != nil {
						b.Fatal(err)
					}
					for i := range n {
						q := "q" + strconv.Itoa(i)
						if _, err := w.DeclareQueue(q, shards.QueueOptions{}, false, nil); err != nil {
							b.Fatal(err)
						}
						if err := w.Bind("x", q, key); err != nil {
							b.Fatal(err)
						}
					}
					b.StartTimer()
					for i := range unbindsPerOp {
						if err := w.Unbind("x", "q"+strconv.Itoa(i*(n/unbindsPerOp)), key); err != nil {
							b.Fatal(err)
						}
					}
					b.StopTimer()
					if qs, _ := w.Route([]byte("x"), []byte("a.b.c"), nil); kind != KindDirect && len(qs) != n-unbindsPerOp {
						b.Fatalf("%d queues routed after the unbinds, want %d", len(qs), n-unbindsPerOp)
					}
					b.StartTimer()
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*unbindsPerOp), "ns/unbind")
			})
		}
	}
}

// TestDeadBindingsSwept: a bind no longer drops the bindings of deleted
// exchanges from its queue's list on every call (that cost O(the queue's
// bindings) a bind); sweeps do, once the list has doubled. A queue bound
// again and again to exchanges that are then deleted keeps a bounded
// list, and what it keeps live still routes.
func TestDeadBindingsSwept(t *testing.T) {
	w := startWiring(t, nil)
	if _, err := w.DeclareQueue("q", shards.QueueOptions{}, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := w.DeclareExchange("keep", KindDirect, ExchangeOptions{}, false); err != nil {
		t.Fatal(err)
	}
	const live = 20
	for i := range live {
		if err := w.Bind("keep", "q", fmt.Sprint("k", i)); err != nil {
			t.Fatal(err)
		}
	}
	maxLen := 0
	for i := range 1000 {
		name := fmt.Sprint("gone", i%3)
		if err := w.DeclareExchange(name, KindTopic, ExchangeOptions{}, false); err != nil {
			t.Fatal(err)
		}
		if err := w.Bind(name, "q", fmt.Sprint("a.", i)); err != nil {
			t.Fatal(err)
		}
		if err := w.DeleteExchange(name, false); err != nil {
			t.Fatal(err)
		}
		qb, _ := w.Routing().bindings.Get("q")
		maxLen = max(maxLen, len(qb.list))
	}
	// The list never holds more than twice its length at the last sweep,
	// at most the live bindings and one dead one then.
	if bound := 2 * (live + 1); maxLen > bound {
		t.Fatalf("the queue's binding list reached %d entries with %d live: dead bindings are not swept (bound %d)", maxLen, live, bound)
	}
	r := w.Routing()
	if got := r.liveBindings("q"); len(got) != live {
		t.Fatalf("%d live bindings, want %d", len(got), live)
	}
	for i := range live {
		if qs, _ := r.Route([]byte("keep"), []byte(fmt.Sprint("k", i)), nil); len(qs) != 1 {
			t.Fatalf("key k%d routes to %d queues", i, len(qs))
		}
	}
	if _, err := w.DeleteQueue("q", false, false); err != nil {
		t.Fatal(err)
	}
	if qs, _ := w.Routing().Route([]byte("keep"), []byte("k0"), nil); len(qs) != 0 {
		t.Fatalf("a deleted queue still routed: %d", len(qs))
	}
}

// BenchmarkQueueSetAppend times what a route to a fanout (or one direct
// key, or one trie node) of n queues costs to copy its queues out: as
// one slice (how every list was held before, and small ones still are)
// and as the pmap a list past queueSetSliceMax becomes.
//
//	go test ./server/wiring -run '^$' -bench QueueSetAppend -benchmem
func BenchmarkQueueSetAppend(b *testing.B) {
	for _, n := range []int{2_000, 10_000, 100_000} {
		var all []*shards.Queue
		var set queueSet
		for i := range n {
			q := &shards.Queue{Name: "q" + strconv.Itoa(i)}
			all = append(all, q)
			set = set.with(nil, q)
		}
		if set.big == nil {
			b.Fatalf("%d queues held as a slice", n)
		}
		for _, form := range []struct {
			name string
			set  queueSet
		}{{"slice", queueSet{small: all}}, {"pmap", set}} {
			b.Run(fmt.Sprintf("queues=%d/form=%s", n, form.name), func(b *testing.B) {
				dst := make([]*shards.Queue, 0, n)
				b.ReportAllocs()
				for range b.N {
					dst = form.set.appendTo(dst[:0])
				}
				if len(dst) != n {
					b.Fatalf("%d queues out of %d", len(dst), n)
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/queue")
			})
		}
	}
}
