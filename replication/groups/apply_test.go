package groups

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthmq/berth/internal/testutil"
	"github.com/berthmq/berth/journal"
	"github.com/berthmq/berth/wire"
)

// TestUndecodableEntryStopsMember: a follower that cannot apply a
// committed entry (one it cannot decode) stops at it, never applies what
// follows, reports it in its Status and leaves the SyncStateSet; the
// master and the other follower go on without it.
func TestUndecodableEntryStopsMember(t *testing.T) {
	c := newTestCluster(t)
	refuse := func(id uint32, data string) bool { return id == 3 && data == "bad" }
	c.refuse.Store(&refuse)
	c.elect(1, c.ids)
	for i := range 5 {
		if err := c.propose(1, fmt.Sprintf("a-%d", i), 20*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.propose(1, "bad", 20*time.Second); err != nil {
		t.Fatal(err) // committed: broker 3 held it, it could not apply it
	}
	for i := range 5 {
		if err := c.propose(1, fmt.Sprintf("b-%d", i), 20*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	want := c.brokers[1].appliedCopy()
	c.converged(want, 1, 2)
	if got, stop := c.brokers[3].appliedCopy(), slices.Index(want, "bad"); !slices.Equal(got, want[:stop]) {
		t.Fatalf("broker 3 applied %q; want exactly what precedes the entry it cannot decode, %q (stopped, not skipped)", got, want[:stop])
	}
	st, err := c.brokers[3].n.Status(testGroup)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(st.Failed, "entry 6") || !strings.Contains(st.Failed, "cannot decode") || st.RoleName != "failed" {
		t.Fatalf("broker 3's status %+v; want it failed at entry 6 with the decode error", st)
	}
	testutil.WaitFor(t, 20*time.Second, func() error {
		c.mu.Lock()
		defer c.mu.Unlock()
		if slices.Contains(c.set, 3) {
			return fmt.Errorf("SyncStateSet %v still holds the stopped member", c.set)
		}
		return nil
	})
	for _, e := range c.brokers[3].n.LogEnds() {
		if e.Group == testGroup {
			t.Fatalf("the stopped member still reports a log end %+v, a candidate for master", e)
		}
	}
	if err := c.brokers[3].n.BecomeMaster(testGroup, 99, c.ids); err == nil {
		t.Fatal("the stopped member took mastership")
	}
}

// TestUndecodableEntryStopsOnlyItsGroup: a master that cannot apply a
// committed entry of one group steps down and stops serving that group:
// the proposal's outcome is unknown, later proposals are refused with
// the failure, and it applies nothing more of it; the node's other group
// goes on.
func TestUndecodableEntryStopsOnlyItsGroup(t *testing.T) {
	tr, err := Listen("127.0.0.1:0", 1, func(*wire.GroupMessage) {}, quiet())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tr.Close)
	var mu sync.Mutex
	applied := map[uint32][]string{}
	var steppedDown []uint32
	n, err := OpenNode(NodeConfig{ID: 1, Dir: filepath.Join(t.TempDir(), "journal"), Fsync: journal.FsyncNever, Transport: tr,
		Groups: []uint32{1, 2}, Replicas: []uint32{1}, Tick: 10 * time.Millisecond, Logger: quiet(),
		Apply: func(g uint32, e wire.GroupEntry) error {
			if string(e.Data) == "bad" {
				return errors.New("undecodable")
			}
			mu.Lock()
			applied[g] = append(applied[g], string(e.Data))
			mu.Unlock()
			return nil
		},
		OnStepDown: func(g uint32) { mu.Lock(); steppedDown = append(steppedDown, g); mu.Unlock() },
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	for _, g := range []uint32{1, 2} {
		if err := n.BecomeMaster(g, 1, []uint32{1}); err != nil {
			t.Fatal(err)
		}
	}
	propose := func(g uint32, data string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return n.Propose(ctx, g, []byte(data))
	}
	testutil.WaitFor(t, 10*time.Second, func() error {
		if !n.IsMaster(1) || !n.IsMaster(2) {
			return errors.New("not serving yet")
		}
		return nil
	})
	for _, g := range []uint32{1, 2} {
		if err := propose(g, "a"); err != nil {
			t.Fatal(err)
		}
	}
	if err := propose(1, "bad"); !errors.Is(err, ErrApplyFailed) {
		t.Fatalf("the proposal the master cannot apply: %v; want ErrApplyFailed", err)
	}
	if err := propose(1, "after"); !errors.Is(err, ErrApplyFailed) {
		t.Fatalf("a proposal to the stopped group: %v; want ErrApplyFailed", err)
	}
	if err := propose(2, "b"); err != nil {
		t.Fatalf("the other group: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(applied[1], []string{"a"}) || !slices.Equal(applied[2], []string{"a", "b"}) {
		t.Fatalf("applied %v", applied)
	}
	if !slices.Equal(steppedDown, []uint32{1}) || n.IsMaster(1) || !n.IsMaster(2) {
		t.Fatalf("stepped down %v; masters of 1, 2: %v, %v", steppedDown, n.IsMaster(1), n.IsMaster(2))
	}
	st, err := n.Status(1)
	if err != nil || !strings.Contains(st.Failed, "group 1 entry 2: undecodable") {
		t.Fatalf("status of the stopped group %+v (%v)", st, err)
	}
	if st, _ := n.Status(2); st.Failed != "" {
		t.Fatalf("the other group failed: %+v", st)
	}
}
