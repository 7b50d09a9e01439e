package shards

import (
	"fmt"
	"math/rand"
	"reflect"
	"testing"
)

// recordFx records what applying events did.
type recordFx struct{ dead, removed []string }

func (r *recordFx) DeadLetter(q *Queue, e *Entry, reason DeadLetterReason) {
	r.dead = append(r.dead, fmt.Sprintf("%s:%d", e.Body.Payload, reason))
}
func (r *recordFx) Removed(q *Queue, e *Entry) {
	r.removed = append(r.removed, string(e.Body.Payload))
	e.Body.Unref()
}

func body(s string) *Body { return NewBody(nil, nil, nil, []byte(s), false) }

func enqueue(t *testing.T, q *Queue, fx Effects, payload string, expires int64) {
	t.Helper()
	if err := q.Apply(&Event{Kind: EvEnqueue, Body: body(payload), ExpiresAt: expires}, fx); err != nil {
		t.Fatal(err)
	}
}

func heads(q *Queue) []string {
	var out []string
	for e := q.peek(); e != nil; e = q.peek() {
		out = append(out, string(e.Body.Payload))
		_ = q.Apply(&Event{Kind: EvAcquire, Seq: e.Seq}, &recordFx{})
	}
	return out
}

func TestQueueEvents(t *testing.T) {
	fx := &recordFx{}
	q := NewQueue("q", QueueOptions{MaxDeliveries: 2}, 0, nil)
	for _, p := range []string{"a", "b", "c", "d"} {
		enqueue(t, q, fx, p, 0)
	}
	// Acquire a, b, c.
	for i := 0; i < 3; i++ {
		if err := q.Apply(&Event{Kind: EvAcquire, Seq: q.Head().Seq, Tag: uint64(i + 1)}, fx); err != nil {
			t.Fatal(err)
		}
	}
	if err := q.Apply(&Event{Kind: EvAcquire, Seq: 99}, fx); err != ErrNoSuchMessage {
		t.Fatalf("acquire of a non-head: %v", err)
	}
	_ = q.Apply(&Event{Kind: EvRelease, Seq: 2}, fx) // b back at its position
	_ = q.Apply(&Event{Kind: EvDequeue, Seq: 1}, fx) // a accepted
	_ = q.Apply(&Event{Kind: EvReject, Seq: 3}, fx)  // c rejected
	if q.Ready() != 2 || q.Unacked() != 0 {
		t.Fatalf("ready %d unacked %d", q.Ready(), q.Unacked())
	}
	if got := q.Head(); string(got.Body.Payload) != "b" || got.DeliveryCount != 1 {
		t.Fatalf("head after release: %s count %d", got.Body.Payload, got.DeliveryCount)
	}
	// b is delivered again and released: max-deliveries dead-letters it.
	_ = q.Apply(&Event{Kind: EvAcquire, Seq: 2}, fx)
	_ = q.Apply(&Event{Kind: EvRelease, Seq: 2}, fx)
	want := []string{"c:1", "b:4"}
	if !reflect.DeepEqual(fx.dead, want) {
		t.Fatalf("dead letters %v, want %v", fx.dead, want)
	}
	if !reflect.DeepEqual(fx.removed, []string{"a", "c", "b"}) {
		t.Fatalf("removed %v", fx.removed)
	}
	if h := heads(q); !reflect.DeepEqual(h, []string{"d"}) {
		t.Fatalf("left %v", h)
	}
}

func TestQueueExpireAndOverflow(t *testing.T) {
	fx := &recordFx{}
	q := NewQueue("q", QueueOptions{MaxLength: 2, Overflow: 1}, 0, nil)
	enqueue(t, q, fx, "old", 100)
	enqueue(t, q, fx, "mid", 0)
	enqueue(t, q, fx, "new", 0) // drops "old" from the head
	if !reflect.DeepEqual(fx.dead, []string{"old:3"}) {
		t.Fatalf("drop-head: %v", fx.dead)
	}
	q2 := NewQueue("q2", QueueOptions{MaxLength: 1}, 0, nil)
	enqueue(t, q2, fx, "x", 50)
	if err := q2.Apply(&Event{Kind: EvEnqueue, Body: body("y")}, fx); err != ErrQueueFull {
		t.Fatalf("reject-publish: %v", err)
	}
	_ = q2.Apply(&Event{Kind: EvExpire, Now: 49}, fx)
	if q2.Depth() != 1 {
		t.Fatal("expired early")
	}
	_ = q2.Apply(&Event{Kind: EvExpire, Now: 50}, fx)
	if q2.Depth() != 0 || q2.Counters().Expired != 1 {
		t.Fatalf("not expired: depth %d", q2.Depth())
	}
}

// TestQueueApplyIsDeterministic applies one random event log to two
// queues and requires identical results: the property replication and
// journal replay rely on.
func TestQueueApplyIsDeterministic(t *testing.T) {
	seed := int64(42)
	rng := rand.New(rand.NewSource(seed))
	var log []Event
	sim := NewQueue("sim", QueueOptions{MaxDeliveries: 3, MaxLength: 50, Overflow: 1}, 0, nil)
	simFx := &recordFx{}
	var acquired []uint64
	for i := 0; i < 5000; i++ {
		var ev Event
		switch r := rng.Intn(10); {
		case r < 4:
			ev = Event{Kind: EvEnqueue, Body: body(fmt.Sprint(i)), ExpiresAt: int64(rng.Intn(3) * i)}
		case r < 6 && sim.Head() != nil:
			ev = Event{Kind: EvAcquire, Seq: sim.Head().Seq}
			acquired = append(acquired, ev.Seq)
		case r < 9 && len(acquired) > 0:
			k := rng.Intn(len(acquired))
			seq := acquired[k]
			acquired = append(acquired[:k], acquired[k+1:]...)
			ev = Event{Kind: []EventKind{EvRelease, EvDequeue, EvReject}[rng.Intn(3)], Seq: seq}
		default:
			ev = Event{Kind: EvExpire, Now: int64(i)}
		}
		if ev.Kind == 0 {
			continue
		}
		log = append(log, ev)
		cp := ev
		if cp.Body != nil {
			cp.Body = body(string(ev.Body.Payload))
		}
		_ = sim.Apply(&cp, simFx)
	}
	run := func() (*recordFx, []string) {
		q := NewQueue("q", QueueOptions{MaxDeliveries: 3, MaxLength: 50, Overflow: 1}, 0, nil)
		fx := &recordFx{}
		for _, ev := range log {
			cp := ev
			if cp.Body != nil {
				cp.Body = body(string(ev.Body.Payload))
			}
			_ = q.Apply(&cp, fx)
		}
		return fx, heads(q)
	}
	fx1, h1 := run()
	fx2, h2 := run()
	if !reflect.DeepEqual(fx1, fx2) || !reflect.DeepEqual(h1, h2) {
		t.Fatal("the same events gave different states")
	}
	if !reflect.DeepEqual(fx1.dead, simFx.dead) {
		t.Fatal("replay differs from the live run")
	}
	if len(fx1.dead) == 0 || len(fx1.removed) == 0 {
		t.Fatal("the log exercised nothing")
	}
}

// TestQueueRemove: EvRemove takes a message out wherever it is (ready,
// released, acquired), keeps the others in order, does not dead-letter,
// and ignores a message already gone.
func TestQueueRemove(t *testing.T) {
	fx := &recordFx{}
	q := NewQueue("q", QueueOptions{}, 0, nil)
	for i := range 40 { // more than the ring's first size, so it wraps
		enqueue(t, q, fx, fmt.Sprint("m", i), 0)
	}
	seqOf := map[string]uint64{}
	for i := uint64(0); i < 40; i++ {
		e := q.levels[0].ready.at(int(i))
		seqOf[string(e.Body.Payload)] = e.Seq
	}
	// Acquire m0 and m1, release m1 (it goes to the released heap).
	for range 2 {
		if err := q.Apply(&Event{Kind: EvAcquire, Seq: q.Head().Seq}, fx); err != nil {
			t.Fatal(err)
		}
	}
	_ = q.Apply(&Event{Kind: EvRelease, Seq: seqOf["m1"]}, fx)
	for _, name := range []string{"m0", "m1", "m2", "m17", "m39", "m17"} {
		if err := q.Apply(&Event{Kind: EvRemove, Seq: seqOf[name]}, fx); err != nil {
			t.Fatalf("remove %s: %v", name, err)
		}
	}
	if len(fx.dead) != 0 {
		t.Fatalf("removes dead-lettered %v", fx.dead)
	}
	var want []string
	for i := 3; i < 39; i++ {
		if i != 17 {
			want = append(want, fmt.Sprint("m", i))
		}
	}
	if q.Unacked() != 0 || q.Ready() != len(want) {
		t.Fatalf("ready %d unacked %d, want %d and 0", q.Ready(), q.Unacked(), len(want))
	}
	if got := heads(q); !reflect.DeepEqual(got, want) {
		t.Fatalf("left %v\nwant %v", got, want)
	}
}
