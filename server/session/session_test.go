package session

import (
	"io"
	"log/slog"
	"testing"

	"github.com/berthmq/berth/server/wiring"
	"github.com/berthmq/berth/shards"
	"github.com/berthmq/berth/wire"
)

// toy is a second codec's side of a session: it records what the
// session answers, what it pushes (refusing the pushes numbered in
// refuse, as a full ring does) and what it hands the Remote.
type toy struct {
	b        *shards.Broker
	replies  []string
	pushed   []shards.Command
	pushedTo []int
	n        int
	refuse   map[int]bool
	remote   []string
	remoteQ  string // the queue another broker serves
}

func (t *toy) Complete(id uint64) { t.replies = append(t.replies, "complete") }
func (t *toy) Fail(id uint64, code wire.ErrorCode, text string) {
	t.replies = append(t.replies, code.String())
}

func (t *toy) Push(shard int, cmd shards.Command) bool {
	t.n++
	if t.refuse[t.n] {
		return false
	}
	if !t.b.Shards()[shard].TryPush(cmd) {
		panic("a real ring was full in a test of a few commands")
	}
	t.pushed, t.pushedTo = append(t.pushed, cmd), append(t.pushedTo, shard)
	return true
}

func (t *toy) Subscribe(m *Subscribe, raw []byte) { t.remote = append(t.remote, "subscribe") }
func (t *toy) Credit(consumer, credit uint32, raw []byte) {
	t.remote = append(t.remote, "credit")
}
func (t *toy) Cancel(cmdID uint64, consumer uint32, raw []byte) {
	t.remote = append(t.remote, "cancel")
}
func (t *toy) Settle(cmdID uint64, consumer uint32, op Op, tags Tags, raw []byte) {
	t.remote = append(t.remote, "settle")
}

type ranges []wire.Range

func (r ranges) Len() int            { return len(r) }
func (r ranges) At(i int) wire.Range { return r[i] }

// start runs a broker of two shards with queues a and b, on different
// shards, and a fanout exchange "fan" bound to both; the toy codec
// serves a session on it, with queue "far" served by another broker.
func start(t *testing.T) (*toy, *Session, *wiring.Wiring) {
	t.Helper()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	b := shards.New(shards.Config{Shards: 2, Logger: logger})
	w := wiring.New(wiring.Config{Broker: b, Logger: logger})
	if err := b.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Stop)
	if err := w.Restore(); err != nil {
		t.Fatal(err)
	}
	names := []string{}
	for i := 0; len(names) < 2; i++ {
		name := string(rune('a' + i))
		q, err := w.DeclareQueue(name, shards.QueueOptions{}, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(names) == 1 && q.Shard() == w.Routing().Queue([]byte(names[0])).Shard() {
			continue // on the first one's shard: take another
		}
		names = append(names, name)
	}
	for _, n := range []string{"far"} {
		if _, err := w.DeclareQueue(n, shards.QueueOptions{}, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.DeclareExchange("fan", wiring.KindFanout, wiring.ExchangeOptions{}, false); err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if err := w.Bind("fan", n, ""); err != nil {
			t.Fatal(err)
		}
	}
	tc := &toy{b: b, refuse: map[int]bool{}, remoteQ: "far"}
	sess := &shards.Session{ID: 1, Version: wire.Current, FrameMax: wire.FrameSizeMax, Out: discard{}}
	ss := New(sess, Config{Broker: b, Routing: w.Routing, Push: tc, Replies: tc, Resolve: resolver{tc, w}, Remote: tc, WindowMax: 100})
	return tc, ss, w
}

type discard struct{}

func (discard) WriteAsync(bufs [][]byte, done func()) error { done(); return nil }

type resolver struct {
	t *toy
	w *wiring.Wiring
}

func (r resolver) SubscribeQueue(name []byte, cmdID uint64) (*shards.Queue, bool) {
	if string(name) == r.t.remoteQ {
		return nil, true
	}
	q := r.w.Routing().Queue(name)
	if q == nil {
		r.t.Fail(cmdID, wire.CodeNotFound, "no queue")
	}
	return q, false
}

// TestSettleResumesAtItsPart: a settle of more ranges than one command
// carries goes in parts; a full ring at the second part stops it there
// (Resume 1), and the call again pushes the second and third parts only,
// to the consumer's shard.
func TestSettleResumesAtItsPart(t *testing.T) {
	tc, ss, _ := start(t)
	if !ss.Subscribe(&Subscribe{CommandID: 1, ConsumerID: 7, Queue: []byte("a"), Credit: 10}, nil) {
		t.Fatal("subscribe stopped")
	}
	var tags ranges
	for i := range 2*shards.RangesInline + 1 {
		tags = append(tags, wire.Range{First: uint64(10 * i), Last: uint64(10*i + 1)})
	}
	tc.pushed = nil
	tc.refuse[tc.n+2] = true
	if ss.Settle(2, 7, OpAccept, tags, nil) {
		t.Fatal("settle went through a full ring")
	}
	if ss.Resume != 1 || len(tc.pushed) != 1 {
		t.Fatalf("after the full ring: resume %d, parts pushed %d; want 1, 1", ss.Resume, len(tc.pushed))
	}
	if !ss.Settle(2, 7, OpAccept, tags, nil) {
		t.Fatal("settle stopped again")
	}
	if len(tc.pushed) != 3 {
		t.Fatalf("parts pushed %d, want 3", len(tc.pushed))
	}
	for i, sh := range tc.pushedTo {
		if sh != tc.pushedTo[0] {
			t.Fatalf("part %d went to shard %d, part 0 to %d", i, sh, tc.pushedTo[0])
		}
	}
}

// TestRemoteConsumerCommandsGoToRemote: a consumer of a queue another
// broker serves is the Remote's: its credit, settles and cancel reach it
// and no shard; ids stay used; an unknown consumer's cancel is
// not-found, and a used id's SUBSCRIBE invalid.
func TestRemoteConsumerCommandsGoToRemote(t *testing.T) {
	tc, ss, _ := start(t)
	ss.Subscribe(&Subscribe{CommandID: 1, ConsumerID: 3, Queue: []byte("far"), Credit: 10}, nil)
	ss.Credit(3, 5, nil)
	ss.Settle(2, 3, OpReject, ranges{{First: 1, Last: 1}}, nil)
	ss.Cancel(3, 3, nil)
	if got := len(tc.pushed); got != 0 {
		t.Fatalf("%d commands of a remote consumer went to shards", got)
	}
	if want := []string{"subscribe", "credit", "settle", "cancel"}; len(tc.remote) != 4 || tc.remote[0] != want[0] || tc.remote[3] != want[3] {
		t.Fatalf("remote got %v, want %v", tc.remote, want)
	}
	if ok, remote := ss.Has(3); !ok || !remote {
		t.Fatalf("consumer 3: has %v remote %v", ok, remote)
	}
	ss.Cancel(4, 99, nil)
	ss.Subscribe(&Subscribe{CommandID: 5, ConsumerID: 3, Queue: []byte("a")}, nil)
	if len(tc.replies) != 2 || tc.replies[0] != wire.CodeNotFound.String() || tc.replies[1] != wire.CodeInvalid.String() {
		t.Fatalf("replies %v", tc.replies)
	}
}

// TestFanoutResumesWithItsRest: a fan-out publish whose second target's
// ring is full goes to the first one only, reports Full, and the call
// again with the same message pushes the rest only: each queue gets the
// message once, and the window counts it once.
func TestFanoutResumesWithItsRest(t *testing.T) {
	tc, ss, _ := start(t)
	tc.refuse[tc.n+2] = true
	m := &Message{ID: 1, Exchange: []byte("fan"), Payload: []byte("x")}
	if ss.Publish(m) != Full {
		t.Fatal("the fan-out went through a full ring")
	}
	if ss.Publish(m) != Done {
		t.Fatal("the rest of the fan-out stopped")
	}
	ss.Flush()
	if len(tc.pushed) != 2 || tc.pushedTo[0] == tc.pushedTo[1] {
		t.Fatalf("pushed to shards %v, want one of each", tc.pushedTo)
	}
	if got := ss.Sess.Inflight.Load(); got != 1 {
		t.Fatalf("inflight %d, want 1", got)
	}
	if ss.Publish(&Message{ID: 2, Exchange: []byte("nope")}) != Done || len(tc.replies) != 1 || tc.replies[0] != wire.CodeNotFound.String() {
		t.Fatalf("publish to no exchange: replies %v", tc.replies)
	}
}
