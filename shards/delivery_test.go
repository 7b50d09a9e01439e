package shards

import (
	"fmt"
	"maps"
	"math/rand"
	"os"
	"reflect"
	"slices"
	"strconv"
	"testing"
)

// deliverySim drives one queue through NextDelivery and Apply alone, as a
// replica or a simulator would: no shard, no sessions, no clock but the
// simulated one. It checks the delivery policy's invariants after every
// step and records a trace of what was delivered to whom.
type deliverySim struct {
	t       *testing.T
	rng     *rand.Rand
	q       *Queue
	fx      *recordFx
	now     int64
	cons    []*Consumer
	granted []uint64                // credit given to each consumer in all
	got     []uint64                // deliveries to each consumer
	lastNew [PriorityMax + 1]uint64 // Seq of the last first-time delivery per level (FIFO check)
	pending []uint64                // Seqs enqueued and not yet durable, oldest first
	trace   []string
	// delays: this schedule publishes delayed messages; deliverAt holds
	// their times by Seq.
	delays    bool
	deliverAt map[uint64]int64
}

func newDeliverySim(t *testing.T, seed int64) *deliverySim {
	rng := rand.New(rand.NewSource(seed))
	opts := QueueOptions{}
	if rng.Intn(2) == 0 {
		opts.MaxDeliveries = uint32(2 + rng.Intn(3))
	}
	if rng.Intn(2) == 0 {
		opts.MaxPriority = uint8(1 + rng.Intn(PriorityMax))
	}
	d := &deliverySim{t: t, rng: rng, q: NewQueue("sim", opts, 0, nil), fx: &recordFx{}, now: 1,
		delays: rng.Intn(2) == 0, deliverAt: map[uint64]int64{}}
	for i := range 1 + rng.Intn(4) {
		c := &Consumer{ID: uint32(i + 1), queue: d.q, unacked: map[uint64]uint64{}}
		d.cons = append(d.cons, c)
		d.q.consumers = append(d.q.consumers, c)
	}
	d.granted = make([]uint64, len(d.cons))
	d.got = make([]uint64, len(d.cons))
	return d
}

func (d *deliverySim) consumerIndex(c *Consumer) int {
	for i, x := range d.cons {
		if x == c {
			return i
		}
	}
	d.t.Fatalf("delivery to a consumer the queue does not have: %v", c)
	return -1
}

// state is what NextDelivery must leave untouched.
func (d *deliverySim) state() string {
	s := fmt.Sprintf("rr=%d ready=%d unacked=%d unsafe=%d safe=%d", d.q.rr, d.q.Ready(), d.q.Unacked(), d.q.unsafe, d.q.safeSeq)
	for _, c := range d.cons {
		s += fmt.Sprintf(" c%d:%d/%d", c.ID, c.credit, c.nextTag)
	}
	return s
}

// dispatch delivers until NextDelivery says there is nothing to do.
func (d *deliverySim) dispatch() {
	for steps := 0; ; steps++ {
		if steps > 1<<16 {
			d.t.Fatal("dispatch does not end")
		}
		before := d.state()
		ev, ok := d.q.NextDelivery(d.now)
		ev2, ok2 := d.q.NextDelivery(d.now)
		if after := d.state(); after != before || ok != ok2 || !reflect.DeepEqual(ev, ev2) {
			d.t.Fatalf("NextDelivery is not pure: %s -> %s, %+v/%v then %+v/%v", before, after, ev, ok, ev2, ok2)
		}
		if !ok {
			d.checkIdle()
			return
		}
		switch ev.Kind {
		case EvPromote:
			if at := d.q.NextDeliverAt(); at == 0 || at > d.now {
				d.t.Fatalf("promote decided at %d, the next delayed message is due at %d", d.now, at)
			}
			d.trace = append(d.trace, "promote")
			if err := d.q.Apply(&ev, d.fx); err != nil {
				d.t.Fatal(err)
			}
		case EvExpire:
			if h := d.q.Head(); h == nil || h.ExpiresAt == 0 || h.ExpiresAt > d.now {
				d.t.Fatalf("expire decided for a head that has not expired: %+v", h)
			}
			d.trace = append(d.trace, "expire")
			if err := d.q.Apply(&ev, d.fx); err != nil {
				d.t.Fatal(err)
			}
		case EvAcquire:
			h := d.q.Head()
			if h == nil || h.Seq != ev.Seq || !d.q.Deliverable(h) {
				d.t.Fatalf("acquire of %d decided, head %+v", ev.Seq, h)
			}
			if h.ExpiresAt != 0 && h.ExpiresAt <= d.now {
				d.t.Fatalf("an expired message is delivered")
			}
			i := d.consumerIndex(ev.Consumer)
			if ev.Consumer.credit == 0 {
				d.t.Fatalf("delivery to consumer %d without credit", ev.Consumer.ID)
			}
			if ev.Tag != ev.Consumer.nextTag+1 {
				d.t.Fatalf("tag %d after %d", ev.Tag, ev.Consumer.nextTag)
			}
			if at := d.deliverAt[h.Seq]; at > d.now {
				d.t.Fatalf("message %d delivered at %d, before its deliver-at time %d", h.Seq, d.now, at)
			}
			d.checkHead(h)
			if lv := h.Level(); h.DeliveryCount == 0 && d.deliverAt[h.Seq] == 0 {
				// A delayed message takes its place by Seq when due, so
				// only the others are checked for publish order.
				if h.Seq <= d.lastNew[lv] {
					d.t.Fatalf("first deliveries at level %d out of order: %d after %d", lv, h.Seq, d.lastNew[lv])
				}
				d.lastNew[lv] = h.Seq
			}
			if err := d.q.Apply(&ev, d.fx); err != nil {
				d.t.Fatal(err)
			}
			ev.Consumer.unacked[ev.Tag] = ev.Seq
			d.got[i]++
			d.trace = append(d.trace, fmt.Sprintf("%d>c%d#%d", ev.Seq, ev.Consumer.ID, ev.Tag))
		default:
			d.t.Fatalf("NextDelivery decided %v", ev.Kind)
		}
	}
}

// checkHead: the head is the lowest Seq of the highest level holding a
// ready message, found by scanning every ready message.
func (d *deliverySim) checkHead(h *Entry) {
	var best *Entry
	consider := func(lv int, e *Entry) {
		if e.Level() != lv {
			d.t.Fatalf("message %d of level %d sits in level %d", e.Seq, e.Level(), lv)
		}
		if best == nil || lv > best.Level() || lv == best.Level() && e.Seq < best.Seq {
			best = e
		}
	}
	for lv := range d.q.levels {
		l := &d.q.levels[lv]
		for i := 0; i < l.ready.len(); i++ {
			consider(lv, l.ready.at(i))
		}
		for _, e := range l.released {
			consider(lv, e)
		}
	}
	if best != h {
		d.t.Fatalf("head %d (level %d), but %d (level %d) should go first", h.Seq, h.Level(), best.Seq, best.Level())
	}
}

// checkIdle: when NextDelivery has nothing to do, no consumer with credit
// is left waiting for a deliverable, unexpired head, and no delayed
// message is due.
func (d *deliverySim) checkIdle() {
	if at := d.q.NextDeliverAt(); at != 0 && at <= d.now {
		d.t.Fatalf("message due at %d still delayed at %d", at, d.now)
	}
	h := d.q.Head()
	if h == nil || !d.q.Deliverable(h) {
		return
	}
	if h.ExpiresAt != 0 && h.ExpiresAt <= d.now {
		d.t.Fatal("an expired head is left")
	}
	for _, c := range d.cons {
		if c.credit > 0 {
			d.t.Fatalf("consumer %d has %d credit and message %d waits", c.ID, c.credit, h.Seq)
		}
	}
}

func (d *deliverySim) settle(kind EventKind) {
	c := d.cons[d.rng.Intn(len(d.cons))]
	if len(c.unacked) == 0 {
		return
	}
	tags := slices.Sorted(maps.Keys(c.unacked)) // map order would make the schedule random
	tag := tags[d.rng.Intn(len(tags))]
	seq := c.unacked[tag]
	delete(c.unacked, tag)
	if err := d.q.Apply(&Event{Kind: kind, Seq: seq}, d.fx); err != nil {
		d.t.Fatalf("settle %v of %d: %v", kind, seq, err)
	}
}

func (d *deliverySim) step() {
	switch r := d.rng.Intn(100); {
	case r < 35: // publish, maybe with a TTL, a priority or a delay, maybe not yet durable
		ev := Event{Kind: EvEnqueue, Body: body("m"), Priority: uint8(d.rng.Intn(PriorityMax + 2))}
		from := d.now
		if d.delays && d.rng.Intn(3) == 0 {
			ev.DeliverAt = d.now + int64(1+d.rng.Intn(30))
			from = ev.DeliverAt // a TTL runs from the deliver-at time, as the shard sets it
		}
		if d.rng.Intn(4) == 0 {
			ev.ExpiresAt = from + int64(1+d.rng.Intn(20))
		}
		seq := d.q.NextSeq()
		if ev.DeliverAt != 0 {
			d.deliverAt[seq] = ev.DeliverAt
		}
		if err := d.q.Apply(&ev, d.fx); err != nil {
			d.t.Fatal(err)
		}
		if d.rng.Intn(3) == 0 {
			d.q.enqueueUnsafe(seq)
			d.pending = append(d.pending, seq)
		}
	case r < 45: // the oldest pending enqueue becomes durable
		if len(d.pending) > 0 {
			d.q.enqueueSafe(d.pending[0])
			d.pending = d.pending[1:]
		}
	case r < 60:
		i := d.rng.Intn(len(d.cons))
		n := uint32(1 + d.rng.Intn(4))
		d.cons[i].credit += n
		d.granted[i] += uint64(n)
	case r < 75:
		d.settle(EvDequeue)
	case r < 85:
		d.settle(EvRelease)
	case r < 90:
		d.settle(EvReject)
	default:
		d.now += int64(1 + d.rng.Intn(10))
	}
	d.dispatch()
	for i, c := range d.cons {
		if d.got[i]+uint64(c.credit) != d.granted[i] {
			d.t.Fatalf("consumer %d: %d deliveries + %d credit left != %d granted", c.ID, d.got[i], c.credit, d.granted[i])
		}
	}
}

func runDeliverySim(t *testing.T, seed int64, steps int) []string {
	d := newDeliverySim(t, seed)
	for range steps {
		d.step()
	}
	return d.trace
}

// TestDeliverySimulation runs the delivery policy over seeded random
// schedules of publishes (some with TTLs, priorities or deliver-at times,
// some not yet durable; half the queues have a max priority), credit,
// settles and time, checking its invariants at every step: NextDelivery
// changes nothing; no delivery without credit, of an expired message, of
// one not yet durable or of one before its time; the head is the oldest
// of the highest priority; first deliveries in publish order within a
// priority; tags in sequence; credit accounted exactly; and when nothing
// is decided, no consumer with credit is left waiting and no delayed
// message is due. Each schedule replays to the same
// trace. BERTH_DELIVERY_SEED=N replays one seed.
func TestDeliverySimulation(t *testing.T) {
	seeds, steps := 3000, 300
	if testing.Short() {
		seeds = 300
	}
	first := int64(1)
	if s := os.Getenv("BERTH_DELIVERY_SEED"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("BERTH_DELIVERY_SEED=%q: %v", s, err)
		}
		first, seeds = n, 1
	}
	delivered := 0
	for seed := first; seed < first+int64(seeds); seed++ {
		t.Run("", func(t *testing.T) {
			a := runDeliverySim(t, seed, steps)
			if t.Failed() {
				t.Fatalf("seed %d (replay with BERTH_DELIVERY_SEED=%d)", seed, seed)
			}
			if seed%50 == 0 {
				if b := runDeliverySim(t, seed, steps); !reflect.DeepEqual(a, b) {
					t.Fatalf("seed %d: two runs gave different traces", seed)
				}
			}
			delivered += len(a)
		})
		if t.Failed() {
			return
		}
	}
	if delivered == 0 {
		t.Fatal("the schedules delivered nothing")
	}
}

// TestDeliveryRoundRobin: consumers that all have credit get messages in
// turn, starting after the last one served.
func TestDeliveryRoundRobin(t *testing.T) {
	q := NewQueue("rr", QueueOptions{}, 0, nil)
	fx := &recordFx{}
	var cons []*Consumer
	for i := range 3 {
		c := &Consumer{ID: uint32(i + 1), queue: q, credit: 100, unacked: map[uint64]uint64{}}
		cons = append(cons, c)
		q.consumers = append(q.consumers, c)
	}
	for range 10 {
		enqueue(t, q, fx, "m", 0)
	}
	var order []uint32
	for {
		ev, ok := q.NextDelivery(0)
		if !ok {
			break
		}
		order = append(order, ev.Consumer.ID)
		if err := q.Apply(&ev, fx); err != nil {
			t.Fatal(err)
		}
	}
	want := []uint32{1, 2, 3, 1, 2, 3, 1, 2, 3, 1}
	if !reflect.DeepEqual(order, want) {
		t.Fatalf("order %v, want %v", order, want)
	}
	// A consumer without credit is skipped, and the turn passes on.
	cons[1].credit = 0
	for range 4 {
		enqueue(t, q, fx, "m", 0)
	}
	order = order[:0]
	for {
		ev, ok := q.NextDelivery(0)
		if !ok {
			break
		}
		order = append(order, ev.Consumer.ID)
		_ = q.Apply(&ev, fx)
	}
	if want := []uint32{3, 1, 3, 1}; !reflect.DeepEqual(order, want) {
		t.Fatalf("order %v with consumer 2 out of credit, want %v", order, want)
	}
}
