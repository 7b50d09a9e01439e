package server

// Consumers ended by the broker: by their queue's deletion, or by this
// broker's stepping down as the master of their replicated queue's group.
//
// A queue deleted by another
// client (DELETE, or the admin API) takes its consumers with it, in every
// session. A session of protocol 1.3 or later is told with a CANCELLED
// (code not-found) for each of its consumers of the queue; an older one
// gets nothing, as before 1.3. The shards own the consumers, so the
// server keeps its own index of them by queue, written at SUBSCRIBE,
// CANCEL and session end (rare, under one mutex), and read once per
// deletion. The CANCELLEDs go out after the shard dropped the queue and
// flushed what it had delivered (shards.Broker.Call), so no DELIVER of
// the queue follows them on the connection.

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/berthmq/berth/shards"
	"github.com/berthmq/berth/wire"
)

// consumerRef is one consumer: of a client session (cs), or of a proxied
// session on this master (p), whose client is on another broker.
type consumerRef struct {
	cs *connState
	p  *proxied
	id uint32
}

// queueConsumers indexes the consumers by their queue. A consumer whose
// SUBSCRIBE failed in its shard leaves it when the shard says so
// (consumerGone); a CANCELLED sent in between, if its queue is deleted
// meanwhile, names a consumer the client no longer has, which the client
// ignores.
type queueConsumers struct {
	mu      sync.Mutex
	byQueue map[*shards.Queue]map[consumerRef]struct{}
}

func (s *Server) noteConsumer(q *shards.Queue, ref consumerRef) {
	t := &s.queueConsumers
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.byQueue == nil {
		t.byQueue = map[*shards.Queue]map[consumerRef]struct{}{}
	}
	m := t.byQueue[q]
	if m == nil {
		m = map[consumerRef]struct{}{}
		t.byQueue[q] = m
	}
	m[ref] = struct{}{}
}

// consumerGone drops the connection's record of consumer id, which its
// shard forgot for good (shards.Session.OnConsumerGone): its SUBSCRIBE
// failed, or it was cancelled or its queue deleted with nothing left to
// settle. Without this a session that subscribes and cancels (a reply
// queue per request) or retries a refused subscribe kept an entry per
// consumer until it ended. It runs on the connection's owner.
func (s *Server) consumerGone(cs *connState, id uint32) {
	if cs.closing.Load() {
		return
	}
	cs.ss.ConsumerGone(id)
}

func (s *Server) forgetConsumer(q *shards.Queue, ref consumerRef) {
	t := &s.queueConsumers
	t.mu.Lock()
	defer t.mu.Unlock()
	if m := t.byQueue[q]; m != nil {
		delete(m, ref)
		if len(m) == 0 {
			delete(t.byQueue, q)
		}
	}
}

// queueDropped tells the sessions with a consumer of q, which was just
// deleted, that it ended. It runs after the shard dropped q.
func (s *Server) queueDropped(q *shards.Queue) {
	if r := s.replicator; r != nil {
		if err := r.RemoveLocal(q.Name); err != nil {
			s.log.Error("server: taking a deleted queue off the local list failed; a queue of its name declared later stays local", "queue", q.Name, "err", err)
		}
	}
	t := &s.queueConsumers
	t.mu.Lock()
	refs := t.byQueue[q]
	delete(t.byQueue, q)
	t.mu.Unlock()
	if len(refs) == 0 {
		return
	}
	reason := fmt.Sprintf("queue %q was deleted", q.Name)
	for ref := range refs {
		switch {
		case ref.cs != nil:
			// The connection forgets the consumer (its shard did), and a
			// 1.3 client is told.
			cs, id := ref.cs, ref.id
			_ = cs.t.runOwned(func() {
				if cs.closing.Load() {
					return
				}
				cs.ss.Forget(id)
				if cs.version >= wire.VersionCancelled {
					cs.t.writeOwned(wire.AppendCancelled(nil, cs.version, id, wire.CodeNotFound, reason))
				}
			})
		case ref.p != nil:
			// Through the proxying broker, which forgets the consumer as
			// the frame passes (proxyOutput).
			if v := ref.p.sess.Version; v >= wire.VersionCancelled {
				_ = ref.p.sess.Out.WriteAsync([][]byte{wire.AppendCancelled(nil, v, ref.id, wire.CodeNotFound, reason)}, func() {})
			}
		}
	}
}

// groupSteppedDown ends the consumers served here (not proxied) of the
// queues of group g, which this broker no longer masters: the new master
// delivers what they held. A 1.3 session's consumer is cancelled in its
// shard and the session told with a CANCELLED (unavailable), after the
// shard flushed what it had delivered; the session forgets the consumer,
// so a later settle of it fails not-found. An older session, which has no
// CANCELLED, is closed with shutdown (it used to be left receiving
// nothing more); what it held goes back as at any close. It waits on the
// shards: run it on a goroutine of its own.
func (s *Server) groupSteppedDown(g uint32) {
	type ended struct {
		q   *shards.Queue
		ref consumerRef
	}
	var list []ended
	old := map[*connState]bool{}
	t := &s.queueConsumers
	t.mu.Lock()
	for q, refs := range t.byQueue {
		if qg, ok := q.Replicated(); !ok || qg != g {
			continue
		}
		for ref := range refs {
			if ref.cs == nil {
				continue // proxied ones end at the proxying broker (proxyViewChanged)
			}
			if ref.cs.version < wire.VersionCancelled {
				old[ref.cs] = true
				delete(refs, ref)
				continue
			}
			list = append(list, ended{q, ref})
			delete(refs, ref)
		}
		if len(refs) == 0 {
			delete(t.byQueue, q)
		}
	}
	t.mu.Unlock()
	reason := fmt.Sprintf("broker %d is no longer the master of the consumer's queue (group %d); subscribe again", s.brokerID, g)
	for cs := range old {
		_ = cs.t.send(wire.AppendClose(nil, cs.version, wire.CodeShutdown, reason), true)
	}
	if len(list) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	shardList := s.broker.Shards()
	flush := map[int]bool{}
	for _, e := range list {
		sess := e.ref.cs.sessAt.Load()
		if sess == nil || e.ref.cs.closing.Load() {
			continue
		}
		// No command id: nothing answers it.
		if shardList[e.q.Shard()].Push(ctx, shards.Cancel{Sess: sess, ConsumerID: e.ref.id}.Command()) == nil {
			flush[e.q.Shard()] = true
		}
	}
	for i := range flush {
		_ = s.broker.Call(shardList[i], func(*shards.Shard) {}) // the cancels ran and the deliveries before them went out
	}
	for _, e := range list {
		cs, id := e.ref.cs, e.ref.id
		_ = cs.t.runOwned(func() {
			if cs.closing.Load() {
				return
			}
			cs.ss.Forget(id)
			cs.t.writeOwned(wire.AppendCancelled(nil, cs.version, id, wire.CodeUnavailable, reason))
		})
	}
}
