package server

// Replicated queues: a durable queue of a broker that runs replication
// groups (-peer) lives in group hash(name) mod G. Its events go through
// that group's log: the master proposes each enqueue (a publish), each
// removal (an accept, a reject, an expiry, a drop) and a barrier at the end
// of each settle; every member applies them in log order when they commit;
// the master completes the client's command then. Acquires and releases
// stay on the master: a follower holds every message not yet removed as
// ready, so after a failover the new master delivers again whatever the
// old one had handed out and not had accepted (guarantee 6).
//
// A publish taken by a broker that is not the group's master is forwarded
// to the master (forward.go), and a consumer is proxied to it (proxy.go).
// Only the master expires and dead-letters a replicated queue's
// messages; it proposes their removal once the dead letters are stored.
// A purge is replicated as the removes of its messages, a delete as those
// removes and a gevDelete, at which the followers drop their copy. The
// group log is compacted up to its oldest message still in a queue
// (server/groups): every member forgets the enqueue of a message when
// its removal commits, or when a follower drops it with its queue; a
// message never consumed keeps the log after it, on disk and at about 48
// bytes an event in memory.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"sync/atomic"
	"time"

	"github.com/berthmq/berth/controlplane/ctlapi"
	"github.com/berthmq/berth/journal"
	"github.com/berthmq/berth/server/groups"
	"github.com/berthmq/berth/shards"
	"github.com/berthmq/berth/shards/group"
	"github.com/berthmq/berth/wire"
)

// Group log events of replicated queues.
const (
	// gevEnqueue: name str16, expiresAt u64, persistent u8, exchange
	// str16, key str16, props bytes, payload bytes; then, for a message
	// with a priority or a deliver-at time, priority u8 and deliverAt u64
	// (unix ns); then, for a publish with a producer id, producer u64 and
	// its seq u64. The trailers are told apart by what remains (9, 16 or
	// 25 bytes): older entries lack them, and older brokers never read
	// past the payload.
	gevEnqueue byte = 'E'
	gevRemove  byte = 'R' // name str16, seq u64 (logs written before gevRemoves)
	gevRemoves byte = 'S' // name str16, n u32, n x seq u64
	gevBarrier byte = 'B'
	gevDelete  byte = 'D' // name str16: the master dropped the queue
)

// replicator is the server's shards.Replicator.
type replicator struct {
	s      *Server
	groups atomic.Uint32 // the cluster's group count; 0 until known
	local  *localQueues  // durable queues kept out of the groups (localqueues.go)
	// foreign: durable queues other brokers keep out of the groups, on
	// themselves (localqueues.go, wiringsync.go).
	foreign *localQueues
	// restoring: the wiring is being restored at start (keepLocal).
	restoring atomic.Bool
	waiters   []*shardWaiter // by shard index
	// windows are the shards' read-ahead windows into the group journal
	// (ReadEnqueue), by shard index: each is its shard goroutine's.
	windows []journal.Window
}

// GroupOf is the replication group of queue name among n groups.
func GroupOf(name string, n uint32) uint32 {
	h := fnv.New32a()
	h.Write([]byte(name))
	return h.Sum32() % n
}

func (r *replicator) node() *groups.Node {
	if m := r.s.groups.Load(); m != nil {
		return m.Node()
	}
	return nil
}

// Group decides at a queue's creation whether it is replicated. While
// the group count is not known yet (the manager has not read it), it asks
// the controller: a queue declared just after "berthctl cluster init" must
// not stay local by a race. It runs off the hot paths (declares, restore).
func (r *replicator) Group(name string, opts shards.QueueOptions) (uint32, bool) {
	if !opts.Durable || opts.Exclusive || r.local.has(name) {
		return 0, false
	}
	n, known := r.groupCount(context.Background())
	if !known {
		return 0, false // decided again at the next start
	}
	if n == 0 {
		r.keepLocal(name)
		return 0, false
	}
	return GroupOf(name, n), true
}

// groupCount is the cluster's group count, read from the controller
// while it is 0 here; known is false when that read failed.
func (r *replicator) groupCount(ctx context.Context) (n uint32, known bool) {
	if n := r.groups.Load(); n > 0 {
		return n, true
	}
	ctx, cancel := context.WithTimeout(ctx, wiringTimeout)
	info, err := r.s.brokerClient().GetClusterInfo(ctx, ctlapi.ReadConsistent)
	cancel()
	if err != nil {
		return 0, false
	}
	if info.Config.Groups > 0 {
		r.groups.CompareAndSwap(0, info.Config.Groups)
	}
	return r.groups.Load(), true
}

// keepLocal writes down a durable queue created while the cluster has
// no groups (localqueues.go): at once, unless the wiring is being
// restored at start, whose queues are written in one batch after it.
func (r *replicator) keepLocal(name string) {
	r.local.add(name)
	if r.restoring.Load() {
		return
	}
	if err := r.local.flush(); err != nil {
		r.s.log.Error("server: writing down a local queue failed; it may become replicated after a restart", "queue", name, "err", err)
	}
}

func (r *replicator) IsMaster(g uint32) bool {
	n := r.node()
	return n != nil && n.IsMaster(g)
}

func (r *replicator) Delivering(g uint32) bool {
	n := r.node()
	return n != nil && n.Delivering(g)
}

var errGroupsStarting = shards.Errorf(wire.CodeResourceLimit, "the replication groups are starting; retry")

// propose proposes data, an event of q's group, reporting its outcome to
// w under tag: on this broker when it is the group's master, else
// forwarded to the master (an enqueue; other events only come from a
// master).
func (r *replicator) propose(q *shards.Queue, data []byte, w groups.Waiter, tag uint64) error {
	g, _ := q.Replicated()
	if n := r.node(); (n == nil || !n.IsMaster(g)) && data[0] == gevEnqueue {
		return r.forward(g, data, func(err error) { w.Committed(tag, err) }) // forward.go
	}
	return r.proposeHere(q, data, w, tag)
}

// proposeHere proposes on this broker, which must be g's master. w is
// told the group's outcome as it is (groupError gives it a wire code).
func (r *replicator) proposeHere(q *shards.Queue, data []byte, w groups.Waiter, tag uint64) error {
	g, _ := q.Replicated()
	n := r.node()
	if n == nil {
		return errGroupsStarting
	}
	if !n.IsMaster(g) {
		return shards.Errorf(wire.CodeNotAllowed, "queue %q is replicated in group %d, whose master is another broker", q.Name, g)
	}
	err := n.ProposeAsync(g, data, w, tag)
	if errors.Is(err, groups.ErrBusy) {
		return shards.Errorf(wire.CodeResourceLimit, "group %d is busy; retry", g)
	}
	return groupError(err)
}

// funcWaiter tells a function a proposal's outcome, with a wire code.
func funcWaiter(done func(error)) groups.Waiter {
	return groups.FuncWaiter(func(err error) { done(groupError(err)) })
}

// shardWaiter tells a shard the outcome of its replicated publishes, with
// a wire code; one per shard, so that a publish allocates no waiter.
type shardWaiter struct{ sh *shards.Shard }

func (w *shardWaiter) Committed(tag uint64, err error) { w.sh.Committed(tag, groupError(err)) }

// groupError gives a group failure a wire code.
func groupError(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, groups.ErrClosed):
		return shards.Errorf(wire.CodeShutdown, "the broker is shutting down")
	case errors.Is(err, groups.ErrJournalFailed) && errors.Is(err, group.ErrNotMaster):
		return shards.Errorf(wire.CodeOutcomeUnknown, "this broker's group journal failed with the command in flight (%v); its outcome is unknown; another broker takes the group over", err)
	case errors.Is(err, groups.ErrJournalFailed):
		return shards.Errorf(wire.CodeUnavailable, "this broker's group journal failed (%v); the command was not taken; retry: another broker takes the group over", err)
	case errors.Is(err, group.ErrNotEnoughSet):
		return shards.Errorf(wire.CodeUnavailable, "fewer replicas of the queue's group are in sync than min-sync-replicas; retry")
	case errors.Is(err, group.ErrNotMaster) && errors.Is(err, groups.ErrNotProposed):
		return shards.Errorf(wire.CodeUnavailable, "this broker stopped being the master of the queue's group before it proposed the command; the command was not taken; retry")
	case errors.Is(err, group.ErrNotMaster):
		return shards.Errorf(wire.CodeOutcomeUnknown, "the queue's group changed master while the command was in flight; its outcome is unknown")
	case errors.Is(err, group.ErrHandover):
		return shards.Errorf(wire.CodeUnavailable, "the queue's group is moving its master to another broker; the command was not taken; retry")
	case errors.Is(err, group.ErrBacklog):
		return shards.Errorf(wire.CodeResourceLimit, "the queue's group has too many events waiting to commit; retry")
	}
	var coded *shards.Error
	if errors.As(err, &coded) {
		return err // a forward's outcome, which has its code already
	}
	return shards.Errorf(wire.CodeInternal, "%v", err)
}

func (r *replicator) ProposeEnqueue(q *shards.Queue, b *shards.Body, expiresAt int64, producer, producerSeq uint64, tag uint64) error {
	return r.propose(q, appendEnqueueEvent(nil, q.Name, b, expiresAt, producer, producerSeq), r.waiters[q.Shard()], tag)
}

// appendEnqueueEvent encodes a gevEnqueue event.
func appendEnqueueEvent(data []byte, name string, b *shards.Body, expiresAt int64, producer, producerSeq uint64) []byte {
	if data == nil {
		data = make([]byte, 0, 57+len(name)+len(b.Exchange)+len(b.RoutingKey)+len(b.Props)+len(b.Payload))
	}
	data = append(data, gevEnqueue)
	data = wire.AppendStr(data, name)
	data = wire.AppendU64(data, uint64(expiresAt))
	data = wire.AppendBool(data, b.Persistent)
	data = wire.AppendStrBytes(data, b.Exchange)
	data = wire.AppendStrBytes(data, b.RoutingKey)
	data = wire.AppendBytes(data, b.Props)
	data = wire.AppendBytes(data, b.Payload)
	if b.Priority != 0 || b.DeliverAt != 0 {
		data = wire.AppendU8(data, b.Priority)
		data = wire.AppendU64(data, uint64(b.DeliverAt))
	}
	if producer != 0 {
		data = wire.AppendU64(data, producer)
		data = wire.AppendU64(data, producerSeq)
	}
	return data
}

// enqueueEvent is a decoded gevEnqueue event after its queue name.
type enqueueEvent struct {
	expiresAt             int64
	body                  *shards.Body
	producer, producerSeq uint64
}

// decodeEnqueueEvent decodes the rest of a gevEnqueue event from rd,
// which has read the kind and the queue name. The body it returns holds
// one reference; it aliases the event if view is set, else it is a copy.
func decodeEnqueueEvent(rd *wire.Reader, view bool) (enqueueEvent, bool) {
	var ev enqueueEvent
	ev.expiresAt = int64(rd.U64())
	persistent := rd.Bool()
	ex, key := rd.Str(wire.NameLenMax), rd.Str(wire.RoutingKeyLenMax)
	props, payload := rd.Bytes(wire.FrameSizeMax), rd.Bytes(wire.FrameSizeMax)
	var prio uint8
	var at int64
	prio, at, ev.producer, ev.producerSeq = readEnqueueTrailers(rd)
	if rd.Err() != nil || rd.Remaining() != 0 {
		return ev, false
	}
	// A view aliases the event, which the group log keeps unchanged (and
	// the garbage collector keeps as long as the body needs it).
	if view {
		ev.body = shards.NewBodyView(ex, key, props, payload, persistent)
	} else {
		ev.body = shards.NewBody(ex, key, props, payload, persistent)
	}
	ev.body.Priority, ev.body.DeliverAt = prio, at
	return ev, true
}

// readEnqueueTrailers reads what may follow a gevEnqueue event's payload:
// the priority and deliver-at time, then the producer id and sequence
// number, each pair only when it was written (zeros otherwise). The
// caller checks that nothing is left.
func readEnqueueTrailers(rd *wire.Reader) (prio uint8, at int64, producer, producerSeq uint64) {
	if n := rd.Remaining(); n == 9 || n == 25 {
		prio, at = rd.U8(), int64(rd.U64())
	}
	if rd.Remaining() == 16 {
		producer, producerSeq = rd.U64(), rd.U64()
	}
	return prio, at, producer, producerSeq
}

// MemoryBytes is what the group node holds outside its logs
// (groups.Node.MemoryBytes); safe from any goroutine.
func (r *replicator) MemoryBytes() int64 {
	if n := r.node(); n != nil {
		return n.MemoryBytes()
	}
	return 0
}

// ReadEnqueue reads back a paged replicated message from its group's
// journal; it runs on the queue's shard goroutine.
func (r *replicator) ReadEnqueue(q *shards.Queue, seq, logPos uint64, dst []byte) (*shards.Body, []byte, error) {
	g, _ := q.Replicated()
	n := r.node()
	if n == nil {
		return nil, dst, errGroupsStarting
	}
	rec, data, err := n.ReadEntry(g, seq, journal.Pos(logPos), &r.windows[q.Shard()], dst)
	rec = rec[:0]
	if err != nil {
		return nil, rec, err
	}
	var rd wire.Reader
	rd.Reset(data)
	if kind := rd.U8(); kind != gevEnqueue {
		return nil, rec, fmt.Errorf("server: group %d entry %d is not an enqueue (kind %d)", g, seq, kind)
	}
	if name := rd.Str(wire.NameLenMax); string(name) != q.Name {
		return nil, rec, fmt.Errorf("server: group %d entry %d enqueues to %q, not %q", g, seq, name, q.Name)
	}
	ev, ok := decodeEnqueueEvent(&rd, false)
	if !ok {
		return nil, rec, fmt.Errorf("server: group %d entry %d is a malformed enqueue", g, seq)
	}
	return ev.body, rec, nil
}

func (r *replicator) ProposeRemoves(q *shards.Queue, seqs []uint64, done func(error)) error {
	data := make([]byte, 0, 7+len(q.Name)+8*len(seqs))
	data = append(data, gevRemoves)
	data = wire.AppendStr(data, q.Name)
	data = binary.BigEndian.AppendUint32(data, uint32(len(seqs)))
	for _, seq := range seqs {
		data = binary.BigEndian.AppendUint64(data, seq)
	}
	if done == nil {
		done = func(error) {}
	}
	return r.propose(q, data, funcWaiter(done), 0)
}

func (r *replicator) ProposeDelete(q *shards.Queue) error {
	data := wire.AppendStr([]byte{gevDelete}, q.Name)
	return r.propose(q, data, funcWaiter(func(error) {}), 0)
}

func (r *replicator) Barrier(q *shards.Queue, done func(error)) error {
	return r.propose(q, []byte{gevBarrier}, funcWaiter(done), 0)
}

// apply carries a committed group entry to its queue's shard. It runs on
// the group node's goroutine; it waits for room in the shard's ring (a
// shard never waits for the node, so this cannot deadlock).
func (r *replicator) apply(g uint32, e wire.GroupEntry) {
	if len(e.Data) == 0 {
		return // forgotten: an enqueue whose message was removed since, or a removal
	}
	var rd wire.Reader
	rd.Reset(e.Data)
	kind := rd.U8()
	if kind == gevBarrier {
		r.forget(g, e.Index)
		return
	}
	nameB := rd.Str(wire.NameLenMax)
	s := r.s
	if kind == gevDelete {
		name := string(nameB)
		// The master dropped the queue when it proposed this, and its
		// messages' enqueues are forgotten as their removals, proposed
		// with it, commit. A master applying it may hold a queue declared
		// again since under the name: it keeps it (one that became master
		// after the proposal keeps an empty copy until it restarts). A
		// follower drops its copy, and forgets the enqueues of what the
		// copy still held (those committed after the master dropped it,
		// or whose removals the group did not take): their entries have
		// no effect left, and compaction passes them.
		r.forget(g, e.Index)
		if !r.IsMaster(g) {
			for _, seq := range s.wiring.DropReplica(name) {
				r.forget(g, seq)
			}
		}
		return
	}
	var seqs []uint64 // a removal's messages
	switch kind {
	case gevRemove:
		seq := rd.U64()
		if rd.Err() != nil {
			s.log.Error("server: malformed replicated remove; skipped", "group", g, "index", e.Index)
			return
		}
		seqs = []uint64{seq}
	case gevRemoves:
		n := rd.Count(8)
		if n > shards.RemovesMax {
			s.log.Error("server: replicated removes over the bound; skipped", "group", g, "index", e.Index, "count", n)
			return
		}
		seqs = make([]uint64, 0, n)
		for range n {
			seqs = append(seqs, rd.U64())
		}
		if rd.Err() != nil {
			s.log.Error("server: malformed replicated removes; skipped", "group", g, "index", e.Index)
			return
		}
	case gevEnqueue:
	default:
		s.log.Error("server: replicated event of unknown kind; skipped", "group", g, "index", e.Index, "kind", kind)
		return
	}
	removal := kind != gevEnqueue
	if removal {
		// The messages' enqueues (their Seq is the enqueue's index) have
		// no effect left: a member that lacks them need not get their
		// data. This removal still has one on a member that holds the
		// messages, so it keeps its data until the log is compacted past
		// it. That holds whether or not the queue is here: the master
		// applies the removals of a queue it deleted to no queue.
		for _, seq := range seqs {
			r.forget(g, seq)
		}
		r.retire(g, e.Index)
	}
	q := s.wiring.Routing().Queue(nameB)
	if q == nil && removal {
		return // no copy of the queue here, so none of its messages
	}
	if q == nil {
		var err error
		if q, err = s.wiring.Adopt(string(nameB)); err != nil {
			if shards.CodeOf(err) == wire.CodeNotFound {
				// The controller has no such queue: it was deleted after
				// this enqueue was proposed, and the enqueue has no
				// effect.
				r.forget(g, e.Index)
				s.log.Debug("server: a replicated enqueue for a deleted queue; skipped", "group", g, "index", e.Index, "queue", string(nameB))
				return
			}
			s.log.Warn("server: a replicated event for a queue this broker cannot find; skipped", "group", g, "index", e.Index, "queue", string(nameB), "err", err)
			return
		}
	}
	sh := s.broker.Shards()[q.Shard()]
	if removal {
		call := func(sh *shards.Shard) {
			for _, seq := range seqs {
				sh.ApplyRemove(q, seq)
			}
		}
		// The node's goroutine parks while the ring is full: a shard
		// never waits for the node, so this cannot deadlock.
		_ = sh.PushCall(s.regCtx, call) // fails only once the broker closes
		return
	}
	ev, ok := decodeEnqueueEvent(&rd, true)
	if !ok {
		s.log.Error("server: malformed replicated enqueue; skipped", "group", g, "index", e.Index)
		return
	}
	// Above the shard's high watermark the log drops the event's data:
	// the body is then its only copy in memory, and the shard may page it
	// out (shards.Shard.ApplyEnqueue).
	var logPos uint64
	if n := r.node(); n != nil {
		logPos = uint64(n.Page(g, e.Index, sh.Paging()))
	}
	// Pushed as a command rather than a call: an enqueue, the bulk of a
	// group's events, allocates no closure.
	if sh.PushApplyEnqueue(s.regCtx, q, e.Index, ev.body, ev.expiresAt, ev.producer, ev.producerSeq, logPos) != nil {
		ev.body.Unref() // the broker is closing
	}
}

// Skipped drops the data of an enqueue the shard skipped as a producer's
// duplicate, as a removal does for its message's enqueue (forget): a
// member that applies the log again after a step-down then passes over
// it rather than enqueue it with a reset producer table, and compaction
// may drop it. It runs on the shard goroutine: the node does it later,
// and not at all if its inbox is full (the entry then stays as it was).
func (r *replicator) Skipped(q *shards.Queue, seq uint64) {
	g, ok := q.Replicated()
	n := r.node()
	if !ok || n == nil {
		return
	}
	n.ForgetLater(g, seq)
}

// retire marks an applied group entry whose effect here is gone.
func (r *replicator) retire(g uint32, index uint64) {
	if n := r.node(); n != nil {
		n.Retire(g, index)
	}
}

// forget drops the data of an applied group entry whose effect is gone.
func (r *replicator) forget(g uint32, index uint64) {
	if n := r.node(); n != nil {
		n.Forget(g, index)
	}
}

// restoreDone ends the wiring's restore: the local queues it found are
// written down in one batch.
func (r *replicator) restoreDone() error {
	r.restoring.Store(false)
	return r.local.flush()
}

// initReplication connects the shards to the replication groups before
// the wiring is restored, so restored durable queues are replicated: it
// reads the cluster's group count (0 if the cluster is not initialised
// yet; queues declared before "berthctl cluster init" stay on their
// broker).
func (s *Server) initReplication() error {
	local, err := loadLocalQueues(s.cfg.DataDir)
	if err != nil {
		return err
	}
	foreign, err := loadQueueList(s.cfg.DataDir, foreignQueuesFile)
	if err != nil {
		local.close()
		return err
	}
	r := &replicator{s: s, local: local, foreign: foreign}
	r.restoring.Store(true) // until restoreDone
	for _, sh := range s.broker.Shards() {
		r.waiters = append(r.waiters, &shardWaiter{sh})
	}
	r.windows = make([]journal.Window, len(r.waiters))
	s.replicator = r
	s.broker.SetReplicator(r)
	ctx, cancel := context.WithTimeout(context.Background(), wiringTimeout)
	defer cancel()
	for {
		info, err := s.brokerClient().GetClusterInfo(ctx, ctlapi.ReadFollower)
		if err == nil {
			// Known at start: the queues on the list (if any) stay
			// local; the rest are restored into their groups.
			r.groups.Store(info.Config.Groups)
			if n := local.len(); n > 0 {
				s.log.Info("server: durable queues declared before the cluster had groups stay on this broker", "queues", n)
			}
			return nil
		}
		if ctx.Err() != nil {
			s.log.Warn("server: cluster group count unknown at start; durable queues restored now are not replicated", "err", err)
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (r *replicator) String() string { return fmt.Sprintf("replicator(%d groups)", r.groups.Load()) }
