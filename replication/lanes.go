package replication

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/berthmq/berth/shards"
)

// Lanes: what the readers of peer connections hand to the shards (the
// enqueues other brokers forward to this master, the commands of the
// consumers they proxy to it) goes through one lane per shard: a bounded
// queue and a goroutine that pushes its commands into the shard's ring,
// parking while the ring is full. A reader parked on a full ring held up
// every forward and proxied command of its peer behind one busy shard;
// now a shard whose ring stays full holds up only its own lane, and the
// readers and the other shards' lanes go on. A lane keeps its commands'
// order, and a queue lives on one shard, so forwards to one queue keep
// theirs, and a proxied consumer's commands reach its shard in order.
//
// A command finding its lane empty (nothing queued, nothing on its way
// to the ring) goes straight into the shard's ring if there is room,
// without waking the lane's goroutine: handing every forward over cost
// about 4 us of CPU a forwarded message (docs/BENCHMARKS.md, issue 26).
// It still follows everything its reader handed over before: those are
// all in the ring once the lane is empty.
type Lanes struct {
	ctx    context.Context
	shards []*shards.Shard
	q      []chan shards.Command
	// busy[i] counts the commands handed to lane i and not yet in its
	// shard's ring.
	busy []atomic.Int64
	wg   sync.WaitGroup
}

// LaneMax bounds the commands waiting in one lane.
const LaneMax = 4096

// NewLanes starts a lane for each of shs, until ctx ends (Wait).
func NewLanes(ctx context.Context, shs []*shards.Shard) *Lanes {
	l := &Lanes{ctx: ctx, shards: shs, q: make([]chan shards.Command, len(shs)), busy: make([]atomic.Int64, len(shs))}
	for i, sh := range shs {
		l.q[i] = make(chan shards.Command, LaneMax)
		l.wg.Add(1)
		go l.run(sh, l.q[i], &l.busy[i])
	}
	return l
}

func (l *Lanes) run(sh *shards.Shard, q chan shards.Command, busy *atomic.Int64) {
	defer l.wg.Done()
	for {
		select {
		case cmd := <-q:
			if sh.Push(l.ctx, cmd) != nil {
				return // the broker is closing
			}
			busy.Add(-1)
		case <-l.ctx.Done():
			return
		}
	}
}

// direct pushes cmd into shard i's ring at once if lane i is empty and
// the ring has room.
func (l *Lanes) direct(i int, cmd shards.Command) bool {
	return l.busy[i].Load() == 0 && l.shards[i].TryPush(cmd)
}

// TryPush hands cmd to shard i's lane; false when the lane is full (its
// shard has not taken a command for LaneMax commands). It never blocks.
func (l *Lanes) TryPush(i int, cmd shards.Command) bool {
	if l.direct(i, cmd) {
		return true
	}
	l.busy[i].Add(1)
	select {
	case l.q[i] <- cmd:
		return true
	default:
		l.busy[i].Add(-1)
		return false
	}
}

// Push hands cmd to shard i's lane, waiting while the lane is full, until
// the broker closes (false then).
func (l *Lanes) Push(i int, cmd shards.Command) bool {
	if l.TryPush(i, cmd) {
		return true
	}
	// The lane is full, so its count stays above 0 meanwhile: no command
	// goes direct ahead of this one.
	l.busy[i].Add(1)
	select {
	case l.q[i] <- cmd:
		return true
	case <-l.ctx.Done():
		l.busy[i].Add(-1)
		return false
	}
}

// AfterAll calls f once every lane has passed what it held when AfterAll
// was called: f then follows every command handed to a lane before.
func (l *Lanes) AfterAll(f func()) {
	left := atomic.Int32{}
	left.Store(int32(len(l.q)))
	mark := func(*shards.Shard) {
		if left.Add(-1) == 0 {
			f()
		}
	}
	for i := range l.q {
		if !l.Push(i, shards.CallCommand(mark)) {
			return // closing: f is not needed any more
		}
	}
}

// Wait waits for the lanes' goroutines, once the broker's context ended.
func (l *Lanes) Wait() { l.wg.Wait() }
