package controlplane

import (
	"bytes"
	"fmt"
	"reflect"
	"testing"

	"github.com/berthmq/berth/controlplane/ctlapi"
	"github.com/berthmq/berth/controlplane/internal/golden"
	"github.com/berthmq/berth/wire"
)

// The golden files in testdata pin the controller's encodings (see package
// internal/golden); rewrite them with -rewrite only for a versioned change.

// goldenEvents is one event of every kind, every field set.
func goldenEvents() []ctlapi.Event {
	return []ctlapi.Event{
		&ctlapi.RegisterBroker{ID: 7, Addrs: []string{"10.0.0.7:7400", "[::1]:7400"}, Version: 0x0102},
		&ctlapi.ApplyBrokerID{Requested: 9},
		&ctlapi.ElectMaster{Unclean: true, Groups: []ctlapi.ElectGroup{
			{Group: 2, Epoch: 3, Preferred: 7, Candidates: []ctlapi.Candidate{
				{Broker: 7, Alive: true, LogEnd: ctlapi.LogEnd{Epoch: 3, Index: 1 << 40}},
				{Broker: 8, LogEnd: ctlapi.LogEnd{Epoch: 2, Index: 5}},
			}},
			{Group: 5},
		}},
		&ctlapi.AlterSyncStateSet{Group: 2, Master: 7, Epoch: 4, Set: []uint32{7, 8, 9}},
		&ctlapi.CleanBrokerData{ID: 8},
		&ctlapi.DeclareExchange{Name: "ex", Type: "topic", Durable: true},
		&ctlapi.DeclareQueue{Name: "q", Options: ctlapi.QueueOptions{Durable: true, Exclusive: true, AutoDelete: true,
			MessageTTLMs: 60000, MaxLength: 1000, Overflow: wire.OverflowRejectPublish, DeadLetterExchange: "dlx",
			MaxDeliveries: 5, MaxLengthBytes: 1 << 30, DeadLetterKey: "dead"}},
		&ctlapi.Bind{Exchange: "ex", Queue: "q", Key: "a.*.c"},
		&ctlapi.Unbind{Exchange: "ex", Queue: "q", Key: "a.#"},
		&ctlapi.DeleteQueue{Name: "q2"},
		&ctlapi.DeleteExchange{Name: "ex2"},
		&ctlapi.SetClusterConfig{Groups: 4, Mode: ctlapi.ModeActivePassive, UncleanElection: true},
		&ctlapi.SetAttribute{Key: "k", Value: "v\x00\xff"},
		&ctlapi.ElectPrimary{Epoch: 2, Preferred: 8, Candidates: []ctlapi.PrimaryCandidate{{Broker: 7, Alive: true, Data: 1 << 33}, {Broker: 8}}},
		&ctlapi.ElectPrimary{Epoch: 3},
		&ctlapi.AddUser{User: goldenUser()},
		&ctlapi.SetUserCredentials{Name: "alice", Credentials: goldenCredentials(9)},
		&ctlapi.SetPermissions{Name: "alice", Permissions: ctlapi.Permissions{Configure: "", Write: "amq\\..*|orders", Read: ".*"}},
		&ctlapi.RemoveUser{Name: "bob"},
		&ctlapi.SetClusterConfig{Groups: 4, Replicas: 3},
		// Later versions write From after Set; without it the event is
		// encoded as before (the entry above).
		&ctlapi.AlterSyncStateSet{Group: 2, Master: 7, Epoch: 4, Set: []uint32{7, 8, 9}, From: []uint32{7, 9}},
	}
}

func goldenCredentials(seed byte) ctlapi.Credentials {
	fill := func(n int, b byte) []byte { return bytes.Repeat([]byte{b}, n) }
	return ctlapi.Credentials{Salt: fill(16, seed), Iterations: 4096, StoredKey: fill(32, seed+1), ServerKey: fill(32, seed+2)}
}

func goldenUser() ctlapi.User {
	return ctlapi.User{Name: "alice", Credentials: goldenCredentials(1),
		Permissions: ctlapi.Permissions{Configure: "alice-.*", Write: ".*", Read: "alice-.*|orders"}}
}

// goldenState is a state with something in every part a snapshot holds.
func goldenState(t *testing.T) *State {
	s := NewState()
	for _, ev := range []ctlapi.Event{
		&ctlapi.ApplyBrokerID{},
		&ctlapi.ApplyBrokerID{Requested: 7},
		&ctlapi.ApplyBrokerID{},
		&ctlapi.RegisterBroker{ID: 1, Addrs: []string{"10.0.0.1:7400"}, Version: 0x0101},
		&ctlapi.RegisterBroker{ID: 7, Addrs: []string{"10.0.0.7:7400", "10.0.1.7:7400"}, Version: 0x0102},
		&ctlapi.RegisterBroker{ID: 8, Addrs: []string{"10.0.0.8:7400"}, Version: 0x0102},
		&ctlapi.SetClusterConfig{Groups: 3, Mode: ctlapi.ModeActivePassive, UncleanElection: true},
		&ctlapi.ElectMaster{Groups: []ctlapi.ElectGroup{{Group: 1, Candidates: []ctlapi.Candidate{{Broker: 7, Alive: true}, {Broker: 8, Alive: true}, {Broker: 1, Alive: true}}}}},
		&ctlapi.ElectMaster{Groups: []ctlapi.ElectGroup{{Group: 1, Epoch: 1, Candidates: []ctlapi.Candidate{
			{Broker: 8, Alive: true, LogEnd: ctlapi.LogEnd{Epoch: 1, Index: 42}}, {Broker: 1, Alive: true, LogEnd: ctlapi.LogEnd{Epoch: 1, Index: 41}}}}}},
		&ctlapi.AlterSyncStateSet{Group: 1, Master: 8, Epoch: 2, Set: []uint32{8, 1}},
		&ctlapi.DeclareExchange{Name: "ex", Type: "topic", Durable: true},
		&ctlapi.DeclareExchange{Name: "fan", Type: "fanout"},
		goldenEvents()[6], // the queue with every option
		// Zero options but the overflow byte, which the old zero value
		// stored as drop-head: the stored bytes stay as they were.
		&ctlapi.DeclareQueue{Name: "plain", Options: ctlapi.QueueOptions{Overflow: wire.OverflowDropHead}},
		&ctlapi.Bind{Exchange: "ex", Queue: "q", Key: "a.*.c"},
		&ctlapi.Bind{Exchange: "fan", Queue: "plain"},
		&ctlapi.SetAttribute{Key: "k", Value: "v"},
		&ctlapi.SetAttribute{Key: "a", Value: "b"},
		&ctlapi.ElectPrimary{Epoch: 0, Candidates: []ctlapi.PrimaryCandidate{{Broker: 7, Alive: true, Data: 3}, {Broker: 8, Alive: true, Data: 9}}},
	} {
		if r := s.Apply(ev); r.Code != ctlapi.CodeOK {
			t.Fatalf("golden state: apply %T: %v", ev, r.Err())
		}
	}
	s.applyMembership(map[uint64]string{1: "10.0.0.1:7402", 2: "10.0.0.2:7402", 3: "10.0.0.3:7402"})
	return s
}

// TestGoldenStoredEncodings pins what controllers store: events, the state
// snapshot and a membership change's address book. Stored bytes must also
// decode back to what wrote them.
func TestGoldenStoredEncodings(t *testing.T) {
	var got []golden.Entry
	for i, ev := range goldenEvents() {
		got = append(got, golden.Entry{Name: fmt.Sprintf("event/%d-%s", i, reflect.TypeOf(ev).Elem().Name()), Bytes: ctlapi.EncodeEvent(nil, ev)})
	}
	s := goldenState(t)
	got = append(got, golden.Entry{Name: "state", Bytes: s.Encode()})
	book := map[uint64]string{1: "10.0.0.1:7402", 4: "10.0.0.4:7402"}
	got = append(got, golden.Entry{Name: "address-book", Bytes: encodeAddressBook(book)})
	withUsers := goldenState(t)
	for _, ev := range []ctlapi.Event{&ctlapi.AddUser{User: goldenUser()},
		&ctlapi.AddUser{User: ctlapi.User{Name: "bob", Credentials: goldenCredentials(5)}}} {
		if r := withUsers.Apply(ev); r.Code != ctlapi.CodeOK {
			t.Fatal(r.Err())
		}
	}
	got = append(got, golden.Entry{Name: "state-with-users", Bytes: withUsers.Encode()})
	golden.Check(t, "stored.golden", got)
	if *golden.Rewrite {
		return
	}
	// What was stored decodes to what was written, and encodes the same.
	stored := golden.Read(t, "stored.golden")
	byName := map[string][]byte{}
	for _, e := range stored {
		byName[e.Name] = e.Bytes
	}
	su, err := DecodeState(byName["state-with-users"])
	if err != nil {
		t.Fatalf("stored state with users: %v", err)
	}
	if !bytes.Equal(su.Encode(), byName["state-with-users"]) {
		t.Error("stored state with users decodes to a state that encodes differently")
	}
	if u, ok := su.User("alice"); !ok || !reflect.DeepEqual(u, goldenUser()) {
		t.Errorf("stored state: user alice is %+v", u)
	}
	if len(su.Users()) != 2 {
		t.Errorf("stored state: users %+v", su.Users())
	}
	for i, ev := range goldenEvents() {
		dec, err := ctlapi.DecodeEvent(stored[i].Bytes)
		if err != nil {
			t.Fatalf("%s: %v", stored[i].Name, err)
		}
		if !bytes.Equal(ctlapi.EncodeEvent(nil, dec), stored[i].Bytes) {
			t.Errorf("%s: decoded %+v, which encodes differently", stored[i].Name, dec)
		}
		if dec.Kind() != ev.Kind() {
			t.Errorf("%s: decoded kind %d", stored[i].Name, dec.Kind())
		}
	}
	st, err := DecodeState(byName["state"])
	if err != nil {
		t.Fatalf("stored state: %v", err)
	}
	if !bytes.Equal(st.Encode(), byName["state"]) {
		t.Error("stored state decodes to a state that encodes differently")
	}
	if p, e := st.Primary(); p != 8 || e != 1 {
		t.Errorf("stored state: primary %d/%d, want 8/1", p, e)
	}
	if g, _ := st.Group(1); g.Master != 8 || g.Epoch != 2 || len(g.SyncStateSet) != 2 {
		t.Errorf("stored state: group 1 is %+v", g)
	}
	if got := st.GroupsMasteredBy(8); len(got) != 1 || got[0] != 1 {
		t.Errorf("stored state: broker 8 masters %v, want [1]", got)
	}
	b, err := decodeAddressBook(byName["address-book"])
	if err != nil || len(b) != 2 || b[4] != "10.0.0.4:7402" {
		t.Errorf("stored address book: %v %v", b, err)
	}
}

// TestGoldenReplies pins the service's replies, which clients of other
// builds decode.
func TestGoldenReplies(t *testing.T) {
	s := goldenState(t)
	var got []golden.Entry
	for _, q := range []struct {
		name string
		q    readQuery
	}{
		{"wiring", readQuery{query: ctlapi.QueryWiring}},
		{"groups", readQuery{query: ctlapi.QueryGroups, start: 1, count: 5}},
		{"brokers", readQuery{query: ctlapi.QueryBrokers}},
		{"next-broker-id", readQuery{query: ctlapi.QueryNextBrokerID}},
		{"attribute", readQuery{query: ctlapi.QueryAttribute, key: "k"}},
		{"attribute-missing", readQuery{query: ctlapi.QueryAttribute, key: "none"}},
		{"cluster-info", readQuery{query: ctlapi.QueryClusterInfo}},
		{"sync-state-set", readQuery{query: ctlapi.QuerySyncStateSet, group: 1}},
		{"sync-state-set-missing", readQuery{query: ctlapi.QuerySyncStateSet, group: 9}},
		{"primary", readQuery{query: ctlapi.QueryPrimary}},
	} {
		got = append(got, golden.Entry{Name: "read/" + q.name, Bytes: q.q.appendAnswer(nil, s)})
	}
	withUser := goldenState(t)
	if r := withUser.Apply(&ctlapi.AddUser{User: goldenUser()}); r.Code != ctlapi.CodeOK {
		t.Fatal(r.Err())
	}
	got = append(got, golden.Entry{Name: "read/users", Bytes: (&readQuery{query: ctlapi.QueryUsers}).appendAnswer(nil, withUser)})
	got = append(got, golden.Entry{Name: "result", Bytes: ctlapi.AppendResult(nil, ctlapi.Result{Code: ctlapi.CodeConflict, Value: 1<<32 + 5, Msg: "exchange \"ex\" exists"})})
	_, _, lag := errorStatus(&ctlapi.LaggingError{Leader: "10.0.0.1:7402", Behind: 1234})
	got = append(got, golden.Entry{Name: "lagging", Bytes: lag})
	golden.Check(t, "replies.golden", got)
}
