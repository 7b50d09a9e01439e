package clustertest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/controlplane/ctlapi"
	"github.com/berthmq/berth/controlplane/ctlclient"
	"github.com/berthmq/berth/internal/testutil"
)

// TestControllerMembershipChange runs three controller-only berthd
// processes, starts a broker with -controller-join that knows only two of
// them, adds it to the group with the client berthctl uses, removes one of
// the original members and kills it. A write still commits; then a second
// original member is killed, so the next write commits only with the new
// member's vote and log, and the new member serves it.
func TestControllerMembershipChange(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	nodes := startGroup(t, "controller", "controller", "controller")
	addrs := map[uint64]string{}
	for i, n := range nodes {
		addrs[uint64(i+1)] = n.ctl
	}
	cl := ctlclient.NewClient(slices.Collect(maps.Values(addrs)))
	defer cl.Close()
	if err := cl.DeclareQueue(ctx, "before", ctlapi.QueueOptions{Durable: true}); err != nil {
		t.Fatal(err)
	}

	// The joining member: a broker whose peer list names itself and two
	// of the three members.
	dir := t.TempDir()
	j := &node{name: "berthd-4-join", ctl: testutil.FreeAddr(t), client: testutil.FreeAddr(t), logPath: filepath.Join(dir, "berthd-4.log")}
	jadmin := testutil.FreeAddr(t)
	j.args = []string{"-role", "broker", "-data", filepath.Join(dir, "data"), "-admin", jadmin, "-listen", j.client,
		"-controller-join", "-controller-id", "4",
		"-controller-peers", fmt.Sprintf("1=%s,2=%s,4=%s", addrs[1], addrs[2], j.ctl),
		"-shards", "1", "-loops", "1", "-log-level", "info"}
	t.Cleanup(func() {
		j.kill()
		if t.Failed() {
			t.Logf("%s log:\n%s", j.name, j.logTail())
		}
	})
	j.start(t)
	// It comes up before it is a member: it does not wait for a leader of
	// its own, and restores its wiring from the running members.
	j.waitUp(t, 20*time.Second)
	cj := dial(t, ctx, j.client)
	if err := cj.DeclareQueue(ctx, "before", client.QueueOptions{Passive: true}); err != nil {
		t.Fatalf("joining broker did not restore the group's wiring: %v", err)
	}
	if m, err := cl.Members(ctx); err != nil || len(m) != 3 {
		t.Fatalf("members before the add: %v %v", m, err)
	}
	if code, body := readyz(t, jadmin); code != 503 || !strings.Contains(body, "this member is joining") {
		t.Fatalf("/readyz of the member before it is added: %d %q, want 503 saying it is joining", code, body)
	}

	if err := cl.ChangeMembership(ctx, map[uint64]string{4: j.ctl}, nil); err != nil {
		t.Fatalf("add member 4: %v", err)
	}
	want := maps.Clone(addrs)
	want[4] = j.ctl
	members, leader, err := cl.MemberList(ctx)
	if err != nil || !maps.Equal(members, want) {
		t.Fatalf("members after the add: %v %v, want %v", members, err, want)
	}

	// Remove an original member that is not the leader, and kill it.
	var gone uint64
	for id := uint64(1); id <= 3; id++ {
		if id != leader {
			gone = id
			break
		}
	}
	if err := cl.ChangeMembership(ctx, nil, []uint64{gone}); err != nil {
		t.Fatalf("remove member %d: %v", gone, err)
	}
	delete(want, gone)
	if members, err := cl.Members(ctx); err != nil || !maps.Equal(members, want) {
		t.Fatalf("members after removing %d: %v %v, want %v", gone, members, err, want)
	}
	nodes[gone-1].stop(t, syscall.SIGKILL)
	err = cl.DeclareQueue(ctx, "after", ctlapi.QueueOptions{Durable: true})
	for try := 0; try < 20 && errors.Is(err, ctlapi.ErrLeaderChanged); try++ {
		err = cl.DeclareQueue(ctx, "after", ctlapi.QueueOptions{Durable: true})
	}
	if err != nil {
		t.Fatalf("write after removing %d: %v", gone, err)
	}

	// Kill a second original member: of the three voters left, the other
	// original one and member 4 must both take the next write.
	var killed, kept uint64
	for id := range want {
		if id == 4 {
			continue
		}
		if killed == 0 {
			killed = id
		} else {
			kept = id
		}
	}
	nodes[killed-1].stop(t, syscall.SIGKILL)
	c2 := ctlclient.NewClient([]string{addrs[kept], j.ctl})
	defer c2.Close()
	// The killed member may have led: the write can meet the election and
	// come back ambiguous. A declare is idempotent, so retry it.
	err = c2.DeclareQueue(ctx, "last", ctlapi.QueueOptions{Durable: true})
	for try := 0; try < 20 && errors.Is(err, ctlapi.ErrLeaderChanged); try++ {
		err = c2.DeclareQueue(ctx, "last", ctlapi.QueueOptions{Durable: true})
	}
	if err != nil {
		t.Fatalf("write with members %d and 4 left: %v", kept, err)
	}
	// Member 4 serves the data itself: a follower read sent to it alone.
	c4 := ctlclient.NewClient([]string{j.ctl})
	defer c4.Close()
	w, err := c4.GetWiring(ctx, ctlapi.ReadFollower)
	if err != nil {
		t.Fatal(err)
	}
	if got := queueNames(w); !slices.Equal(got, []string{"after", "before", "last"}) {
		t.Fatalf("member 4 holds queues %v, want [after before last]", got)
	}
	if !strings.Contains(j.logTail(), "joining controller member") {
		t.Errorf("joining broker did not log that it waits to be added:\n%s", j.logTail())
	}

	// The last original member killed, member 4 has no leader: its
	// /readyz says so, and no longer that it is joining (it said so for
	// good, having been started with -controller-join).
	nodes[kept-1].stop(t, syscall.SIGKILL)
	testutil.WaitFor(t, 20*time.Second, func() error {
		code, body := readyz(t, jadmin)
		if code != 503 || !strings.Contains(body, "no leader known") {
			return fmt.Errorf("/readyz %d %q, want 503 with no leader", code, body)
		}
		if strings.Contains(body, "joining") {
			t.Fatalf("/readyz of a member added long ago still says it is joining: %q", body)
		}
		return nil
	})
}

// readyz is the status and body of /readyz at admin.
func readyz(t *testing.T, admin string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + admin + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	return resp.StatusCode, string(b)
}
