package shards

import "time"

// Delayed delivery on a shard. A queue holds its delayed messages itself
// (queueBusy.delayed, ordered by deliver-at time) and makes them ready only
// when an EvPromote says their time came; the shard decides when that is.
// It keeps one timer structure for all its queues:
//
//   - timers, a heap of (deliver-at, queue): a queue is in it under the
//     earliest deliver-at of its delayed messages (queueRare.timerAt). A new
//     delayed message earlier than that adds an entry; entries left stale
//     (the message was purged, or an earlier entry was added since) are
//     dropped when they come up. There are never more entries than
//     delayed messages plus queues.
//   - wake, one time.Timer armed for the heap's earliest time. When it
//     fires it pushes a wake-up (opWake) into the shard's ring, and the
//     shard promotes every due queue. The 100 ms tick does the same, so a
//     wake-up lost to a full ring costs at most a tick.
//
// No goroutine or timer exists per message or per queue: a million delayed
// messages cost their index entries (Entry plus a 16-byte heap slot) and,
// once the memory budget's high watermark is passed, nothing more (their
// bodies are paged out like any other).
type shardTimers struct {
	heap   timerHeap
	wake   *time.Timer
	wakeAt int64 // the time wake is armed for; 0 = not armed
}

type timerEntry struct {
	at int64
	q  *Queue
}

// timerHeap is a min-heap (heap.go) by time.
type timerHeap []timerEntry

func timerLess(a, b timerEntry) bool { return a.at < b.at }

// schedule notes that q holds a delayed message due at at.
func (s *Shard) schedule(q *Queue, at int64) {
	rs := q.rareState()
	if rs.timerAt != 0 && rs.timerAt <= at {
		return
	}
	rs.timerAt = at
	s.timers.heap = heapPush(s.timers.heap, timerEntry{at: at, q: q}, timerLess)
	s.armWake()
}

// armWake arms the wake-up timer for the earliest entry, unless it is
// armed for that time or earlier already.
func (s *Shard) armWake() {
	t := &s.timers
	if len(t.heap) == 0 {
		return
	}
	at := t.heap[0].at
	if t.wakeAt != 0 && t.wakeAt <= at {
		return
	}
	t.wakeAt = at
	d := time.Duration(at - time.Now().UnixNano())
	if t.wake == nil {
		t.wake = time.AfterFunc(d, s.onWake)
		return
	}
	t.wake.Reset(d)
}

// onWake runs on the timer's goroutine.
func (s *Shard) onWake() { s.TryPush(wakeCommand(time.Now().UnixNano())) }

// fireTimers promotes the delayed messages due as of s.now in every queue
// whose time came, and arms the timer for the next.
func (s *Shard) fireTimers() {
	t := &s.timers
	if t.wakeAt != 0 && t.wakeAt <= s.now {
		t.wakeAt = 0 // fired (or about to, harmlessly)
	}
	for len(t.heap) > 0 && t.heap[0].at <= s.now {
		var te timerEntry
		te, t.heap = heapRemove(t.heap, 0, timerLess)
		q := te.q
		rs := q.rare // made by schedule
		if q.deleted {
			rs.timerAt = 0
			continue
		}
		if te.at != rs.timerAt {
			continue // stale: an earlier entry was added and handled
		}
		ev := Event{Kind: EvPromote, Now: s.now}
		_ = q.Apply(&ev, s)
		s.watchHead(q) // a promoted message may be the head now
		rs.timerAt = 0
		if next := q.NextDeliverAt(); next != 0 {
			rs.timerAt = next
			t.heap = heapPush(t.heap, timerEntry{at: next, q: q}, timerLess)
		}
		if len(q.consumers) > 0 {
			s.markDirty(q)
		}
	}
	s.armWake()
}

func (s *Shard) stopTimers() {
	if s.timers.wake != nil {
		s.timers.wake.Stop()
	}
}
