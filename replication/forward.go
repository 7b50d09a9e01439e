package replication

// Forwarding to group masters. A broker that takes a publish for a
// replicated queue whose group it does not master (a follower, or a broker
// outside the group's replica set) forwards the enqueue event to the
// group's master (replication/groups forward.go), and completes the client's
// command with the master's answer: once the event committed and applied
// on the master, or with its refusal (queue full, fewer in sync than
// min-sync-replicas, no longer master). A forward whose outcome is unknown
// (the master died or stopped answering with it in flight) fails with
// outcome-unknown (unavailable, with a text saying so, in a session before
// 1.4); the event may have committed, so a retry without a producer id may
// duplicate it. While the
// group has no master this broker knows of, publishes fail with
// unavailable too; a full forwarding window with resource-limit.
//
// Enqueues are forwarded, and the deletion of a replicated queue
// (fwdDelete: a request, not a group log event): the master deletes it as
// if its own client had, so its consumers are cancelled and its followers
// drop their copies through the group log. A delete done at a follower
// instead left the master serving a queue the controller had deleted.
// Removes and barriers come from the master's consumers, among them
// those other brokers proxy to it (server/proxy.go).

import (
	"errors"
	"fmt"

	groupevent "github.com/berthmq/berth/replication/event"
	"github.com/berthmq/berth/replication/groups"
	"github.com/berthmq/berth/shards"
	"github.com/berthmq/berth/wire"
)

// forwardError is the error a forward's done gets from a master's
// refusal: the master's code and text, which name the group and queue.
func forwardError(code wire.ErrorCode, text string) error {
	return shards.Errorf(code, "%s", text)
}

// forward sends a replicated queue's enqueue event to its group's master.
// It runs on the shard goroutine and never blocks.
func (r *Replicator) forward(g uint32, data []byte, done func(error)) error {
	return r.forwardEncoded(g, len(data), func(dst []byte) []byte { return append(dst, data...) }, done)
}

// forwardEncoded is forward with the event, of n bytes, written by enc
// straight into the forwarding connection's buffer
// (groups.Forwarder.ForwardEncoded).
func (r *Replicator) forwardEncoded(g uint32, n int, enc func([]byte) []byte, done func(error)) error {
	m := r.manager()
	if m == nil {
		return errGroupsStarting
	}
	v := m.View()
	if v == nil || int(g) >= len(v.Groups) {
		return errGroupsStarting
	}
	master := v.Groups[g].Master
	switch {
	case master == 0:
		return shards.Errorf(wire.CodeUnavailable, "group %d has no master now (an election is under way); retry", g)
	case master == r.self:
		return shards.Errorf(wire.CodeUnavailable, "this broker is taking over as master of group %d; retry", g)
	}
	addr := v.Peer[master]
	if addr == "" {
		return shards.Errorf(wire.CodeUnavailable, "the peer address of group %d's master, broker %d, is not known yet; retry", g, master)
	}
	err := m.Forwarder().ForwardEncoded(master, addr, g, n, enc, func(err error) { done(forwardOutcome(g, master, err, true)) })
	return forwardOutcome(g, master, err, false)
}

// forwardOutcome gives a forward's failure a wire code; sent says whether
// the event may have reached the master (Forward's own error means it
// was not sent, and so does a forward failed by a dial).
func forwardOutcome(g, master uint32, err error, sent bool) error {
	var lost *groups.ForwardLostError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &lost) && (!sent || lost.NotSent):
		return shards.Errorf(wire.CodeUnavailable, "group %d's master, broker %d, cannot be reached (%v); the command was not taken; retry", g, master, lost.Err)
	case errors.As(err, &lost):
		return shards.Errorf(wire.CodeOutcomeUnknown, "forward to group %d's master, broker %d, lost (%v); the command may or may not have taken effect (a retry without a producer id may do it twice)", g, master, lost.Err)
	case errors.Is(err, groups.ErrForwardBusy):
		return shards.Errorf(wire.CodeResourceLimit, "too many publishes waiting for group %d's master, broker %d; retry", g, master)
	}
	return err
}

// serveForward takes an event another broker forwards to this one as its
// group's master, on the forwarding connection's goroutine: it checks the
// queue on its shard (reject-publish), proposes the event and answers when
// it committed. event is this function's to keep (ForwardHandler).
func (r *Replicator) serveForward(from, g uint32, event []byte, reply groups.ForwardReply) {
	refuse := func(code wire.ErrorCode, format string, args ...any) {
		reply.Send(code, fmt.Sprintf(format, args...))
	}
	if len(event) > 0 && (event[0] == fwdDelete || event[0] == fwdPurge) {
		var rd wire.Reader
		rd.Reset(event[1:])
		r.serveAtMaster(g, event[0], &rd, reply)
		return
	}
	if k, err := groupevent.KindOf(event); err == nil && k != groupevent.KindEnqueue {
		r.serveOwnerEvent(from, g, k, event, reply)
		return
	}
	var ev groupevent.Enqueue
	if err := ev.Decode(event); err != nil {
		if errors.Is(err, groupevent.ErrUnknownKind) || errors.Is(err, groupevent.ErrWrongKind) {
			refuse(wire.CodeInvalid, "only enqueues, queue deletions and purges are forwarded")
		} else {
			refuse(wire.CodeMalformed, "malformed forwarded enqueue: %v", err)
		}
		return
	}
	name, props, payload, producer, producerSeq := ev.Queue, ev.Props, ev.Payload, ev.Producer, ev.ProducerSeq
	n := r.node()
	if n == nil || !n.IsMaster(g) {
		refuse(wire.CodeUnavailable, "broker %d is not the master of group %d (any more); retry", r.self, g)
		return
	}
	q := r.wiring.Queue(name)
	if q == nil {
		var err error
		if q, err = r.wiring.Adopt(string(name)); err != nil {
			refuse(shards.CodeOf(err), "queue %q: %v", name, err)
			return
		}
	}
	if qg, ok := q.Replicated(); !ok || qg != g {
		refuse(wire.CodeInvalid, "queue %q is not replicated in group %d", name, g)
		return
	}
	// An event in the format this broker writes enters the log as it
	// came, not copied (the reader gave it to us); one in the older
	// format is encoded again, and enters the log in the new one.
	data := event
	if h, _, _ := groupevent.ReadHeader(event); h.Legacy || h.Version != groupevent.EnqueueVersion || ev.Size() != len(event) {
		data = groupevent.AppendEnqueue(make([]byte, 0, ev.Size()), &ev)
	}
	size := len(props) + len(payload)
	call := func(sh *shards.Shard) {
		// Admitted as the master's own clients' publishes are.
		if dup, err := q.AdmitReplicated(producer, producerSeq, size); dup || err != nil {
			sendOutcome(reply, err)
			return
		}
		err := r.proposeHere(q, data, funcWaiter(func(err error) { sendOutcome(reply, err) }), 0)
		if err != nil {
			sendOutcome(reply, err)
		}
	}
	// Through the shard's lane (lanes.go), never parking this reader: a
	// shard that stays busy holds up only the forwards for it.
	if !r.lanes.TryPush(q.Shard(), shards.CallCommand(call)) {
		if r.ctx.Err() != nil {
			refuse(wire.CodeShutdown, "the broker is shutting down; the publish was not taken")
			return
		}
		refuse(wire.CodeResourceLimit, "shard %d of broker %d, the master, has %d forwarded commands waiting; the publish was not taken; retry", q.Shard(), r.self, LaneMax)
	}
}

// serveOwnerEvent proposes an event that a queue's owner other than the
// master forwards (shards/own.go): a stamped acquires, releases, removes
// or own event, or a want, each of the forwarding broker's own. It is
// proposed as it is; every member applies the same rules to it, so the
// master checks only that it is well formed and the sender's. data is
// this function's to keep (ForwardHandler).
func (r *Replicator) serveOwnerEvent(from, g uint32, k groupevent.Kind, data []byte, reply groups.ForwardReply) {
	var ev groupevent.Event
	if err := groupevent.Decode(data, &ev); err != nil {
		reply.Send(wire.CodeMalformed, fmt.Sprintf("malformed forwarded %v event: %v", k, err))
		return
	}
	var by uint32
	switch k {
	case groupevent.KindAcquires:
		by = ev.Acquires.Stamp.Broker
	case groupevent.KindReleases:
		by = ev.Releases.Stamp.Broker
	case groupevent.KindRemoves:
		by = ev.Removes.Stamp.Broker
	case groupevent.KindOwn:
		by = ev.Own.Stamp.Broker
	case groupevent.KindWant:
		by = ev.Want.Broker
	default:
		reply.Send(wire.CodeInvalid, fmt.Sprintf("a %v event is not forwarded", k))
		return
	}
	if by != from {
		reply.Send(wire.CodeNotAllowed, fmt.Sprintf("a forwarded %v event of broker %d, from broker %d: a broker forwards only its own", k, by, from))
		return
	}
	n := r.node()
	if n == nil || !n.IsMaster(g) {
		reply.Send(wire.CodeUnavailable, fmt.Sprintf("broker %d is not the master of group %d (any more); retry", r.self, g))
		return
	}
	err := n.ProposeAsync(g, data, funcWaiter(func(err error) { sendOutcome(reply, err) }), 0)
	if errors.Is(err, groups.ErrBusy) {
		err = shards.Errorf(wire.CodeResourceLimit, "group %d is busy; retry", g)
	}
	if err != nil {
		sendOutcome(reply, groupError(err))
	}
}

// Requests forwarded to a replicated queue's master, never written to a
// group log: flags u8, name str16. fwdDelete deletes the queue (flags bit
// 0 if-unused, bit 1 if-empty); fwdPurge purges it (no flags), since a
// follower purging its own copy would only make that copy differ from
// the master's.
const (
	fwdDelete byte = 'x'
	fwdPurge  byte = 'p'
)

// serveAtMaster deletes or purges a replicated queue at another broker's
// request, as this group's master, off the forwarding connection's
// goroutine (a deletion waits for the controller).
func (r *Replicator) serveAtMaster(g uint32, kind byte, rd *wire.Reader, reply groups.ForwardReply) {
	flags := rd.U8()
	name := string(rd.Str(wire.NameLenMax))
	if rd.Err() != nil {
		reply.Send(wire.CodeMalformed, "malformed forwarded queue command")
		return
	}
	if n := r.node(); n == nil || !n.IsMaster(g) {
		reply.Send(wire.CodeUnavailable, fmt.Sprintf("broker %d is not the master of group %d (any more); retry", r.self, g))
		return
	}
	go func() {
		var err error
		if kind == fwdPurge {
			_, err = r.wiring.Purge(name)
		} else {
			_, err = r.wiring.DeleteQueue(name, flags&1 != 0, flags&2 != 0)
		}
		sendOutcome(reply, err)
	}()
}

// DeleteAtMaster deletes the replicated queue name at its group's master
// when another broker masters it, and waits for the answer; done is false
// when this broker should delete it itself (not replicated, or mastered
// here). It may block: the connection's management goroutine runs it.
func (r *Replicator) DeleteAtMaster(name string, ifUnused, ifEmpty bool) (done bool, err error) {
	var flags byte
	if ifUnused {
		flags |= 1
	}
	if ifEmpty {
		flags |= 2
	}
	return r.atMaster(fwdDelete, flags, name)
}

// PurgeAtMaster is DeleteAtMaster for a purge.
func (r *Replicator) PurgeAtMaster(name string) (done bool, err error) {
	return r.atMaster(fwdPurge, 0, name)
}

func (r *Replicator) atMaster(kind, flags byte, name string) (done bool, err error) {
	q := r.wiring.Queue([]byte(name))
	if q == nil {
		return false, nil
	}
	g, ok := q.Replicated()
	if !ok || r.IsMaster(g) {
		return false, nil
	}
	data := wire.AppendStr([]byte{kind, flags}, name)
	answer := make(chan error, 1)
	if err := r.forward(g, data, func(err error) { answer <- err }); err != nil {
		return true, err
	}
	select {
	case err := <-answer:
		return true, err
	case <-r.ctx.Done():
		// Sent, not answered: not a shutdown's "not taken".
		return true, shards.Errorf(wire.CodeOutcomeUnknown, "the broker is shutting down with the command at group %d's master; its outcome is unknown", g)
	}
}

// sendOutcome answers a forward with a proposal's outcome.
func sendOutcome(reply groups.ForwardReply, err error) {
	if err == nil {
		reply.Send(wire.CodeOK, "")
		return
	}
	var se *shards.Error
	if errors.As(err, &se) {
		reply.Send(se.Code, se.Text)
		return
	}
	reply.Send(shards.CodeOf(err), err.Error())
}
