package groups

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthmq/berth/internal/testutil"
	"github.com/berthmq/berth/journal"
	"github.com/berthmq/berth/wire"
)

// TestGroupsPaged: every broker pages each entry it applies, dropping its
// data from memory (Node.Page). A follower cut off catches up from the
// master's journal, and a master that steps down applies its log again
// from its journal: every broker ends with every entry's data, and
// ReadEntry, from the test's goroutine, reads each entry at the position
// Page gave.
func TestGroupsPaged(t *testing.T) {
	c := newTestCluster(t)
	c.page.Store(true)
	c.elect(1, c.ids)
	propose := func(id uint32, n int, prefix string) {
		t.Helper()
		var wg sync.WaitGroup
		errs := make(chan error, n)
		for i := range n {
			wg.Add(1)
			go func() { defer wg.Done(); errs <- c.propose(id, fmt.Sprintf("%s-%03d", prefix, i), 20*time.Second) }()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatalf("proposal %s on broker %d: %v", prefix, id, err)
			}
		}
	}
	c.isolate(3, true)
	testutil.WaitFor(t, 20*time.Second, func() error {
		c.mu.Lock()
		defer c.mu.Unlock()
		if slices.Contains(c.set, 3) {
			return fmt.Errorf("set %v still holds the cut-off follower", c.set)
		}
		return nil
	})
	propose(1, 200, "a")
	want := c.brokers[1].appliedCopy()
	c.converged(want, 1, 2)
	if c.paged.Load() < 400 {
		t.Fatalf("%d entries paged, want 400", c.paged.Load())
	}
	// The master's log holds no data now: the follower that was away
	// gets every entry read back from the master's journal.
	c.isolate(3, false)
	c.converged(want, 1, 2, 3)

	// A new master: broker 1 steps down and applies its paged log again.
	c.elect(2, c.ids)
	propose(2, 10, "b")
	want = c.brokers[2].appliedCopy()
	if len(want) != 210 {
		t.Fatalf("the new master applied %d entries, want 210", len(want))
	}
	c.converged(want, 1, 2, 3)

	// A broker reopened with PagedReplay keeps no entry's data from its
	// journal in memory and reads each back to apply it; the master it
	// follows, reopened so too, reads them back to send them.
	c.pagedReplay.Store(true)
	c.page.Store(false)
	for _, id := range []uint32{3, 2} {
		if err := c.brokers[id].n.Close(); err != nil {
			t.Fatal(err)
		}
		c.open(id)
		st, err := c.brokers[id].n.Status(testGroup)
		if err != nil {
			t.Fatal(err)
		}
		mb := c.brokers[id].n.members[testGroup]
		var held int
		if err := c.brokers[id].n.do(func() {
			for i := st.Base + 1; i <= st.LastIndex; i++ {
				if !mb.m.Paged(i) {
					held++
				}
			}
		}); err != nil {
			t.Fatal(err)
		}
		if held != 0 || st.LastIndex < 210 {
			t.Fatalf("broker %d reopened with %d of its entries to %d in memory", id, held, st.LastIndex)
		}
	}
	c.elect(2, c.ids)
	c.converged(want, 1, 2, 3)
	propose(2, 5, "c")
	want = c.brokers[2].appliedCopy()
	c.converged(want, 1, 2, 3)

	// ReadEntry from another goroutine than the node's.
	n := c.brokers[1].n
	var win journal.Window
	for i := uint64(1); i <= 210; i += 7 {
		var pos uint64
		if err := n.do(func() { pos = uint64(n.Page(testGroup, i, false)) }); err != nil {
			t.Fatal(err)
		}
		if pos == 0 {
			t.Fatalf("entry %d is not paged", i)
		}
		_, data, err := n.ReadEntry(testGroup, i, journalPos(pos), nil, nil)
		if err != nil || string(data) != want[i-1] {
			t.Fatalf("entry %d read back as %q (%v), want %q", i, data, err, want[i-1])
		}
		if _, _, err := n.ReadEntry(testGroup, i+1, journalPos(pos), &win, nil); err == nil {
			t.Fatalf("entry %d's record read back as entry %d", i, i+1)
		}
	}
}

func journalPos(p uint64) journal.Pos { return journal.Pos(p) }

// TestNodePagedEntryBytes: a paged entry costs the node its group log's
// slot (group.SlotBytes, 4) and its journal position (PositionBytes, 4),
// beyond the journal's index (counted apart: journal.IndexBytes, here
// subtracted): at most 13 bytes on the heap after GC with the slots'
// array grown by appends (10.5 measured). It was 56 (a 48-byte slot and
// an 8-byte position), 65.9 measured so. A lone broker's group of one,
// 500,000 entries of 100 bytes, each paged as it is applied.
func TestNodePagedEntryBytes(t *testing.T) {
	const n = 500_000
	var node atomic.Pointer[Node]
	nd, err := OpenNode(NodeConfig{ID: 1, Dir: t.TempDir(), Fsync: journal.FsyncNever, Groups: []uint32{testGroup}, Replicas: []uint32{1},
		Logger: quiet(), Apply: func(g uint32, e wire.GroupEntry) error {
			if node.Load().Page(g, e.Index, true) == 0 {
				t.Errorf("entry %d not paged", e.Index)
			}
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer nd.Close()
	node.Store(nd)
	if err := nd.BecomeMaster(testGroup, 1, []uint32{1}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	data := make([]byte, 100)
	propose := func(k int) {
		var wg sync.WaitGroup
		for range k {
			wg.Add(1)
			for {
				err := nd.ProposeAsync(testGroup, data, FuncWaiter(func(err error) {
					if err != nil {
						t.Error(err)
					}
					wg.Done()
				}), 0)
				if !errors.Is(err, ErrBusy) {
					if err != nil {
						t.Fatal(err)
					}
					break
				}
				time.Sleep(time.Millisecond)
			}
		}
		wg.Wait()
		if ctx.Err() != nil {
			t.Fatal(ctx.Err())
		}
	}
	propose(4096) // the node's arrays at their working size
	before, index := heapAfterGC(), nd.j.IndexBytes()
	for i := 0; i < n; i += 4096 {
		propose(min(4096, n-i))
	}
	grew := heapAfterGC() - before - (nd.j.IndexBytes() - index)
	per := float64(grew) / n
	t.Logf("%.1f bytes a paged entry beyond the journal's index (which grew by %d)", per, nd.j.IndexBytes()-index)
	if per > 13 {
		t.Fatalf("a paged entry costs the node %.1f bytes, want at most 13", per)
	}
}
