package main

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berthmq/berth/controlplane/ctlapi"
	"github.com/berthmq/berth/controlplane/ctlclient"
)

// TestElectRefusesBadPreferred: elect with a preferred broker that is not
// registered, or not a replica of a group named, is refused with the
// reason and changes nothing (issue 25 item 7). Before, "elect 0 1
// --preferred 9" reported "2 of 2 groups got a new master", bumped the
// epochs and emptied the SyncStateSets down to the master, and a
// preferred broker outside the replica set got a success with the
// masters unchanged. A group that does not exist is refused too.
func TestElectRefusesBadPreferred(t *testing.T) {
	s := startBroker(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := ctlclient.NewClient([]string{s.ControllerAddr()})
	defer c.Close()
	const groups = 3
	// Two more brokers: three in all, two replicas a group, so each
	// group has a registered broker outside its replica set.
	ids := []uint32{s.BrokerID()}
	for i := range 2 {
		id, err := c.ApplyBrokerID(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.RegisterBroker(ctx, id, []string{"127.0.0.1:" + strconv.Itoa(1+i)}, 1); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if err := c.SetClusterConfig(ctx, ctlapi.ClusterConfig{Groups: groups, Replicas: 2}); err != nil {
		t.Fatal(err)
	}
	var ends []ctlapi.GroupLogEnd
	for g := range uint32(groups) {
		ends = append(ends, ctlapi.GroupLogEnd{Group: g})
	}
	beat := func() {
		for _, id := range ids[1:] {
			if err := c.Heartbeat(ctx, id, ends); err != nil {
				t.Error(err)
			}
		}
	}
	beat()
	// The two keep heartbeating, so that the failure detector never
	// elects anew behind the test's back.
	hbDone, hbStop := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(hbDone)
		tk := time.NewTicker(100 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-hbStop:
				return
			case <-tk.C:
				beat()
			}
		}
	}()
	defer func() { close(hbStop); <-hbDone }()
	// Masters for every group, with a two-member SyncStateSet where both
	// replicas are the test's live brokers.
	mustCtl(t, s, "elect", "0", "1", "2")
	read := func() []ctlapi.Group {
		var out []ctlapi.Group
		for g := range uint32(groups) {
			r, err := c.GetReplicaInfo(ctx, ctlapi.ReadConsistent, g)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, r)
		}
		return out
	}
	same := func(what string, before []ctlapi.Group) {
		t.Helper()
		for i, g := range read() {
			b := before[i]
			if g.Master != b.Master || g.Epoch != b.Epoch || !slices.Equal(g.SyncStateSet, b.SyncStateSet) {
				t.Fatalf("%s changed group %d: %+v, was %+v", what, i, g, b)
			}
		}
	}
	before := read()
	for _, g := range before {
		if g.Master == 0 || g.Epoch == 0 {
			t.Fatalf("group %d has no master after the first election: %+v", g.ID, g)
		}
	}

	code, out, errOut := ctl(t, s, "elect", "0", "1", "--preferred", "9")
	if code != exitFail || !strings.Contains(errOut, "preferred broker 9 is not registered") {
		t.Fatalf("elect --preferred 9: exit %d, stdout %q, stderr %q; want a refusal naming broker 9", code, out, errOut)
	}
	same("elect --preferred 9", before)

	// A registered broker outside group 2's replica set.
	var outside uint32
	for _, id := range ids {
		if !slices.Contains(before[2].Replicas, id) {
			outside = id
		}
	}
	code, out, errOut = ctl(t, s, "elect", "2", "--preferred", strconv.FormatUint(uint64(outside), 10))
	if code != exitFail || !strings.Contains(errOut, "is not a replica of group 2") {
		t.Fatalf("elect 2 --preferred %d (replicas %v): exit %d, stdout %q, stderr %q; want a refusal", outside, before[2].Replicas, code, out, errOut)
	}
	same("elect with a preferred broker outside the replica set", before)

	code, out, errOut = ctl(t, s, "elect", "7")
	if code != exitFail || !strings.Contains(errOut, "group 7 does not exist") {
		t.Fatalf("elect 7 of %d groups: exit %d, stdout %q, stderr %q", groups, code, out, errOut)
	}
	same("elect of a group that does not exist", before)
}
