package groups

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/berthmq/berth/internal/testutil"
)

// TestGroupsOverFaultyTransport runs one group on three in-process
// brokers over loopback TCP through the transport's fault injection:
//   - every message may be lost (20%) and every batch is held 2 ms: all
//     proposals still commit, in one order on every member;
//   - one-way partitions: the master hears nothing from a follower (its
//     acknowledgements are lost, its entries still arrive), then the
//     follower hears nothing from the master. Each time the master drops
//     that follower from the SyncStateSet and the other two go on, and
//     after healing the follower converges and rejoins the set.
func TestGroupsOverFaultyTransport(t *testing.T) {
	c := newTestCluster(t)
	c.elect(1, c.ids)
	var want []string
	propose := func(n int, prefix string) {
		t.Helper()
		var wg sync.WaitGroup
		errs := make(chan error, n)
		for i := range n {
			wg.Add(1)
			go func() { defer wg.Done(); errs <- c.propose(1, fmt.Sprintf("%s-%03d", prefix, i), 30*time.Second) }()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatalf("proposal %s: %v", prefix, err)
			}
		}
		want = c.brokers[1].appliedCopy()
	}
	setHas := func(id uint32, has bool) {
		t.Helper()
		testutil.WaitFor(t, 20*time.Second, func() error {
			c.mu.Lock()
			defer c.mu.Unlock()
			if slices.Contains(c.set, id) != has {
				return fmt.Errorf("SyncStateSet %v: broker %d in it should be %v", c.set, id, has)
			}
			return nil
		})
	}
	faults := func(f map[uint32]Faults) {
		for _, b := range c.brokers {
			b.tr.SetFaults(f[b.id])
		}
	}

	// 1. Loss and delay everywhere.
	lossy := Faults{Drop: 0.2, Delay: 2 * time.Millisecond}
	faults(map[uint32]Faults{1: lossy, 2: lossy, 3: lossy})
	propose(200, "lossy")
	faults(nil)
	if len(want) != 200 {
		t.Fatalf("master applied %d entries, want 200", len(want))
	}
	c.converged(want, 1, 2, 3)
	var dropped uint64
	for _, b := range c.brokers {
		dropped += b.tr.Dropped.Load()
	}
	if dropped == 0 {
		t.Fatal("the transport dropped nothing: the faults were not injected")
	}

	// 2. The master stops hearing broker 3 (one way): 3 still gets the
	// entries but its acknowledgements are lost.
	faults(map[uint32]Faults{1: {CutIn: map[uint32]bool{3: true}}})
	setHas(3, false)
	propose(50, "deaf")
	c.converged(want, 1, 2)
	faults(nil)
	c.converged(want, 1, 2, 3)
	setHas(3, true)

	// 3. Broker 3 stops hearing the master (the other way).
	faults(map[uint32]Faults{3: {CutIn: map[uint32]bool{1: true}}})
	setHas(3, false)
	propose(50, "mute")
	c.converged(want, 1, 2)
	if got := c.brokers[3].appliedCopy(); len(got) >= len(want) {
		t.Fatalf("broker 3 applied %d entries while cut off from the master; want fewer than %d", len(got), len(want))
	}
	faults(nil)
	c.converged(want, 1, 2, 3)
	setHas(3, true)
	propose(20, "healed")
	c.converged(want, 1, 2, 3)
}
