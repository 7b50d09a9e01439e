package server

import (
	"context"
	"sync"
	"time"

	"github.com/berthmq/berth/shards"
	"github.com/berthmq/berth/wire"
)

// Bounds on what one connection may hold of the broker (see
// docs/BENCHMARKS.md, "Hostile clients", for what they cost).
//
// A connection whose client does not read its socket holds what the
// broker writes to it: gnet's outbound buffer (or the TLS writer's
// queue) has no bound of its own. Each session carries a cap,
// Config.OutboundMax (shards.Session.OutMax): past it the shards hand the
// session's consumers nothing more (the messages stay in the queue for
// its other consumers), the connection takes no more frames from its
// client (whose answers would pile up too), and once it drains to half
// the cap it is resumed (stallWatch checks it within a millisecond or so,
// the heartbeat scan every 25 ms at most). A connection over its cap for
// Config.OutboundTimeout is closed, and its session ends: its unsettled
// messages go back to their queues. The scan also sums what every
// connection holds for the memory budget (shards.Broker.SetOutbound).
//
// The scan (Server.heartbeats) also closes connections that have not
// finished their login within Config.HandshakeTimeout: a client that
// opens a connection and sends a HELLO byte by byte, or nothing, holds a
// connection and its buffers for no one.
const (
	OutboundMaxDefault      = 4 << 20
	OutboundTimeoutDefault  = 30 * time.Second
	HandshakeTimeoutDefault = 10 * time.Second
)

// outboundDue reports whether the connection has a check of its outbound
// bytes due: it is over its cap, or holds bytes whose figure may be stale
// (gnet's buffer drains without telling anyone); the heartbeat goroutine
// calls it.
func (cs *connState) outboundDue() bool {
	sess := cs.sessAt.Load()
	if sess == nil {
		return false
	}
	return sess.StalledSince() != 0 || cs.readStalled.Load() != 0 || sess.OutBuffered.Load() > 0
}

// outPendingOwned refreshes what the transport holds and returns the
// session's pending bytes; on the connection's owner.
func (cs *connState) outPendingOwned() int64 {
	cs.sess.OutBuffered.Store(cs.t.outBuffered())
	return cs.sess.OutPending()
}

// overOutbound reports whether the session is over its cap, on the
// owner; then the connection takes no frames until it drains.
func (cs *connState) overOutbound() bool {
	if cs.sess == nil || cs.sess.OutMax == 0 || cs.outPendingOwned() <= cs.sess.OutMax {
		if cs.readStalled.Load() != 0 {
			cs.readStalled.Store(0)
		}
		return false
	}
	if cs.readStalled.Load() == 0 {
		cs.readStalled.Store(time.Now().UnixNano())
		cs.s.stalls.add(cs)
	}
	return true
}

// checkOutbound runs on the connection's owner: it refreshes the
// session's OutBuffered and, for a connection over its cap, resumes the
// session once the connection drained to half the cap, or closes it once
// it has been over for the timeout.
func (cs *connState) checkOutbound(now int64) {
	defer cs.checking.Store(false)
	sess := cs.sess
	if cs.closing.Load() || sess == nil {
		return
	}
	pending := cs.outPendingOwned()
	since := sess.StalledSince()
	if r := cs.readStalled.Load(); r != 0 && (since == 0 || r < since) {
		since = r
	}
	if since == 0 {
		return
	}
	if pending <= sess.OutMax/2 {
		if sess.StalledSince() != 0 {
			sess.ClearStalled()
			cs.resumeShards()
		}
		if cs.readStalled.Load() != 0 {
			cs.readStalled.Store(0)
			cs.t.wake()
		}
		return
	}
	if now-since > int64(cs.s.cfg.OutboundTimeout) {
		cs.closing.Store(true)
		cs.s.metrics.outboundTimeouts.Inc()
		cs.s.log.Info("server: closing a connection that did not read what was written to it",
			"remote", addrString(cs), "pending_bytes", sess.OutPending(), "over_cap_for", time.Duration(now-since).String())
		cs.t.abort()
	}
}

// resumeShards tells every shard with a consumer of the session to
// deliver to it again. A full ring is waited for off the owner (Push);
// the scan sees StalledSince again if a shard holds back anew.
func (cs *connState) resumeShards() {
	var seen [64]bool
	var list []int
	sess, shardList := cs.sess, cs.s.broker.Shards()
	cs.ss.EachShard(func(sh int) {
		if sh < len(seen) && seen[sh] {
			return
		}
		if sh < len(seen) {
			seen[sh] = true
		}
		if !shardList[sh].TryPush(shards.Resume{Sess: sess}.Command()) {
			list = append(list, sh)
		}
	})
	if len(list) == 0 {
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for _, sh := range list {
			_ = shardList[sh].Push(ctx, shards.Resume{Sess: sess}.Command())
		}
	}()
}

// handshakeExpired closes a connection that has not logged in within the
// handshake timeout; the heartbeat goroutine calls it.
func (cs *connState) handshakeExpired(now int64) bool {
	if cs.helloVer.Load() != 0 || cs.closing.Load() || now-cs.openedAt <= int64(cs.s.cfg.HandshakeTimeout) {
		return false
	}
	cs.closing.Store(true)
	cs.s.metrics.handshakeTimeouts.Inc()
	frame := wire.AppendClose(nil, wire.Current, wire.CodeHeartbeatTimeout,
		"no login within "+cs.s.cfg.HandshakeTimeout.String())
	_ = cs.t.send(frame, true)
	return true
}

// stallWatch checks the connections that just went over their cap soon
// and often, backing off while they stay over, so that a consumer that
// fell behind for a moment is resumed within about a millisecond of
// draining, not at the next heartbeat scan (up to 25 ms): gnet tells no
// one when a connection's outbound buffer drains. The scan still checks
// every stalled connection and closes those over the cap for too long.
type stallWatch struct {
	sync.Mutex
	conns map[*connState]*stallEntry
	kick  chan struct{} // one slot: a connection was added
}

type stallEntry struct {
	next     time.Time
	interval time.Duration
}

const (
	stallCheckFirst = 250 * time.Microsecond
	stallCheckMax   = heartbeatScanMax
)

func (w *stallWatch) add(cs *connState) {
	w.Lock()
	if w.conns == nil {
		w.conns = map[*connState]*stallEntry{}
	}
	if _, ok := w.conns[cs]; !ok {
		w.conns[cs] = &stallEntry{next: time.Now().Add(stallCheckFirst), interval: stallCheckFirst}
		cs.s.metrics.outboundStalls.Inc()
	}
	w.Unlock()
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// run checks the noted connections until stop closes.
func (w *stallWatch) run(stop <-chan struct{}) {
	var due []*connState
	for {
		select {
		case <-stop:
			return
		case <-w.kick:
		}
		for {
			w.Lock()
			now := time.Now()
			wait := stallCheckMax
			due = due[:0]
			for cs, e := range w.conns {
				sess := cs.sessAt.Load()
				if cs.closing.Load() || sess == nil || (sess.StalledSince() == 0 && cs.readStalled.Load() == 0) {
					delete(w.conns, cs) // resumed or gone
					continue
				}
				if !now.Before(e.next) {
					due = append(due, cs)
					e.interval = min(2*e.interval, stallCheckMax)
					e.next = now.Add(e.interval)
				}
				wait = min(wait, e.next.Sub(now))
			}
			left := len(w.conns)
			w.Unlock()
			for _, cs := range due {
				if !cs.checking.Swap(true) {
					n := now.UnixNano()
					if cs.t.runOwned(func() { cs.checkOutbound(n) }) != nil {
						cs.checking.Store(false)
					}
				}
			}
			if left == 0 {
				break
			}
			select {
			case <-stop:
				return
			case <-time.After(wait):
			}
		}
	}
}
