package groups

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthmq/berth/internal/testutil"
	"github.com/berthmq/berth/journal"
	"github.com/berthmq/berth/replication/group"
	"github.com/berthmq/berth/wire"
)

const testGroup = 7

// testBroker is one broker of the in-process cluster: a transport on a
// real loopback socket and a node with its journal in a temp directory.
type testBroker struct {
	id  uint32
	dir string
	tr  *Transport
	n   *Node                // the test goroutine's
	cur atomic.Pointer[Node] // the transport's handler's

	mu        sync.Mutex
	applied   []string
	discarded uint64 // entries applied before applied's first (discard)
}

func (b *testBroker) appliedCopy() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.applied)
}

// testCluster is three brokers and a controller played by the test: it
// confirms every AlterSet of the current master's epoch, and elects when
// told to.
type testCluster struct {
	t       testing.TB
	brokers map[uint32]*testBroker
	ids     []uint32

	mu     sync.Mutex
	epoch  uint32
	master uint32
	set    []uint32
	fenced map[uint32]bool // brokers the controller no longer hears (partitioned)
	// discard makes the brokers check the order of what they apply
	// without keeping it (benchmarks).
	discard atomic.Bool
	// page makes the brokers page every entry they apply (Node.Page),
	// as a shard over its memory budget has them do; paged counts them.
	page  atomic.Bool
	paged atomic.Int64
	// pagedReplay opens the brokers with NodeConfig.PagedReplay.
	pagedReplay atomic.Bool
	// refuse, if set, says which entries a broker's Apply fails on, as
	// on a committed event it cannot decode.
	refuse atomic.Pointer[func(id uint32, data string) bool]
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func newTestCluster(t testing.TB) *testCluster {
	c := &testCluster{t: t, brokers: map[uint32]*testBroker{}, ids: []uint32{1, 2, 3}, fenced: map[uint32]bool{}}
	for _, id := range c.ids {
		b := &testBroker{id: id, dir: t.TempDir()}
		c.brokers[id] = b
		var err error
		b.tr, err = Listen("127.0.0.1:0", id, func(m *wire.GroupMessage) {
			if n := b.cur.Load(); n != nil {
				n.Deliver(m)
			}
		}, quiet())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(b.tr.Close)
	}
	for _, b := range c.brokers {
		for _, o := range c.brokers {
			if o != b {
				b.tr.SetPeer(o.id, o.tr.Addr())
			}
		}
	}
	for _, id := range c.ids {
		c.open(id)
	}
	return c
}

func (c *testCluster) open(id uint32) {
	b := c.brokers[id]
	b.mu.Lock()
	b.applied, b.discarded = nil, 0 // the applied state is rebuilt from the log
	b.mu.Unlock()
	n, err := OpenNode(NodeConfig{ID: id, Dir: filepath.Join(b.dir, "journal"), Fsync: journal.FsyncAlways, Transport: b.tr,
		Groups: []uint32{testGroup}, Replicas: c.ids, LagTicks: 10, Tick: 10 * time.Millisecond, Logger: quiet(), PagedReplay: c.pagedReplay.Load(),
		Apply: func(_ uint32, e wire.GroupEntry) error {
			b.mu.Lock()
			defer b.mu.Unlock()
			if uint64(len(b.applied))+b.discarded+1 != e.Index {
				c.t.Errorf("broker %d applies %d after %d", id, e.Index, uint64(len(b.applied))+b.discarded)
			}
			if r := c.refuse.Load(); r != nil && (*r)(id, string(e.Data)) {
				return fmt.Errorf("broker %d cannot decode %q", id, e.Data)
			}
			if c.discard.Load() {
				b.discarded++
				return nil
			}
			b.applied = append(b.applied, string(e.Data))
			if c.page.Load() {
				if b.cur.Load().Page(testGroup, e.Index, true) == 0 {
					c.t.Errorf("broker %d could not page entry %d", id, e.Index)
				}
				c.paged.Add(1)
			}
			return nil
		},
		OnAlter: func(g uint32, a group.AlterSet) { go c.alter(id, a) },
		// A broker that stops being master drops its applied state; the
		// node then applies the committed log again from the first entry.
		OnStepDown: func(uint32) {
			b.mu.Lock()
			defer b.mu.Unlock()
			b.applied, b.discarded = nil, 0
		},
	})
	if err != nil {
		c.t.Fatal(err)
	}
	b.n = n
	b.cur.Store(n)
	c.t.Cleanup(func() { n.Close() })
}

func (c *testCluster) alter(from uint32, a group.AlterSet) {
	c.mu.Lock()
	ok := a.Epoch == c.epoch && from == c.master && !c.fenced[from]
	epoch := c.epoch
	if ok {
		c.set = slices.Clone(a.Set)
	}
	c.mu.Unlock()
	n := c.brokers[from].n
	if ok {
		_ = n.AlterGranted(testGroup, a.Epoch, a.Set)
	} else {
		_ = n.AlterRefused(testGroup, epoch)
	}
}

// elect makes id master of a new epoch with set; the others follow.
func (c *testCluster) elect(id uint32, set []uint32) {
	c.mu.Lock()
	c.epoch++
	c.master, c.set = id, slices.Clone(set)
	epoch := c.epoch
	c.mu.Unlock()
	for _, o := range c.ids {
		if c.fenced[o] {
			continue
		}
		var err error
		if o == id {
			err = c.brokers[o].n.BecomeMaster(testGroup, epoch, set)
		} else {
			err = c.brokers[o].n.BecomeFollower(testGroup, epoch, id)
		}
		if err != nil {
			c.t.Fatal(err)
		}
	}
}

// isolate cuts broker id off from the others, both ways.
func (c *testCluster) isolate(id uint32, on bool) {
	for _, b := range c.brokers {
		f := Faults{CutOut: map[uint32]bool{}, CutIn: map[uint32]bool{}}
		for _, o := range c.ids {
			if on && (b.id == id) != (o == id) {
				f.CutOut[o], f.CutIn[o] = true, true
			}
		}
		b.tr.SetFaults(f)
	}
}

func (c *testCluster) propose(id uint32, data string, within time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	return c.brokers[id].n.Propose(ctx, testGroup, []byte(data))
}

// converged waits until every listed broker applied want exactly.
func (c *testCluster) converged(want []string, ids ...uint32) {
	c.t.Helper()
	testutil.WaitFor(c.t, 20*time.Second, func() error {
		for _, id := range ids {
			if got := c.brokers[id].appliedCopy(); !slices.Equal(got, want) {
				return fmt.Errorf("broker %d applied %d entries, want %d", id, len(got), len(want))
			}
		}
		return nil
	})
}

// TestGroupsOverRealSockets runs one group on three in-process brokers
// over loopback TCP with journals that fsync: commits with everyone in
// sync; a follower cut off is dropped from the SyncStateSet and the
// others go on; it catches up when healed; a master cut off stops
// completing while the majority side, under a new epoch, goes on; after
// healing the old master truncates what it wrote alone and converges; a
// broker closed and reopened recovers its log from its journal.
func TestGroupsOverRealSockets(t *testing.T) {
	c := newTestCluster(t)
	c.elect(1, c.ids)
	var want []string
	propose := func(id uint32, n int, prefix string) {
		t.Helper()
		var wg sync.WaitGroup
		errs := make(chan error, n)
		for i := range n {
			data := fmt.Sprintf("%s-%03d", prefix, i)
			wg.Add(1)
			go func() { defer wg.Done(); errs <- c.propose(id, data, 20*time.Second) }()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatalf("proposal %s on broker %d: %v", prefix, id, err)
			}
		}
	}
	collect := func(from uint32) {
		want = c.brokers[from].appliedCopy()
	}

	// 1. All in sync.
	propose(1, 100, "a")
	collect(1)
	if len(want) != 100 {
		t.Fatalf("master applied %d of 100", len(want))
	}
	c.converged(want, 1, 2, 3)

	// 2. Follower 3 cut off: the master shrinks the set and goes on.
	c.isolate(3, true)
	propose(1, 50, "b")
	collect(1)
	c.converged(want, 1, 2)
	if got := c.brokers[3].appliedCopy(); len(got) > 100 {
		t.Fatalf("the cut-off follower applied %d entries", len(got))
	}
	c.mu.Lock()
	set := slices.Clone(c.set)
	c.mu.Unlock()
	if slices.Contains(set, 3) {
		t.Fatalf("SyncStateSet %v still holds the cut-off follower", set)
	}

	// 3. Healed: it catches up and rejoins the set.
	c.isolate(3, false)
	c.converged(want, 1, 2, 3)
	testutil.WaitFor(t, 20*time.Second, func() error {
		c.mu.Lock()
		defer c.mu.Unlock()
		if !slices.Contains(c.set, 3) {
			return fmt.Errorf("set %v without the healed follower", c.set)
		}
		return nil
	})

	// 4. The master cut off: its proposals do not complete; the
	// controller, which no longer hears it, elects broker 2.
	c.isolate(1, true)
	c.mu.Lock()
	c.fenced[1] = true
	c.mu.Unlock()
	lost := make(chan error, 1)
	go func() { lost <- c.propose(1, "lost", 3*time.Second) }()
	c.elect(2, []uint32{2, 3})
	propose(2, 50, "c")
	if err := <-lost; err == nil {
		t.Fatal("the cut-off master completed a proposal")
	}
	collect(2)
	if slices.Contains(want, "lost") {
		t.Fatal("the cut-off master's proposal was committed by the majority")
	}
	c.converged(want, 2, 3)

	// 5. Healed: broker 1 follows the new epoch and drops what it wrote
	// alone.
	c.isolate(1, false)
	c.mu.Lock()
	c.fenced[1] = false
	epoch := c.epoch
	c.mu.Unlock()
	if err := c.brokers[1].n.BecomeFollower(testGroup, epoch, 2); err != nil {
		t.Fatal(err)
	}
	c.converged(want, 1, 2, 3)

	// 6. A broker closed and reopened replays its journal and catches up
	// with what it missed.
	if err := c.brokers[3].n.Close(); err != nil {
		t.Fatal(err)
	}
	propose(2, 20, "d")
	collect(2)
	c.open(3)
	if err := c.brokers[3].n.BecomeFollower(testGroup, epoch, 2); err != nil {
		t.Fatal(err)
	}
	c.converged(want, 1, 2, 3)
	st, err := c.brokers[3].n.Status(testGroup)
	if err != nil {
		t.Fatal(err)
	}
	if st.Epoch != epoch || st.Role != group.RoleFollower {
		t.Fatalf("reopened broker: %+v", st)
	}
	// Refused, and said to be: nothing entered the log (not an unknown
	// outcome).
	if err := c.propose(3, "x", time.Second); !errors.Is(err, group.ErrNotMaster) || !errors.Is(err, ErrNotProposed) {
		t.Fatalf("a follower's proposal: %v; want ErrNotMaster and ErrNotProposed", err)
	}
}

func TestLagTicks(t *testing.T) {
	for _, c := range []struct {
		lag  time.Duration
		want int
	}{{0, 25}, {LagDefault, 25}, {100 * time.Millisecond, 5}, {time.Millisecond, 1}, {time.Second, 50}} {
		if got := lagTicks(c.lag); got != c.want {
			t.Errorf("lagTicks(%v) = %d, want %d", c.lag, got, c.want)
		}
	}
}
