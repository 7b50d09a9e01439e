package groups

import (
	"fmt"
	"maps"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthmq/berth/internal/testutil"
	"github.com/berthmq/berth/journal"
	"github.com/berthmq/berth/replication/group"
	"github.com/berthmq/berth/wire"
)

// queueApp is a broker's applied state in the compaction test: the group
// log is a queue's. "e:ID" enqueues ID at its index, "r:ID:I" removes
// the message at index I; then, as the server does, the enqueue is
// forgotten and the removal retired.
type queueApp struct {
	mu       sync.Mutex
	live     map[uint64]string
	applied  uint64
	installs int
}

func (a *queueApp) snapshot() (map[uint64]string, uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return maps.Clone(a.live), a.applied
}

type compactBroker struct {
	id  uint32
	dir string
	tr  *Transport
	n   *Node
	app *queueApp
}

// openCompact opens broker b's node with a small compaction threshold
// and small journal segments, so compaction and segment reclaim show in
// a short test.
func openCompact(t *testing.T, b *compactBroker, c *testCluster, nodeOf func(uint32) *Node) {
	t.Helper()
	b.app = &queueApp{live: map[uint64]string{}}
	app := b.app
	n, err := OpenNode(NodeConfig{ID: b.id, Dir: filepath.Join(b.dir, "journal"), Fsync: journal.FsyncAlways, Transport: b.tr,
		Groups: []uint32{testGroup}, Replicas: c.ids, LagTicks: 10, Tick: 10 * time.Millisecond, Logger: quiet(),
		CompactEvery: 256, SegmentBytes: 64 << 10,
		Apply: func(g uint32, e wire.GroupEntry) error {
			app.mu.Lock()
			app.applied = e.Index
			app.mu.Unlock()
			d := string(e.Data)
			switch {
			case d == "":
			case strings.HasPrefix(d, "e:"):
				app.mu.Lock()
				app.live[e.Index] = d
				app.mu.Unlock()
			case strings.HasPrefix(d, "r:"):
				i, err := strconv.ParseUint(d[strings.LastIndexByte(d, ':')+1:], 10, 64)
				if err != nil {
					t.Errorf("bad removal %q", d)
					return nil
				}
				app.mu.Lock()
				delete(app.live, i)
				app.mu.Unlock()
				nodeOf(b.id).Forget(g, i)
				nodeOf(b.id).Retire(g, e.Index)
			}
			return nil
		},
		OnAlter: func(g uint32, a group.AlterSet) { go c.alter(b.id, a) },
		OnStepDown: func(uint32) {
			app.mu.Lock()
			clear(app.live)
			app.installs++
			app.mu.Unlock()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	b.n = n
}

// TestGroupCompaction: a group whose messages are all consumed compacts
// its log on every member and its journal gives the disk back; a member
// that was down while the others compacted past its log end gets an
// install and ends with exactly the live messages; members reopened
// replay from their base and agree.
func TestGroupCompaction(t *testing.T) {
	// The controller is played by a testCluster whose brokers are these.
	c := &testCluster{t: t, brokers: map[uint32]*testBroker{}, ids: []uint32{1, 2, 3}, fenced: map[uint32]bool{}}
	bs := map[uint32]*compactBroker{}
	var nodesMu sync.Mutex
	nodeOf := func(id uint32) *Node {
		nodesMu.Lock()
		defer nodesMu.Unlock()
		return bs[id].n
	}
	for _, id := range c.ids {
		b := &compactBroker{id: id, dir: t.TempDir()}
		bs[id] = b
		tb := &testBroker{id: id}
		c.brokers[id] = tb
		var err error
		b.tr, err = Listen("127.0.0.1:0", id, func(m *wire.GroupMessage) {
			if n := tb.cur.Load(); n != nil {
				n.Deliver(m)
			}
		}, quiet())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(b.tr.Close)
	}
	for _, b := range bs {
		for _, o := range bs {
			if o != b {
				b.tr.SetPeer(o.id, o.tr.Addr())
			}
		}
	}
	open := func(id uint32) {
		nodesMu.Lock()
		openCompact(t, bs[id], c, func(x uint32) *Node { return bs[x].n })
		n := bs[id].n
		nodesMu.Unlock()
		c.brokers[id].n = n
		c.brokers[id].cur.Store(n)
	}
	closeNode := func(id uint32) {
		c.brokers[id].cur.Store(nil)
		if err := nodeOf(id).Close(); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range c.ids {
		open(id)
	}
	t.Cleanup(func() {
		for _, id := range c.ids {
			if n := c.brokers[id].cur.Load(); n != nil {
				n.Close()
			}
		}
	})
	c.elect(1, c.ids)

	// A producer and a consumer: pairs of enqueue and removal, sixteen
	// proposals in flight.
	seq := 0
	pairs := func(n int, payload int) {
		t.Helper()
		body := strings.Repeat("x", payload)
		for k := 0; k < n; k += 16 {
			var wg sync.WaitGroup
			idx := make([]uint64, 16)
			for i := range 16 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if err := c.propose(1, fmt.Sprintf("e:%d:%s", seq+i, body), 20*time.Second); err != nil {
						t.Error(err)
					}
				}()
			}
			wg.Wait()
			seq += 16
			live, _ := bs[1].app.snapshot()
			for i := range live {
				idx = append(idx, i)
			}
			for _, i := range idx {
				if i == 0 {
					continue
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					if err := c.propose(1, fmt.Sprintf("r:%d", i), 20*time.Second); err != nil {
						t.Error(err)
					}
				}()
			}
			wg.Wait()
			if t.Failed() {
				t.FailNow()
			}
		}
	}
	status := func(id uint32) Status {
		st, err := nodeOf(id).Status(testGroup)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	compacted := func(ids ...uint32) {
		t.Helper()
		top := status(1).Commit
		testutil.WaitFor(t, 20*time.Second, func() error {
			for _, id := range ids {
				if st := status(id); st.Base < top {
					return fmt.Errorf("broker %d compacted to %d of %d (applied %d)", id, st.Base, top, st.Applied)
				}
			}
			return nil
		})
	}
	agree := func(ids ...uint32) map[uint64]string {
		t.Helper()
		var want map[uint64]string
		testutil.WaitFor(t, 20*time.Second, func() error {
			want, _ = bs[1].app.snapshot()
			top := status(1).Commit
			for _, id := range ids {
				got, applied := bs[id].app.snapshot()
				if applied < top || !maps.Equal(got, want) {
					return fmt.Errorf("broker %d applied to %d with %d live messages; the master %d with %d", id, applied, len(got), top, len(want))
				}
			}
			return nil
		})
		return want
	}

	// 1. Everything consumed: every member compacts, and the journal's
	// sealed segments go.
	pairs(1024, 512)
	agree(1, 2, 3)
	compacted(1, 2, 3)
	testutil.WaitFor(t, 20*time.Second, func() error {
		for _, id := range c.ids {
			st := nodeOf(id).JournalStats()
			if st.DiskBytes > 512<<10 {
				return fmt.Errorf("broker %d: the journal holds %d bytes on disk (%d segments, %d live) after everything was consumed", id, st.DiskBytes, st.Segments, st.LiveBytes)
			}
		}
		return nil
	})

	// 2. Broker 3 down while the others go on and compact past its log
	// end; some messages stay in the queue.
	closeNode(3)
	c.mu.Lock()
	c.fenced[3] = true
	c.mu.Unlock()
	testutil.WaitFor(t, 20*time.Second, func() error {
		c.mu.Lock()
		defer c.mu.Unlock()
		if len(c.set) != 2 {
			return fmt.Errorf("set %v still holds the closed broker", c.set)
		}
		return nil
	})
	pairs(1024, 64)
	for i := range 5 {
		if err := c.propose(1, fmt.Sprintf("e:kept-%d", i), 20*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	compactedTo := status(1).Commit - 5
	testutil.WaitFor(t, 20*time.Second, func() error {
		if st := status(1); st.Base < compactedTo {
			return fmt.Errorf("master compacted to %d of %d", st.Base, compactedTo)
		}
		return nil
	})
	open(3)
	c.mu.Lock()
	c.fenced[3] = false
	epoch := c.epoch
	c.mu.Unlock()
	if err := nodeOf(3).BecomeFollower(testGroup, epoch, 1); err != nil {
		t.Fatal(err)
	}
	want := agree(1, 2, 3)
	if len(want) != 5 {
		t.Fatalf("%d live messages, want the 5 kept", len(want))
	}
	if _, _ = bs[3].app.snapshot(); bs[3].app.installs == 0 {
		t.Fatal("the broker that was down caught up without an install")
	}
	if st := status(3); st.Base < compactedTo {
		t.Fatalf("broker 3's log starts after %d, the master's after %d", st.Base, compactedTo)
	}

	// 3. Every broker reopened replays from its base and agrees again.
	testutil.WaitFor(t, 20*time.Second, func() error {
		for _, id := range c.ids {
			if st := status(id); st.Base < compactedTo {
				return fmt.Errorf("broker %d compacted to %d of %d", id, st.Base, compactedTo)
			}
		}
		return nil
	})
	for _, id := range []uint32{2, 3} {
		closeNode(id)
		open(id)
		if err := nodeOf(id).BecomeFollower(testGroup, epoch, 1); err != nil {
			t.Fatal(err)
		}
	}
	if got := agree(1, 2, 3); !maps.Equal(got, want) {
		t.Fatalf("after reopening: %d live messages, want %d", len(got), len(want))
	}
	for _, id := range []uint32{2, 3} {
		if st := status(id); st.Base < compactedTo {
			t.Fatalf("reopened broker %d starts after %d, below the compaction point %d", id, st.Base, compactedTo)
		}
	}
}

// TestReplayLog: a replay rebuilds a group's log from its last base on,
// whatever freed records the journal has not reclaimed yet, and refuses a
// log with records missing after its base.
func TestReplayLog(t *testing.T) {
	ent := func(i uint64) group.Entry { return group.Entry{Epoch: 1, Index: i, Data: []byte{byte(i)}} }
	type step struct {
		entry    uint64 // an entry record, or
		base     uint64 // a base record, or
		reset    bool
		truncate uint64 // a truncate record (after, +1 so 0 means none)
	}
	cases := []struct {
		name        string
		steps       []step
		base, first uint64
		n           int
		stale       int
		bad         bool
	}{
		{name: "no base", steps: []step{{entry: 1}, {entry: 2}, {entry: 3}}, first: 1, n: 3},
		{name: "base after its entries", steps: []step{{entry: 1}, {entry: 2}, {entry: 3}, {base: 2}, {entry: 4}}, base: 2, first: 3, n: 2, stale: 2},
		{name: "stale run before a gap", steps: []step{{entry: 3}, {entry: 4}, {entry: 8}, {entry: 9}, {base: 7}}, base: 7, first: 8, n: 2, stale: 2},
		{name: "older base freed", steps: []step{{base: 2}, {entry: 5}, {entry: 6}, {base: 4}, {entry: 7}}, base: 4, first: 5, n: 3, stale: 1},
		{name: "stale entry after the base", steps: []step{{base: 5}, {entry: 4}, {entry: 6}}, base: 5, first: 6, n: 1, stale: 1},
		{name: "install resets", steps: []step{{entry: 1}, {entry: 2}, {base: 10, reset: true}, {entry: 11}}, base: 10, first: 11, n: 1, stale: 2},
		{name: "truncate", steps: []step{{entry: 1}, {entry: 2}, {entry: 3}, {truncate: 2}, {entry: 2}}, first: 1, n: 2, stale: 2},
		{name: "hole after the base", steps: []step{{base: 2}, {entry: 3}, {entry: 5}}, bad: true},
		{name: "entries missing before the base's end", steps: []step{{entry: 6}, {entry: 7}, {base: 3}}, bad: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l := &replayLog{first: 1}
			pos := journal.Pos(0)
			for _, s := range tc.steps {
				pos++
				switch {
				case s.entry != 0:
					if err := l.entry(ent(s.entry), pos); err != nil {
						t.Fatal(err)
					}
				case s.base != 0:
					l.setBase(group.Base{Index: s.base, Epoch: 1}, s.reset, pos)
				default:
					l.truncate(s.truncate - 1)
				}
			}
			err := l.check()
			if tc.bad {
				if err == nil {
					t.Fatalf("a log with records missing replayed: base %d, first %d, %d entries", l.base.Index, l.first, len(l.log))
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if l.base.Index != tc.base || l.first != tc.first || len(l.log) != tc.n || len(l.pos) != tc.n || len(l.stale) != tc.stale {
				t.Fatalf("base %d, first %d, %d entries, %d stale; want %d, %d, %d, %d", l.base.Index, l.first, len(l.log), len(l.stale), tc.base, tc.first, tc.n, tc.stale)
			}
			for i, e := range l.log {
				if e.Index != l.first+uint64(i) {
					t.Fatalf("entry %d at %d", e.Index, i)
				}
			}
		})
	}
}
