package replication

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
// to the master (forward.go), and a consumer is proxied to it
// (server/proxy.go).
// Only the master expires and dead-letters a replicated queue's
// messages; it proposes their removal once the dead letters are stored.
// A purge is replicated as the removes of its messages, a delete as those
// removes and a delete event, at which the followers drop their copy. The
// group log is compacted up to its oldest message still in a queue
// (replication/groups): every member forgets the enqueue of a message when
// its removal commits, or when a follower drops it with its queue; a
// message never consumed keeps the log after it, on disk and at about 48
// bytes an event in memory.

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/berthmq/berth/controlplane/ctlapi"
	"github.com/berthmq/berth/controlplane/ctlclient"
	"github.com/berthmq/berth/journal"
	"github.com/berthmq/berth/replication/event"
	"github.com/berthmq/berth/replication/group"
	"github.com/berthmq/berth/replication/groups"
	"github.com/berthmq/berth/shards"
	"github.com/berthmq/berth/wire"
)

// The group log's events of replicated queues (enqueue, removes,
// barrier, delete) are encoded and decoded by replication/event. A
// removal event holds at most event.SeqsMax messages:
var _ [event.SeqsMax - shards.RemovesMax]struct{}

// Config is what a Replicator works with: the broker's parts it reaches,
// as narrow as it uses them.
type Config struct {
	// Broker is the broker's shards, started; New makes the Replicator
	// theirs (shards.Broker.SetReplicator).
	Broker *shards.Broker
	// Wiring looks up, adopts, purges and deletes queues (server/wiring).
	Wiring Wiring
	// Lanes carry forwarded publishes to the shards (lanes.go).
	Lanes *Lanes
	// Controller answers the reads of the cluster's group count.
	Controller Controller
	// Manager is the replication groups' manager, or nil while it has not
	// started; it is called on every use, from any goroutine.
	Manager func() *groups.Manager
	// Self is this broker's id in the controller.
	Self uint32
	// DataDir holds the lists of queues kept local (localqueues.go).
	DataDir string
	// Context ends when the broker closes: work waiting for a shard or
	// a master's answer gives up then.
	Context context.Context
	// ReadTimeout bounds each read of the controller.
	ReadTimeout time.Duration
	Logger      *slog.Logger
}

// Wiring is what the replicator asks of the broker's wiring
// (server/wiring.Wiring).
type Wiring interface {
	// Queue looks a queue up in the current routing snapshot, or nil.
	Queue(name []byte) *shards.Queue
	// Adopt brings in a queue the controller holds and this broker has
	// not declared; a CodeNotFound error when the controller has none.
	Adopt(name string) (*shards.Queue, error)
	// DropReplica drops this broker's copy of a replicated queue that
	// its master deleted, returning the seqs of the messages it held.
	DropReplica(name string) []uint64
	Purge(name string) (int, error)
	DeleteQueue(name string, ifUnused, ifEmpty bool) (int, error)
}

// Controller is the controller read the replicator makes
// (ctlclient.Client).
type Controller interface {
	GetClusterInfo(ctx context.Context, mode ctlapi.ReadMode) (ctlclient.ClusterInfo, error)
}

// Replicator is the broker's shards.Replicator: it carries the shards'
// replicated events to their groups (forwarding them when another broker
// masters the group), applies what the groups commit to the queues, and
// serves what other brokers forward to this one.
type Replicator struct {
	broker     *shards.Broker
	wiring     Wiring
	lanes      *Lanes
	controller Controller
	manager    func() *groups.Manager
	self       uint32
	ctx        context.Context
	timeout    time.Duration
	log        *slog.Logger

	groups atomic.Uint32 // the cluster's group count; 0 until known
	local  *localQueues  // durable queues kept out of the groups (localqueues.go)
	// foreign: durable queues other brokers keep out of the groups, on
	// themselves (localqueues.go, server/wiringsync.go).
	foreign *localQueues
	// restoring: the wiring is being restored at start (keepLocal).
	restoring  atomic.Bool
	waiters    []*shardWaiter // by shard index
	acqWaiters []*acqWaiter   // by shard index
	ownWaiters []*ownWaiter   // by shard index
	// owns tracks, on the node's goroutine, the last own event of each
	// queue, by group and name, and each broker's last want event:
	// superseded ones are retired (applyOwn).
	owns map[uint32]map[string]*ownTrack
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

func (r *Replicator) node() *groups.Node {
	if m := r.manager(); m != nil {
		return m.Node()
	}
	return nil
}

// Place is the wiring's Config.Place once replication runs: it decides
// at a queue's creation whether it is replicated, and in which group.
// While the group count is not known yet (the manager has not read it),
// it asks the controller: a queue declared just after "berthctl cluster
// init" must not stay local by a race. It runs off the hot paths
// (declares, restore).
func (r *Replicator) Place(name string, opts shards.QueueOptions) shards.Placement {
	if !opts.Durable || opts.Exclusive || r.local.has(name) {
		return shards.Placement{}
	}
	n, known := r.GroupCount(context.Background())
	if !known {
		return shards.Placement{} // decided again at the next start
	}
	if n == 0 {
		r.keepLocal(name)
		return shards.Placement{}
	}
	return shards.Placement{Group: GroupOf(name, n), Replicated: true}
}

// GroupCount is the cluster's group count, read from the controller
// while it is 0 here; known is false when that read failed.
func (r *Replicator) GroupCount(ctx context.Context) (n uint32, known bool) {
	if n := r.groups.Load(); n > 0 {
		return n, true
	}
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	info, err := r.controller.GetClusterInfo(ctx, ctlapi.ReadConsistent)
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
func (r *Replicator) keepLocal(name string) {
	r.local.add(name)
	// This broker's own declare: the queue is not another broker's,
	// whatever a wiring pass wrote down before (a name on both lists
	// would be left out at the next start, New).
	if err := r.foreign.remove(name); err != nil {
		r.log.Error("replication: taking a local queue off the list of other brokers' queues failed", "queue", name, "err", err)
	}
	if r.restoring.Load() {
		return
	}
	if err := r.local.flush(); err != nil {
		r.log.Error("replication: writing down a local queue failed; it may become replicated after a restart", "queue", name, "err", err)
	}
}

func (r *Replicator) IsMaster(g uint32) bool {
	n := r.node()
	return n != nil && n.IsMaster(g)
}

func (r *Replicator) Delivering(g uint32) bool {
	n := r.node()
	return n != nil && n.Delivering(g)
}

var errGroupsStarting = shards.Errorf(wire.CodeResourceLimit, "the replication groups are starting; retry")

// propose proposes data, an event of q's group, reporting its outcome to
// w under tag: on this broker when it is the group's master, else
// forwarded to the master (an enqueue; other events only come from a
// master).
func (r *Replicator) propose(q *shards.Queue, data []byte, w groups.Waiter, tag uint64) error {
	g, _ := q.Replicated()
	if n := r.node(); (n == nil || !n.IsMaster(g)) && event.IsEnqueue(data) {
		return r.forward(g, data, func(err error) { w.Committed(tag, err) }) // forward.go
	}
	return r.proposeHere(q, data, w, tag)
}

// proposeHere proposes on this broker, which must be g's master. w is
// told the group's outcome as it is (groupError gives it a wire code).
func (r *Replicator) proposeHere(q *shards.Queue, data []byte, w groups.Waiter, tag uint64) error {
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

// acqWaiter tells a shard the outcome of its acquires events, with a
// wire code; one per shard, as shardWaiter.
type acqWaiter struct{ sh *shards.Shard }

func (w *acqWaiter) Committed(tag uint64, err error) { w.sh.AcquiresCommitted(tag, groupError(err)) }

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

// ProposeEnqueue is shards.Replicator's. On a broker that is not the
// group's master the event is encoded straight into the forwarding connection's buffer (forward.go): one copy
// of the body fewer than encoding it first.
func (r *Replicator) ProposeEnqueue(q *shards.Queue, b *shards.Body, expiresAt int64, producer, producerSeq uint64, tag uint64) error {
	g, _ := q.Replicated()
	w := r.waiters[q.Shard()]
	if n := r.node(); n == nil || !n.IsMaster(g) {
		ev := enqueueOf(q.Name, b, expiresAt, producer, producerSeq)
		return r.forwardEncoded(g, ev.Size(), func(dst []byte) []byte { return event.AppendEnqueue(dst, &ev) },
			func(err error) { w.Committed(tag, err) })
	}
	return r.proposeHere(q, appendEnqueueEvent(nil, q.Name, b, expiresAt, producer, producerSeq), w, tag)
}

// appendEnqueueEvent encodes the enqueue of b to queue name.
func appendEnqueueEvent(data []byte, name string, b *shards.Body, expiresAt int64, producer, producerSeq uint64) []byte {
	ev := enqueueOf(name, b, expiresAt, producer, producerSeq)
	if data == nil {
		data = make([]byte, 0, ev.Size())
	}
	return event.AppendEnqueue(data, &ev)
}

// enqueueOf is the enqueue event of b to queue name; it aliases b.
func enqueueOf(name string, b *shards.Body, expiresAt int64, producer, producerSeq uint64) event.Enqueue {
	return event.Enqueue{Queue: []byte(name), ExpiresAt: expiresAt, Persistent: b.Persistent, Exchange: b.Exchange, RoutingKey: b.RoutingKey,
		Props: b.Props, Payload: b.Payload, Priority: b.Priority, DeliverAt: b.DeliverAt, Producer: producer, ProducerSeq: producerSeq}
}

// enqueueEvent is a decoded enqueue event, its body made.
type enqueueEvent struct {
	expiresAt             int64
	body                  *shards.Body
	producer, producerSeq uint64
}

// enqueueEventOf makes ev's body, which holds one reference; it aliases
// the event if view is set, else it is a copy.
func enqueueEventOf(ev *event.Enqueue, view bool) enqueueEvent {
	// A view aliases the event, which the group log keeps unchanged (and
	// the garbage collector keeps as long as the body needs it).
	var body *shards.Body
	if view {
		body = shards.NewBodyView(ev.Exchange, ev.RoutingKey, ev.Props, ev.Payload, ev.Persistent)
	} else {
		body = shards.NewBody(ev.Exchange, ev.RoutingKey, ev.Props, ev.Payload, ev.Persistent)
	}
	body.Priority, body.DeliverAt = ev.Priority, ev.DeliverAt
	return enqueueEvent{expiresAt: ev.ExpiresAt, body: body, producer: ev.Producer, producerSeq: ev.ProducerSeq}
}

// MemoryBytes is what the group node holds outside its logs
// (groups.Node.MemoryBytes); safe from any goroutine.
func (r *Replicator) MemoryBytes() int64 {
	if n := r.node(); n != nil {
		return n.MemoryBytes()
	}
	return 0
}

// ReadEnqueue reads back a paged replicated message from its group's
// journal; it runs on the queue's shard goroutine.
func (r *Replicator) ReadEnqueue(q *shards.Queue, seq, logPos uint64, dst []byte) (*shards.Body, []byte, error) {
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
	var ev event.Enqueue
	if err := ev.Decode(data); err != nil {
		return nil, rec, fmt.Errorf("replication: group %d entry %d: %w", g, seq, err)
	}
	if string(ev.Queue) != q.Name {
		return nil, rec, fmt.Errorf("replication: group %d entry %d enqueues to %q, not %q", g, seq, ev.Queue, q.Name)
	}
	return enqueueEventOf(&ev, false).body, rec, nil
}

func (r *Replicator) ProposeRemoves(q *shards.Queue, seqs []uint64, done func(error)) error {
	data := event.AppendRemoves(make([]byte, 0, event.HeaderLen+6+len(q.Name)+8*len(seqs)), q.Name, seqs, event.Stamp{})
	if done == nil {
		done = func(error) {}
	}
	return r.propose(q, data, funcWaiter(done), 0)
}

// ProposeReleases is shards.Replicator's.
func (r *Replicator) ProposeReleases(q *shards.Queue, seqs []uint64, unseen bool, st event.Stamp, tag uint64) error {
	data := event.AppendReleases(make([]byte, 0, event.HeaderLen+6+len(q.Name)+8*len(seqs)+event.StampLen), q.Name, seqs, unseen, st)
	if st.Broker != 0 {
		return r.ProposeEvent(q, data, tag)
	}
	return r.proposeHere(q, data, r.acqWaiters[q.Shard()], tag)
}

// ProposeAcquires is shards.Replicator's.
func (r *Replicator) ProposeAcquires(q *shards.Queue, seqs []uint64, window uint32, st event.Stamp, tag uint64) error {
	data := event.AppendAcquires(make([]byte, 0, event.HeaderLen+10+len(q.Name)+8*len(seqs)+event.StampLen), q.Name, seqs, window, st)
	if st.Broker != 0 {
		return r.ProposeEvent(q, data, tag)
	}
	return r.proposeHere(q, data, r.acqWaiters[q.Shard()], tag)
}

// ProposeEvent is shards.Replicator's: an owner's event goes to the
// group's master (forward.go) unless this broker is it; only a failure
// is reported (ownWaiter).
func (r *Replicator) ProposeEvent(q *shards.Queue, data []byte, tag uint64) error {
	g, _ := q.Replicated()
	w := r.ownWaiters[q.Shard()]
	if n := r.node(); n == nil || !n.IsMaster(g) {
		return r.forward(g, data, func(err error) {
			if err != nil {
				w.Committed(tag, err)
			}
		})
	}
	return r.proposeHere(q, data, w, tag)
}

// ownWaiter tells a shard the failure of an owner's event (the shard
// learns its success when it applies it); one per shard.
type ownWaiter struct{ sh *shards.Shard }

func (w *ownWaiter) Committed(tag uint64, err error) {
	if err != nil && tag != 0 {
		w.sh.AcquiresCommitted(tag, groupError(err))
	}
}

// HoldsReplica reports whether this broker holds a replica of group g:
// its consumers of g's queues are served here, not proxied to the
// master (shards/own.go).
func (r *Replicator) HoldsReplica(g uint32) bool {
	n := r.node()
	return n != nil && n.Holds(g)
}

// Applied is shards.Replicator's.
func (r *Replicator) Applied(g uint32) uint64 {
	if n := r.node(); n != nil {
		return n.Applied(g)
	}
	return 0
}

// Self is shards.Replicator's.
func (r *Replicator) Self() uint32 { return r.self }

// Owning is shards.Replicator's.
func (r *Replicator) Owning(g uint32) bool {
	n := r.node()
	return n != nil && n.Owning(g)
}

// Live is shards.Replicator's.
func (r *Replicator) Live(g, b uint32) bool {
	n := r.node()
	return n == nil || n.Live(g, b)
}

// Resync is shards.Replicator's; asked again at the next own event
// if the node's inbox is full.
func (r *Replicator) Resync(g uint32, index uint64) {
	if n := r.node(); n != nil {
		n.Resync(g, index)
	}
}

func (r *Replicator) ProposeDelete(q *shards.Queue) error {
	data := event.AppendDelete(make([]byte, 0, event.HeaderLen+2+len(q.Name)), q.Name)
	return r.propose(q, data, funcWaiter(func(error) {}), 0)
}

func (r *Replicator) Barrier(q *shards.Queue, done func(error)) error {
	return r.propose(q, event.AppendBarrier(make([]byte, 0, event.HeaderLen)), funcWaiter(done), 0)
}

// apply carries a committed group entry to its queue's shard. It runs on
// the group node's goroutine; it waits for room in the shard's ring (a
// shard never waits for the node, so this cannot deadlock). An entry it
// cannot decode is an error, on which the node stops this member of the
// group (groups.NodeConfig.Apply): skipping it would let this broker's
// queues differ from the other members' in silence. (err is named so
// that its bare returns report none.)
func (r *Replicator) apply(g uint32, e wire.GroupEntry) (err error) {
	if len(e.Data) == 0 {
		return // forgotten: an enqueue whose message was removed since, or a removal
	}
	h, _, err := event.ReadHeader(e.Data)
	if err != nil {
		return err
	}
	var nameB []byte
	var seqs []uint64 // a removal's messages
	var stamp event.Stamp
	var enq event.Enqueue
	switch h.Kind {
	case event.KindBarrier:
		var b event.Barrier
		if err := b.Decode(e.Data); err != nil {
			return err
		}
		r.forget(g, e.Index)
		return
	case event.KindDelete:
		var d event.Delete
		if err := d.Decode(e.Data); err != nil {
			return err
		}
		nameB = d.Queue
	case event.KindRemove:
		var rm event.Remove
		if err := rm.Decode(e.Data); err != nil {
			return err
		}
		nameB, seqs = rm.Queue, []uint64{rm.Seq}
	case event.KindRemoves:
		var rm event.Removes
		if err := rm.Decode(e.Data); err != nil {
			return err
		}
		nameB, seqs = rm.Queue, rm.Seqs
		stamp = rm.Stamp
	case event.KindAcquires:
		var a event.Acquires
		if err := a.Decode(e.Data); err != nil {
			return err
		}
		r.applyHandouts(g, e.Index, a.Queue, func(sh *shards.Shard, q *shards.Queue) { sh.ApplyAcquires(q, a.Seqs, a.Window, a.Stamp) })
		return nil
	case event.KindReleases:
		var rl event.Releases
		if err := rl.Decode(e.Data); err != nil {
			return err
		}
		r.applyHandouts(g, e.Index, rl.Queue, func(sh *shards.Shard, q *shards.Queue) { sh.ApplyReleases(q, rl.Seqs, rl.Unseen, rl.Stamp) })
		return nil
	case event.KindOwn:
		var o event.Own
		if err := o.Decode(e.Data); err != nil {
			return err
		}
		r.applyOwn(g, e.Index, &o)
		return nil
	case event.KindWant:
		var w event.Want
		if err := w.Decode(e.Data); err != nil {
			return err
		}
		r.applyWant(g, e.Index, &w)
		return nil
	case event.KindEnqueue:
		if err := enq.Decode(e.Data); err != nil {
			return err
		}
		nameB = enq.Queue
	default:
		return fmt.Errorf("replication: group event of kind %v, which apply does not take", h.Kind)
	}
	if h.Kind == event.KindDelete {
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
		r.dropOwnTrack(g, name)
		if !r.IsMaster(g) {
			for _, seq := range r.wiring.DropReplica(name) {
				r.forget(g, seq)
			}
		}
		return
	}
	removal := h.Kind != event.KindEnqueue
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
	q := r.wiring.Queue(nameB)
	if q == nil && removal {
		return // no copy of the queue here, so none of its messages
	}
	if q == nil {
		var aerr error
		if q, aerr = r.wiring.Adopt(string(nameB)); aerr != nil {
			if shards.CodeOf(aerr) == wire.CodeNotFound {
				// The controller has no such queue: it was deleted after
				// this enqueue was proposed, and the enqueue has no
				// effect.
				r.forget(g, e.Index)
				r.log.Debug("replication: a replicated enqueue for a deleted queue; skipped", "group", g, "index", e.Index, "queue", string(nameB))
				return
			}
			r.log.Warn("replication: a replicated event for a queue this broker cannot find; skipped", "group", g, "index", e.Index, "queue", string(nameB), "err", aerr)
			return
		}
	}
	sh := r.broker.Shards()[q.Shard()]
	if removal {
		call := func(sh *shards.Shard) {
			for _, seq := range seqs {
				sh.ApplyRemove(q, seq)
			}
		}
		if stamp.Broker != 0 {
			call = func(sh *shards.Shard) { sh.ApplyRemovesBy(q, seqs, stamp) }
		}
		// The node's goroutine parks while the ring is full: a shard
		// never waits for the node, so this cannot deadlock.
		_ = sh.PushCall(r.ctx, call) // fails only once the broker closes
		return
	}
	ev := enqueueEventOf(&enq, true)
	// Above the shard's high watermark the log drops the event's data:
	// the body is then its only copy in memory, and the shard may page it
	// out (shards.Shard.ApplyEnqueue).
	var logPos uint64
	if n := r.node(); n != nil {
		logPos = uint64(n.Page(g, e.Index, sh.Paging()))
	}
	// Pushed as a command rather than a call: an enqueue, the bulk of a
	// group's events, allocates no closure.
	if sh.PushApplyEnqueue(r.ctx, q, e.Index, ev.body, ev.expiresAt, ev.producer, ev.producerSeq, logPos) != nil {
		ev.body.Unref() // the broker is closing
	}
	return nil
}

// applyHandouts carries a committed acquires or releases event of queue
// name to its queue's shard, where apply runs (shards.Shard.ApplyAcquires,
// ApplyReleases). The entry has no effect left here once its messages are
// gone, and compaction only passes it once every entry before it, their
// enqueues included, has none: it is retired, its data kept for members
// that lack it.
func (r *Replicator) applyHandouts(g uint32, index uint64, name []byte, apply func(*shards.Shard, *shards.Queue)) {
	r.retire(g, index)
	q := r.wiring.Queue(name)
	if q == nil {
		return // no copy of the queue here, so none of its messages
	}
	_ = r.broker.Shards()[q.Shard()].PushCall(r.ctx, func(sh *shards.Shard) { apply(sh, q) }) // fails only once the broker closes
}

// ownTrack is the last own event of a queue that counted, and the last
// want event of each broker for it: what is still in effect. Every
// member applies the same rule as the shards (an own event counts only
// past the queue's ownership number), so each retires the same entries:
// a superseded one has no effect left, and compaction passes it; the
// one in effect stays, so a member that installs a base keeps it.
type ownTrack struct {
	gen   uint64
	index uint64
	wants map[uint32]uint64 // broker: index of its want in effect
}

func (r *Replicator) ownTrackOf(g uint32, name []byte, make bool) *ownTrack {
	byName := r.owns[g]
	if byName == nil {
		if !make {
			return nil
		}
		if r.owns == nil {
			r.owns = map[uint32]map[string]*ownTrack{}
		}
		byName = map[string]*ownTrack{}
		r.owns[g] = byName
	}
	t := byName[string(name)]
	if t == nil && make {
		t = &ownTrack{}
		byName[string(name)] = t
	}
	return t
}

// applyOwn applies a committed own event, on the node's goroutine.
func (r *Replicator) applyOwn(g uint32, index uint64, o *event.Own) {
	t := r.ownTrackOf(g, o.Queue, true)
	if o.Gen <= t.gen {
		r.retire(g, index) // void
	} else {
		if t.index != 0 {
			r.retire(g, t.index)
		}
		t.gen, t.index = o.Gen, index
		if i, ok := t.wants[o.Owner]; ok && o.Owner != 0 {
			r.retire(g, i) // the new owner wants it no more (shards.Shard.ApplyOwn)
			delete(t.wants, o.Owner)
		}
	}
	q := r.wiring.Queue(o.Queue)
	if q == nil {
		return
	}
	own := *o
	own.Queue = []byte(q.Name) // o aliases the entry
	_ = r.broker.Shards()[q.Shard()].PushCall(r.ctx, func(sh *shards.Shard) { sh.ApplyOwn(q, &own, index) })
}

// applyWant applies a committed want event, on the node's goroutine.
func (r *Replicator) applyWant(g uint32, index uint64, w *event.Want) {
	t := r.ownTrackOf(g, w.Queue, true)
	if prev := t.wants[w.Broker]; prev != 0 {
		r.retire(g, prev)
	}
	if w.Withdraw {
		delete(t.wants, w.Broker)
		r.retire(g, index)
	} else {
		if t.wants == nil {
			t.wants = map[uint32]uint64{}
		}
		t.wants[w.Broker] = index
	}
	q := r.wiring.Queue(w.Queue)
	if q == nil {
		return
	}
	b, withdraw, tag := w.Broker, w.Withdraw, w.Stamp.Tag
	_ = r.broker.Shards()[q.Shard()].PushCall(r.ctx, func(sh *shards.Shard) { sh.ApplyWant(q, b, withdraw, tag, index) })
}

// dropOwnTrack retires what is in effect of queue name's ownership: the
// queue is deleted.
func (r *Replicator) dropOwnTrack(g uint32, name string) {
	t := r.ownTrackOf(g, []byte(name), false)
	if t == nil {
		return
	}
	if t.index != 0 {
		r.retire(g, t.index)
	}
	for _, i := range t.wants {
		r.retire(g, i)
	}
	delete(r.owns[g], name)
}

// ResetOwnership forgets what applyOwn tracked of group g: the member
// applies its log again (a master stepping down, an install). It runs
// on the node's goroutine (groups.ManagerConfig.OnStepDown).
func (r *Replicator) ResetOwnership(g uint32) { delete(r.owns, g) }

// SetCallbacks fills in cfg's callbacks that are the replicator's: the
// apply of committed entries, the group count, the forwards other brokers
// send this one as a master (forward.go), and which events a handover
// holds back. r may be nil (the broker has not connected its shards to
// the groups): entries are then applied to nothing and forwards refused
// as the broker starting.
func (r *Replicator) SetCallbacks(cfg *groups.ManagerConfig) {
	// A handover holds back publishes only (this file's events).
	cfg.HandoverHolds = event.IsEnqueue
	cfg.Apply = func(g uint32, e wire.GroupEntry) error {
		if r != nil {
			return r.apply(g, e)
		}
		return nil
	}
	cfg.OnGroupCount = func(n uint32) {
		if r != nil {
			r.groups.CompareAndSwap(0, n)
		}
	}
	cfg.OnForward = func(from, g uint32, event []byte, reply groups.ForwardReply) {
		if r == nil {
			reply.Send(wire.CodeResourceLimit, "the broker is starting; retry")
			return
		}
		r.serveForward(from, g, event, reply)
	}
	cfg.ForwardError = forwardError
}

// Skipped drops the data of an enqueue the shard skipped as a producer's
// duplicate, as a removal does for its message's enqueue (forget): a
// member that applies the log again after a step-down then passes over
// it rather than enqueue it with a reset producer table, and compaction
// may drop it. It runs on the shard goroutine: the node does it later,
// and not at all if its inbox is full (the entry then stays as it was).
func (r *Replicator) Skipped(q *shards.Queue, seq uint64) {
	g, ok := q.Replicated()
	n := r.node()
	if !ok || n == nil {
		return
	}
	n.ForgetLater(g, seq)
}

// retire marks an applied group entry whose effect here is gone.
func (r *Replicator) retire(g uint32, index uint64) {
	if n := r.node(); n != nil {
		n.Retire(g, index)
	}
}

// forget drops the data of an applied group entry whose effect is gone.
func (r *Replicator) forget(g uint32, index uint64) {
	if n := r.node(); n != nil {
		n.Forget(g, index)
	}
}

// RestoreDone ends the wiring's restore: the local queues it found are
// written down in one batch.
func (r *Replicator) RestoreDone() error {
	r.restoring.Store(false)
	return r.local.flush()
}

// New connects the shards to the replication groups; call it before the
// wiring is restored, so restored durable queues are replicated, and
// RestoreDone after. It reads the cluster's group count, retrying for up
// to ReadTimeout (0 if the cluster is not initialised yet; queues declared
// before "berthctl cluster init" stay on their broker).
func New(cfg Config) (*Replicator, error) {
	local, err := loadLocalQueues(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	foreign, err := loadQueueList(cfg.DataDir, foreignQueuesFile)
	if err != nil {
		local.close()
		return nil, err
	}
	// A name on both lists is this broker's own (a wiring pass before the
	// fix in wiring.Sync could write its own declare down as foreign):
	// it is restored here.
	if err := ownOffForeign(local, foreign); err != nil {
		local.close()
		foreign.close()
		return nil, err
	}
	r := &Replicator{broker: cfg.Broker, wiring: cfg.Wiring, lanes: cfg.Lanes, controller: cfg.Controller, manager: cfg.Manager,
		self: cfg.Self, ctx: cfg.Context, timeout: cfg.ReadTimeout, log: cfg.Logger, local: local, foreign: foreign}
	r.restoring.Store(true) // until RestoreDone
	for _, sh := range cfg.Broker.Shards() {
		r.waiters = append(r.waiters, &shardWaiter{sh})
		r.acqWaiters = append(r.acqWaiters, &acqWaiter{sh})
		r.ownWaiters = append(r.ownWaiters, &ownWaiter{sh})
	}
	r.windows = make([]journal.Window, len(r.waiters))
	cfg.Broker.SetReplicator(r)
	ctx, cancel := context.WithTimeout(context.Background(), r.timeout)
	defer cancel()
	for {
		info, err := r.controller.GetClusterInfo(ctx, ctlapi.ReadFollower)
		if err == nil {
			// Known at start: the queues on the list (if any) stay
			// local; the rest are restored into their groups.
			r.groups.Store(info.Config.Groups)
			if n := local.len(); n > 0 {
				r.log.Info("replication: durable queues declared before the cluster had groups stay on this broker", "queues", n)
			}
			return r, nil
		}
		if ctx.Err() != nil {
			r.log.Warn("replication: cluster group count unknown at start; durable queues restored now are not replicated", "err", err)
			return r, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// ownOffForeign takes off the foreign list, durably, every name the
// local list holds.
func ownOffForeign(local, foreign *localQueues) error {
	return foreign.removeMissing(func(name string) bool { return !local.has(name) })
}

// Close closes the lists of queues kept local; call it once the shards
// and the groups have stopped.
func (r *Replicator) Close() {
	r.local.close()
	r.foreign.close()
}

func (r *Replicator) String() string { return fmt.Sprintf("replicator(%d groups)", r.groups.Load()) }
