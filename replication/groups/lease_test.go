package groups

import (
	"testing"
	"time"

	"github.com/berthmq/berth/controlplane/ctlapi"
	"github.com/berthmq/berth/journal"
)

// openLeaseNode is a lone broker's node of one group with a lease.
func openLeaseNode(t testing.TB, lease time.Duration, onDeliver func(uint32)) *Node {
	t.Helper()
	nd, err := OpenNode(NodeConfig{ID: 1, Dir: t.TempDir(), Fsync: journal.FsyncNever, Groups: []uint32{testGroup}, Replicas: []uint32{1},
		Logger: quiet(), Lease: lease, OnDeliver: onDeliver})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nd.Close() })
	return nd
}

// TestNodeLease: a node that becomes master delivers only once the fence
// after its election has passed and the controller confirmed its epoch
// (Granted), and is told when it starts (OnDeliver); an answer that does
// not name the group ends the lease at once, and one of a controller
// that predates grants (not Known) confirms the current epoch.
func TestNodeLease(t *testing.T) {
	const lease = 300 * time.Millisecond
	started := make(chan uint32, 8)
	nd := openLeaseNode(t, lease, func(g uint32) { started <- g })
	if err := nd.BecomeMaster(testGroup, 1, []uint32{1}); err != nil {
		t.Fatal(err)
	}
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("not within 10s: %s", what)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitFor("master", func() bool { return nd.IsMaster(testGroup) })
	if nd.Delivering(testGroup) {
		t.Fatal("delivering without the controller's confirmation")
	}
	elected := time.Now()
	grant := ctlapi.HeartbeatReply{Known: true, Grants: []ctlapi.MasterGrant{{Group: testGroup, Epoch: 1}}}
	// Renewed every 50 ms: delivering once the fence (one lease from the
	// election) has passed, never before.
	stop := make(chan struct{})
	renewed := make(chan struct{})
	go func() {
		defer close(renewed)
		for {
			nd.Granted(time.Now(), grant)
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	waitFor("delivering under a renewed lease", func() bool { return nd.Delivering(testGroup) })
	if since := time.Since(elected); since < lease-10*time.Millisecond {
		t.Fatalf("delivering %v after the election, before the fence of %v passed", since, lease)
	}
	select {
	case g := <-started:
		if g != testGroup {
			t.Fatalf("OnDeliver for group %d", g)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("OnDeliver not called")
	}
	close(stop)
	<-renewed
	waitFor("the lease lapses without renewal", func() bool { return !nd.Delivering(testGroup) })
	// Renewed again, then an answer that does not name the group.
	nd.Granted(time.Now(), grant)
	waitFor("renewed", func() bool { return nd.Delivering(testGroup) })
	nd.Granted(time.Now(), ctlapi.HeartbeatReply{Known: true})
	waitFor("revoked", func() bool { return !nd.Delivering(testGroup) })
	// An older controller's empty answer confirms the epoch held.
	nd.Granted(time.Now(), ctlapi.HeartbeatReply{})
	waitFor("confirmed by an older controller's answer", func() bool { return nd.Delivering(testGroup) })
	if st, err := nd.Status(testGroup); err != nil || !st.Delivering {
		t.Fatalf("status %+v, %v: want delivering", st, err)
	}
}

// BenchmarkDelivering is the shards' check at each dispatch of a
// replicated queue (Delivering, which reads the clock) beside the
// mastership check it replaced there (IsMaster).
func BenchmarkDelivering(b *testing.B) {
	nd := openLeaseNode(b, time.Hour, nil)
	if err := nd.BecomeMaster(testGroup, 1, []uint32{1}); err != nil {
		b.Fatal(err)
	}
	b.Run("IsMaster", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = nd.IsMaster(testGroup)
		}
	})
	b.Run("Delivering", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = nd.Delivering(testGroup)
		}
	})
}
