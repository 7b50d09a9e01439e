package shards

import (
	"fmt"
	"io"
	"log/slog"
	"math/rand"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/berthmq/berth/replication/event"
	"github.com/berthmq/berth/wire"
)

// ownSim drives one replicated queue on three brokers' shards, as the
// group log joins them (own.go): broker 1 is the group's master, and
// every broker has consumers. The master's proposals enter the log at
// once; another broker's wait in its forwarding FIFO, from which they
// enter the log, fail to (not taken), or enter it with their outcome
// told as lost. Committed events apply on every broker that is not
// frozen; a frozen one (silent: it does not own, and the master finds it
// silent) applies them when it thaws. The sim checks at every step: no
// message held by the consumers of two brokers at once, no message
// delivered after its removal committed, ownership agreed by every
// member that applied the same events, and, at each own event that takes
// a lost broker's messages back, every message it held acquired ready
// again with its count raised once; at quiet points, that all copies
// agree message for message; at the end, with every broker thawed and
// consuming, that every message is consumed (none lost).
type ownSim struct {
	t     *testing.T
	rng   *rand.Rand
	bs    []*ownBroker
	log   []ownEvent
	index uint64
	next  int
	now   int64
	// bodies maps a Seq to its message; removed marks messages no
	// member holds any more; seen counts deliveries; revoked is set once
	// an own event took a lost broker's queue (flags may then over-count).
	bodies    map[uint64]string
	removed   map[string]bool
	seen      map[string]int
	revoked   bool
	trace     []string
	sessID    uint64
	refreshes int
	// committed holds every committed event by index, for a resync.
	committed map[uint64]ownEvent
	// master is the group's master (changeMaster moves it);
	// masterChanges counts the moves.
	master        uint32
	masterChanges int
	// masters: the schedule changes masters (BERTH_OWN_SIM_MASTERS=1).
	masters bool
}

type ownBroker struct {
	id      uint32
	s       *Shard
	q       *Queue
	transit []ownEvent // proposals on their way to the master
	frozen  bool
	thawing bool       // applying its backlog: it owns nothing (groups.Node.Owning after a gap)
	backlog []ownEvent // committed while frozen
	resync  bool
	// resynced is the last index a resync was asked for at.
	resynced uint64
	// deposed: it was the master and another broker is now; it steps
	// down (applies the log again) at its next stepDown, or when it
	// thaws. Until then it runs on as a member that is not the master.
	deposed bool
	// later holds outcomes told while it was frozen, for its thaw.
	later []func()
	cons  []*simConsumer
}

type ownEvent struct {
	from   uint32
	index  uint64
	kind   event.Kind
	data   []byte // an encoded event (not for enqueues, barriers, master removes)
	body   string
	seqs   []uint64
	unseen bool
	window uint32
	st     event.Stamp
	tag    uint64
	done   func(error)
}

// ownRepl is one broker's Replicator in the sim.
type ownRepl struct {
	journalReplicator
	d *ownSim
	b *ownBroker
}

func (r *ownRepl) IsMaster(uint32) bool   { return r.b.id == r.d.master }
func (r *ownRepl) Delivering(uint32) bool { return r.b.id == r.d.master }
func (r *ownRepl) Self() uint32           { return r.b.id }
func (r *ownRepl) Owning(uint32) bool {
	return r.b.id != r.d.master && !r.b.frozen && !r.b.thawing
}
func (r *ownRepl) Live(_, b uint32) bool { return !r.d.bs[b-1].frozen }
func (r *ownRepl) Resync(_ uint32, index uint64) {
	// As the node: once for an index (groups.Node.Resync).
	if index > r.b.resynced {
		r.b.resynced, r.b.resync = index, true
	}
}
func (r *ownRepl) Applied(uint32) uint64 { return r.d.index - uint64(len(r.b.backlog)) }
func (r *ownRepl) propose(ev ownEvent) error {
	ev.from = r.b.id
	if r.b.id == r.d.master {
		r.d.log = append(r.d.log, ev)
	} else {
		r.b.transit = append(r.b.transit, ev)
	}
	return nil
}
func (r *ownRepl) ProposeRemoves(_ *Queue, seqs []uint64, done func(error)) error {
	return r.propose(ownEvent{kind: event.KindRemoves, seqs: slices.Clone(seqs), done: done})
}
func (r *ownRepl) Barrier(_ *Queue, done func(error)) error {
	return r.propose(ownEvent{kind: event.KindBarrier, done: done})
}
func (r *ownRepl) ProposeReleases(_ *Queue, seqs []uint64, unseen bool, st event.Stamp, tag uint64) error {
	return r.propose(ownEvent{kind: event.KindReleases, seqs: slices.Clone(seqs), unseen: unseen, st: st, tag: tag})
}
func (r *ownRepl) ProposeAcquires(_ *Queue, seqs []uint64, window uint32, st event.Stamp, tag uint64) error {
	return r.propose(ownEvent{kind: event.KindAcquires, seqs: slices.Clone(seqs), window: window, st: st, tag: tag})
}
func (r *ownRepl) ProposeEvent(_ *Queue, data []byte, tag uint64) error {
	k, err := event.KindOf(data)
	if err != nil {
		r.d.fatalf("broker %d proposed a bad event: %v", r.b.id, err)
	}
	return r.propose(ownEvent{kind: k, data: slices.Clone(data), tag: tag})
}

func newOwnSim(t *testing.T, seed int64) *ownSim {
	d := &ownSim{t: t, rng: rand.New(rand.NewSource(seed)), bodies: map[uint64]string{}, removed: map[string]bool{}, seen: map[string]int{},
		committed: map[uint64]ownEvent{}}
	maxDeliveries := uint32(0)
	if d.rng.Intn(2) == 0 {
		maxDeliveries = uint32(3 + d.rng.Intn(3))
	}
	for i := range 3 {
		br := New(Config{Shards: 1, RingSize: 1024, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
			OwnSlice: time.Duration(1+d.rng.Intn(5)) * time.Millisecond, OwnRefresh: uint64(20 + d.rng.Intn(40)), ConsumeAtReplicas: true})
		s := br.shards[0]
		q := NewQueue("rq", QueueOptions{Durable: true, MaxDeliveries: maxDeliveries}, 0, &s.pool)
		q.replicated, q.group = true, 1
		s.queues.add(q)
		b := &ownBroker{id: uint32(i + 1), s: s, q: q}
		br.SetReplicator(&ownRepl{journalReplicator: journalReplicator{sh: s}, d: d, b: b})
		d.bs = append(d.bs, b)
	}
	d.master = 1
	d.masters = os.Getenv("BERTH_OWN_SIM_MASTERS") == "1"
	groupMastered(1)(d.bs[0].s)
	return d
}

func (d *ownSim) masterBroker() *ownBroker { return d.bs[d.master-1] }

// changeMaster elects another broker master of the group, as the
// controller does after the master's death, freeze or a rebalance. The
// new one is a broker that runs and applied every committed event. Of
// the events proposed and not committed yet a random prefix survives
// (the new master's log holds it) and commits before the new master
// takes over (the node pushes GroupMastered behind what it inherited);
// the rest are lost. Every proposer of an uncommitted event is told its
// outcome is unknown (the old master gives up its waiters; a forward in
// flight to it drops). The old master steps down later (stepDown), or
// when it thaws if frozen.
func (d *ownSim) changeMaster() bool {
	old := d.masterBroker()
	var cands []*ownBroker
	for _, b := range d.bs {
		if b != old && !b.frozen && !b.deposed && !b.resync && len(b.backlog) == 0 {
			cands = append(cands, b)
		}
	}
	if len(cands) == 0 {
		return false
	}
	n := cands[d.rng.Intn(len(cands))]
	keep := d.rng.Intn(len(d.log) + 1)
	d.logf("master b%d -> b%d (%d of %d uncommitted events survive)", old.id, n.id, keep, len(d.log))
	for i := range d.log {
		ev := &d.log[i]
		from := d.bs[ev.from-1]
		err := Errorf(wire.CodeOutcomeUnknown, "the master changed (sim)")
		tell := func() {}
		if tag := ev.tag; tag != 0 {
			tell = func() { from.s.acquired(tag, err) }
		} else if done := ev.done; done != nil {
			tell = func() { done(err) }
		}
		if from.frozen {
			from.later = append(from.later, tell)
		} else {
			tell()
		}
		ev.tag, ev.done = 0, nil
	}
	d.log = d.log[:keep]
	d.master = n.id
	old.deposed = true
	d.masterChanges++
	d.revoked = true // a new master counts the old one's window as delivered: counts may run ahead
	for range keep {
		d.commit()
	}
	groupMastered(1)(n.s)
	d.loop(n)
	d.checkOwnership()
	return true
}

// stepDown is what a deposed master that runs does when it learns of
// the new one (groups' OnStepDown): it drops the group's state and
// applies the log again (ResetGroup), and its consumers of the group's
// queues are ended (the server's groupSteppedDown).
func (d *ownSim) stepDown(b *ownBroker) {
	d.logf("b%d steps down", b.id)
	b.deposed = false
	d.resync(b)
	d.checkOwnership()
}

func (d *ownSim) logf(format string, args ...any) {
	d.trace = append(d.trace, fmt.Sprintf(format, args...))
}

func (d *ownSim) fatalf(format string, args ...any) {
	d.t.Helper()
	tail := d.trace
	if len(tail) > 80 && os.Getenv("BERTH_OWN_SIM_TRACE") == "" {
		tail = tail[len(tail)-80:]
	}
	for _, l := range tail {
		d.t.Log(l)
	}
	d.t.Fatalf(format, args...)
}

// loop runs a pass of b's shard loop and checks what its consumers got.
func (d *ownSim) loop(b *ownBroker) {
	if b.frozen {
		return
	}
	s := b.s
	s.now = d.now
	runPass(s)
	for _, c := range b.cons {
		for _, m := range c.w.take(d.t) {
			p := string(m.Payload)
			if c.gone {
				d.fatalf("broker %d delivered %s to consumer %d after it went", b.id, p, c.id)
			}
			if d.removed[p] {
				d.fatalf("broker %d delivered %s after its removal committed", b.id, p)
			}
			for _, o := range d.bs {
				for _, oc := range o.cons {
					if oc.gone || o.frozen || o.deposed || oc == c { // (a deposed master's holdings are void: it steps down)
						continue
					}
					for _, held := range oc.tags {
						if held == p && o != b {
							d.fatalf("broker %d delivered %s, which broker %d's consumer %d holds", b.id, p, o.id, oc.id)
						}
					}
				}
			}
			if !d.revoked && int(m.DeliveryCount) != d.seen[p] {
				d.fatalf("broker %d delivered %s with count %d; it was delivered %d times before", b.id, p, m.DeliveryCount, d.seen[p])
			}
			if red := m.Flags&wire.MsgRedelivered != 0; red != (m.DeliveryCount > 0) {
				d.fatalf("broker %d delivered %s with the redelivered flag %v and count %d", b.id, p, red, m.DeliveryCount)
			}
			d.seen[p]++
			d.logf("b%d deliver %s to %d tag %d count %d", b.id, p, c.id, m.Tag, m.DeliveryCount)
			if !c.ackNone {
				c.tags[m.Tag] = p
			}
		}
	}
}

func (d *ownSim) loopAll() {
	for _, b := range d.bs {
		d.loop(b)
	}
}

// commit applies the log's oldest event on every broker.
func (d *ownSim) commit() {
	ev := d.log[0]
	d.log = d.log[1:]
	d.index++
	ev.index = d.index
	seqs, st := ev.seqs, ev.st
	if ev.kind == event.KindRemoves && ev.data != nil {
		var rm event.Removes
		if rm.Decode(ev.data) == nil {
			seqs, st = rm.Seqs, rm.Stamp
		}
	}
	d.logf("commit %d from b%d %v seqs=%v st=%d/%d %s", ev.index, ev.from, ev.kind, seqs, st.Broker, st.Gen, ev.body)
	var lost uint32
	var before map[uint64]uint32
	if ev.kind == event.KindOwn {
		var o event.Own
		if err := o.Decode(ev.data); err != nil {
			d.fatalf("own: %v", err)
		}
		m := d.masterBroker()
		if o.Requeue == 0 && o.Gen > m.q.rareState().ownGen && o.Owner == m.q.rareState().ownedBy {
			d.refreshes++ // an own event stated again (refreshOwnership)
		}
		if o.Requeue != 0 && o.Gen > m.q.rareState().ownGen {
			lost = o.Requeue
			before = map[uint64]uint32{}
			for seq, by := range m.q.rareState().acqBy {
				if by == lost {
					before[seq] = m.q.Acquired(seq).DeliveryCount
				}
			}
		}
	}
	if ev.kind == event.KindEnqueue {
		d.bodies[ev.index] = ev.body
	}
	d.committed[ev.index] = ev
	for _, b := range d.bs {
		if b.frozen {
			b.backlog = append(b.backlog, ev)
			continue
		}
		d.apply(b, ev)
	}
	if ev.done != nil {
		ev.done(nil)
	}
	if lost != 0 {
		d.revoked = true
		for seq, count := range before {
			for _, b := range d.bs {
				if b.frozen || b.id == lost {
					continue // (the lost broker applies its log again: resync)
				}
				st := queueStates(b.q)[seq]
				// (Ready, or handed out again at once by the new owner.)
				if st != "" && st != fmt.Sprintf("ready/%d", count+1) && st != fmt.Sprintf("acquired/%d", count+1) {
					d.fatalf("after broker %d was taken back, message %d is %q on broker %d; it was acquired with count %d", lost, seq, st, b.id, count)
				}
			}
		}
	}
	// Messages no member holds any more are removed for good.
	if ev.kind == event.KindRemoves || ev.kind == event.KindReleases || ev.kind == event.KindOwn {
		var states []map[uint64]string
		for _, b := range d.bs {
			if !b.frozen {
				states = append(states, queueStates(b.q))
			}
		}
		for seq, p := range d.bodies {
			if d.removed[p] {
				continue
			}
			held := len(states) < len(d.bs)
			for _, st := range states {
				if _, ok := st[seq]; ok {
					held = true
				}
			}
			if !held {
				d.removed[p] = true
			}
		}
	}
	for _, b := range d.bs {
		if b.resync && !b.frozen {
			d.resync(b)
		}
	}
	d.checkOwnership()
}

// apply applies ev on b, as the replicator does.
func (d *ownSim) apply(b *ownBroker, ev ownEvent) {
	s, q := b.s, b.q
	s.now = d.now
	switch ev.kind {
	case event.KindEnqueue:
		s.ApplyEnqueue(q, ev.index, NewBody(nil, []byte("rq"), nil, []byte(ev.body), true), 0, 0, 0, 0)
	case event.KindBarrier:
	case event.KindRemoves:
		if ev.data != nil {
			var rm event.Removes
			if err := rm.Decode(ev.data); err != nil {
				d.fatalf("removes: %v", err)
			}
			s.ApplyRemovesBy(q, rm.Seqs, rm.Stamp)
		} else {
			for _, seq := range ev.seqs {
				s.ApplyRemove(q, seq)
			}
		}
	case event.KindAcquires:
		s.ApplyAcquires(q, ev.seqs, ev.window, ev.st)
		if ev.st.Broker == 0 && b.id == ev.from && ev.tag != 0 {
			s.acquired(ev.tag, nil)
		}
	case event.KindReleases:
		s.ApplyReleases(q, ev.seqs, ev.unseen, ev.st)
		if ev.st.Broker == 0 && b.id == ev.from && ev.tag != 0 {
			s.acquired(ev.tag, nil)
		}
	case event.KindOwn:
		var o event.Own
		_ = o.Decode(ev.data)
		s.ApplyOwn(q, &o, ev.index)
	case event.KindWant:
		var w event.Want
		_ = w.Decode(ev.data)
		s.ApplyWant(q, w.Broker, w.Withdraw, w.Stamp.Tag, ev.index)
	}
	d.loop(b)
}

// resync does what the node does at Replicator.Resync: the group's
// state dropped, the committed log applied again, and the broker's
// consumers of the group's queues ended (the server cancels them).
//
// An event applied again may ask for another resync (an own event that
// requeues this broker's holdings, which it proposed as a master): the
// node then applies the log again from its start, as here.
func (d *ownSim) resync(b *ownBroker) {
	for again := false; ; again = true {
		b.resync = false
		d.logf("b%d resyncs (again: %v)", b.id, again)
		for _, c := range b.cons {
			if !c.gone {
				c.gone = true
				c.sess.MarkClosed()
				b.s.handleCmd(Command{op: opSessionClosed, sess: c.sess})
			}
		}
		resetGroup(1)(b.s)
		for i := uint64(1); i <= d.index; i++ {
			if ev, ok := d.committed[i]; ok {
				d.apply(b, ev)
			}
		}
		if !b.resync {
			return
		}
	}
}

// checkOwnership checks that every broker that applied the same events
// agrees who owns the queue, under which number, and who wants it.
func (d *ownSim) checkOwnership() {
	mb := d.masterBroker()
	m := mb.q.rareState()
	for _, b := range d.bs {
		if b == mb || b.frozen || b.deposed || len(b.backlog) > 0 {
			continue
		}
		rs := b.q.rareState()
		if rs.ownedBy != m.ownedBy || rs.ownGen != m.ownGen || !slices.Equal(rs.wanters, m.wanters) {
			d.fatalf("broker %d: owner %d gen %d wanters %v; broker %d (the master): owner %d gen %d wanters %v",
				b.id, rs.ownedBy, rs.ownGen, rs.wanters, mb.id, m.ownedBy, m.ownGen, m.wanters)
		}
	}
}

// forward moves b's oldest proposal into the log, drops it (not taken:
// its failure goes back at once), or (lost) moves it and tells b it
// failed, as a forward whose connection dropped with it in flight.
func (d *ownSim) forward(b *ownBroker, how int) {
	ev := b.transit[0]
	b.transit = b.transit[1:]
	fail := func(code wire.ErrorCode) {
		if ev.tag != 0 {
			b.s.acquired(ev.tag, Errorf(code, "not taken by the sim"))
		} else if ev.done != nil {
			ev.done(Errorf(code, "not taken by the sim"))
		}
	}
	switch how {
	case 0:
		d.logf("b%d forward %v", b.id, ev.kind)
		d.log = append(d.log, ev)
	case 1:
		d.logf("b%d forward %v refused", b.id, ev.kind)
		fail(wire.CodeUnavailable)
	case 2:
		d.logf("b%d forward %v lost", b.id, ev.kind)
		d.log = append(d.log, ev)
		fail(wire.CodeOutcomeUnknown)
	}
	d.loop(b)
}

func (d *ownSim) anyBroker() *ownBroker { return d.bs[d.rng.Intn(len(d.bs))] }

func (d *ownSim) publish() {
	p := "m" + strconv.Itoa(d.next)
	d.next++
	d.log = append(d.log, ownEvent{from: d.master, kind: event.KindEnqueue, body: p})
}

func (d *ownSim) subscribe(b *ownBroker, credit uint32, ackNone bool) *simConsumer {
	d.sessID++
	c := &simConsumer{w: &captureWriter{}, id: uint32(d.sessID), ackNone: ackNone, tags: map[uint64]string{}}
	c.sess = &Session{ID: d.sessID, Version: wire.Current, FrameMax: wire.FrameSizeDefault, Out: c.w}
	mode := wire.AckExplicit
	if ackNone {
		mode = wire.AckNone
	}
	d.logf("b%d subscribe %d ack-none=%v credit %d", b.id, c.id, ackNone, credit)
	b.s.handleCmd(Subscribe{Sess: c.sess, CmdID: 1, Queue: b.q, ConsumerID: c.id, Credit: credit, AckMode: mode}.Command())
	b.cons = append(b.cons, c)
	return c
}

func liveConsumer(rng *rand.Rand, b *ownBroker) *simConsumer {
	var live []*simConsumer
	for _, c := range b.cons {
		if !c.gone {
			live = append(live, c)
		}
	}
	if len(live) == 0 {
		return nil
	}
	return live[rng.Intn(len(live))]
}

func (d *ownSim) settle(b *ownBroker, c *simConsumer, kind uint8) {
	tags := slices.Sorted(func(yield func(uint64) bool) {
		for t := range c.tags {
			if !yield(t) {
				return
			}
		}
	})
	if len(tags) == 0 {
		return
	}
	tag := tags[d.rng.Intn(len(tags))]
	p := c.tags[tag]
	delete(c.tags, tag)
	d.logf("b%d settle %s tag %d kind %v", b.id, p, tag, kind)
	st := Settle{Sess: c.sess, CmdID: 7, ConsumerID: c.id, Kind: kind, Last: true, NRanges: 1}
	st.Ranges[0] = wire.Range{First: tag, Last: tag}
	b.s.handleCmd(st.Command())
}

// step does one random thing.
func (d *ownSim) step() {
	d.now += int64(time.Duration(d.rng.Intn(800)) * time.Microsecond)
	b := d.anyBroker()
	r := d.rng.Intn(100)
	switch {
	case r < 14:
		d.publish()
	case r < 34 && len(d.log) > 0:
		d.commit()
	case r < 46 && len(b.transit) > 0 && !b.frozen:
		how := 0
		if x := d.rng.Intn(12); x == 0 {
			how = 1
		} else if x == 1 {
			how = 2
		}
		d.forward(b, how)
	case r < 50 && !b.frozen:
		d.subscribe(b, uint32(d.rng.Intn(6)), d.rng.Intn(6) == 0)
	case r < 58 && !b.frozen:
		if c := liveConsumer(d.rng, b); c != nil {
			b.s.handleCmd(Credit{Sess: c.sess, ConsumerID: c.id, Credit: uint32(1 + d.rng.Intn(4))}.Command())
		}
	case r < 76 && !b.frozen:
		if c := liveConsumer(d.rng, b); c != nil {
			d.settle(b, c, []uint8{SettleAccept, SettleAccept, SettleAccept, SettleRelease, SettleReject}[d.rng.Intn(5)])
		}
	case r < 79 && !b.frozen:
		if c := liveConsumer(d.rng, b); c != nil {
			d.logf("b%d cancel %d", b.id, c.id)
			b.s.handleCmd(Cancel{Sess: c.sess, ConsumerID: c.id}.Command())
			c.gone = true
		}
	case r < 81 && !b.frozen:
		if c := liveConsumer(d.rng, b); c != nil {
			d.logf("b%d close %d", b.id, c.id)
			c.gone = true
			c.sess.MarkClosed()
			b.s.handleCmd(Command{op: opSessionClosed, sess: c.sess})
		}
	case r < 83 && b.id != d.master && !b.frozen && d.rng.Intn(3) == 0:
		d.logf("b%d freezes", b.id)
		b.frozen = true
	case r < 83 && d.masters && b.id == d.master && d.rng.Intn(6) == 0:
		// The master freezes past its lease: another is elected.
		if d.changeMaster() {
			d.logf("b%d freezes", b.id)
			b.frozen = true
		}
	case r < 85 && b.frozen:
		d.thaw(b)
	case r < 97:
		if !b.frozen {
			b.s.now = d.now
			b.s.tick()
		}
	case r < 98 && d.masters && d.rng.Intn(2) == 0:
		d.changeMaster() // a rebalance, or the master's death
	case r < 100 && b.deposed && !b.frozen:
		d.stepDown(b)
	}
	d.loopAll()
}

// thaw lets a frozen broker run again: it applies what committed
// meanwhile, and resynchronises if it lost the queue.
func (d *ownSim) thaw(b *ownBroker) {
	d.logf("b%d thaws, %d events behind", b.id, len(b.backlog))
	b.frozen, b.thawing = false, true
	backlog := b.backlog
	b.backlog = nil
	for _, ev := range backlog {
		d.apply(b, ev)
	}
	b.thawing = false
	later := b.later
	b.later = nil
	for _, f := range later {
		f()
	}
	if b.deposed {
		d.stepDown(b)
	} else if b.resync {
		d.resync(b)
	}
	d.checkOwnership()
}

// quiesce forwards and commits everything, ticking, until nothing moves.
func (d *ownSim) quiesce() {
	for range 400 {
		moved := false
		for _, b := range d.bs {
			if b.deposed && !b.frozen {
				d.stepDown(b)
			}
		}
		for _, b := range d.bs {
			for len(b.transit) > 0 && !b.frozen {
				d.forward(b, 0)
				moved = true
			}
		}
		for len(d.log) > 0 {
			d.commit()
			moved = true
		}
		d.now += int64(5 * time.Millisecond)
		for _, b := range d.bs {
			if !b.frozen {
				b.s.now = d.now
				b.s.tick()
			}
		}
		d.loopAll()
		if !moved {
			idle := len(d.log) == 0
			for _, b := range d.bs {
				idle = idle && len(b.transit) == 0
			}
			if idle {
				return
			}
		}
	}
}

// agree checks that every broker that is not frozen holds the same
// messages in the same states with the same counts as the master.
func (d *ownSim) agree() {
	mb := d.masterBroker()
	ms := queueStates(mb.q)
	for _, b := range d.bs {
		if b == mb || b.frozen || b.deposed {
			continue
		}
		bs := queueStates(b.q)
		for seq, m := range ms {
			if o := bs[seq]; o != m {
				d.fatalf("message %d (%s): broker %d (the master) %q, broker %d %q", seq, d.bodies[seq], mb.id, m, b.id, o)
			}
		}
		for seq, o := range bs {
			if _, ok := ms[seq]; !ok {
				d.fatalf("message %d (%s): broker %d %q, broker %d (the master) has none", seq, d.bodies[seq], b.id, o, mb.id)
			}
		}
	}
}

// drain thaws every broker, gives each a consumer with credit that
// accepts all it gets, and checks that every message is consumed.
func (d *ownSim) drain() {
	for _, b := range d.bs {
		if b.frozen {
			d.thaw(b)
		}
	}
	d.quiesce()
	var cs []*simConsumer
	for _, b := range d.bs {
		for _, c := range b.cons {
			if !c.sess.Closed() {
				d.logf("b%d close %d", b.id, c.id)
				c.gone = true
				c.sess.MarkClosed()
				b.s.handleCmd(Command{op: opSessionClosed, sess: c.sess})
			}
		}
		cs = append(cs, d.subscribe(b, 1<<20, false))
	}
	for range 300 {
		d.quiesce()
		for i, b := range d.bs {
			c := cs[i]
			for len(c.tags) > 0 {
				d.settle(b, c, SettleAccept)
			}
		}
		d.loopAll()
		if mq := d.masterBroker().q; mq.Depth() == 0 && len(mq.acquiredMap()) == 0 {
			break
		}
	}
	d.quiesce()
	d.agree()
	for seq, p := range d.bodies {
		if st, ok := queueStates(d.masterBroker().q)[seq]; ok {
			rs := d.masterBroker().q.rareState()
			by, held := rs.acqBy[seq]
			d.fatalf("message %s (%d) is still in the queue after the drain: %s (held by %d: %v; owner %d, wanters %v)", p, seq, st, by, held, rs.ownedBy, rs.wanters)
		}
	}
}

// TestOwnershipSimulation runs seeded schedules of ownSim: 2,000 in the
// plain pass (about 7 s), 100 under -short. BERTH_OWN_SIM_SEED replays one;
// BERTH_OWN_SIM_SEEDS runs that many.
func TestOwnershipSimulation(t *testing.T) {
	const steps = 400
	first, seeds := simSeeds(t, "BERTH_OWN_SIM", 2000, 100) // -short: the race pass, about 4 s
	handovers, refreshes, masterChanges := 0, 0, 0
	for seed := first; seed < first+int64(seeds); seed++ {
		ok := t.Run(strconv.FormatInt(seed, 10), func(t *testing.T) {
			d := newOwnSim(t, seed)
			for i := range steps {
				d.step()
				if i%80 == 79 {
					d.quiesce()
					d.agree()
				}
			}
			d.drain()
			handovers += int(d.masterBroker().q.rareState().ownGen)
			masterChanges += d.masterChanges
			refreshes += d.refreshes
		})
		if !ok {
			t.Fatalf("seed %d failed; replay it with BERTH_OWN_SIM_SEED=%d", seed, seed)
		}
	}
	if handovers == 0 || refreshes == 0 || masterChanges == 0 && os.Getenv("BERTH_OWN_SIM_MASTERS") == "1" {
		t.Fatalf("%d own events (%d of them restated) and %d master changes over %d schedules: the schedules must move the queue, restate its ownership and change masters", handovers, refreshes, masterChanges, seeds)
	}
	t.Logf("%d own events (%d of them restated) and %d master changes over %d schedules", handovers, refreshes, masterChanges, seeds)
}

// TestOwnerStaysPutProposesNothing: consumers on the queue's owner only
// (the master, and then a broker the queue passed to): no want or own
// event enters the log, whatever their credit does.
func TestOwnerStaysPutProposesNothing(t *testing.T) {
	d := newOwnSim(t, 1)
	count := func() (n int) {
		for _, ev := range d.committed {
			if ev.kind == event.KindOwn || ev.kind == event.KindWant {
				n++
			}
		}
		return n
	}
	m := d.bs[0]
	c := d.subscribe(m, 3, false)
	for i := range 400 {
		d.now += int64(time.Millisecond)
		switch i % 4 {
		case 0:
			d.publish()
		case 1:
			d.quiesce()
		case 2:
			for len(c.tags) > 0 {
				d.settle(m, c, SettleAccept)
			}
		case 3:
			m.s.handleCmd(Credit{Sess: c.sess, ConsumerID: c.id, Credit: uint32(i % 3)}.Command())
		}
		d.loopAll()
	}
	d.quiesce()
	if n := count(); n != 0 {
		t.Fatalf("%d want or own events with every consumer at the master", n)
	}
	if d.seen["m0"] == 0 {
		t.Fatal("nothing was delivered")
	}
}
