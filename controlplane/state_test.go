package controlplane

import (
	"bytes"
	"fmt"
	"math/rand"
	"reflect"
	"slices"
	"testing"

	"github.com/berthmq/berth/controlplane/ctlapi"
)

// newCluster returns a state with brokers 1..n registered and G groups.
func newCluster(t *testing.T, n int, groups uint32) *State {
	t.Helper()
	return newClusterReplicas(t, n, groups, 0)
}

// newClusterReplicas is newCluster with replicas brokers per group (0:
// the default).
func newClusterReplicas(t *testing.T, n int, groups, replicas uint32) *State {
	t.Helper()
	s := NewState()
	for i := 1; i <= n; i++ {
		mustOK(t, s, &ctlapi.ApplyBrokerID{})
		mustOK(t, s, &ctlapi.RegisterBroker{ID: uint32(i), Addrs: []string{fmt.Sprintf("127.0.0.1:%d", 7400+i)}, Version: 0x0100})
	}
	mustOK(t, s, &ctlapi.SetClusterConfig{Groups: groups, Replicas: replicas})
	return s
}

func mustOK(t *testing.T, s *State, ev ctlapi.Event) ctlapi.Result {
	t.Helper()
	// Every event also goes through the codec, as it would through the log.
	dec, err := ctlapi.DecodeEvent(ctlapi.EncodeEvent(nil, ev))
	if err != nil {
		t.Fatalf("codec %T: %v", ev, err)
	}
	if !reflect.DeepEqual(dec, ev) {
		t.Fatalf("codec round trip: %#v != %#v", dec, ev)
	}
	r := s.Apply(dec)
	if r.Code != ctlapi.CodeOK {
		t.Fatalf("apply %T: %v", ev, r.Err())
	}
	return r
}

func alive(id uint32, epoch uint32, index uint64) ctlapi.Candidate {
	return ctlapi.Candidate{Broker: id, Alive: true, LogEnd: ctlapi.LogEnd{Epoch: epoch, Index: index}}
}

func dead(id uint32) ctlapi.Candidate { return ctlapi.Candidate{Broker: id} }

func TestBrokerIDs(t *testing.T) {
	s := NewState()
	if r := s.Apply(&ctlapi.ApplyBrokerID{}); r.Value != 1 {
		t.Fatalf("first id %d", r.Value)
	}
	if r := s.Apply(&ctlapi.ApplyBrokerID{Requested: 5}); r.Code != ctlapi.CodeOK || r.Value != 5 {
		t.Fatalf("requested 5: %+v", r)
	}
	if r := s.Apply(&ctlapi.ApplyBrokerID{Requested: 5}); r.Code != ctlapi.CodeConflict {
		t.Fatalf("duplicate id accepted: %+v", r)
	}
	if r := s.Apply(&ctlapi.ApplyBrokerID{}); r.Value != 6 {
		t.Fatalf("next id after 5 is %d", r.Value)
	}
	if r := s.Apply(&ctlapi.RegisterBroker{ID: 9}); r.Code != ctlapi.CodeNotFound {
		t.Fatalf("register of unknown id: %+v", r)
	}
	s.Apply(&ctlapi.RegisterBroker{ID: 1, Version: 0x0102})
	s.Apply(&ctlapi.RegisterBroker{ID: 5, Version: 0x0101})
	if v := s.ClusterVersion(); v != 0x0101 {
		t.Fatalf("cluster version %x, want lowest 0x0101", v)
	}
	s.Apply(&ctlapi.CleanBrokerData{ID: 5})
	if v := s.ClusterVersion(); v != 0x0102 {
		t.Fatalf("cluster version after clean %x", v)
	}
}

// TestElection is a table of elections applied to a fresh 4-broker cluster
// with every broker a replica of every group, whose group 0 first elected
// broker 1 with SyncStateSet {1,2,3}.
func TestElection(t *testing.T) {
	first := ctlapi.ElectGroup{Group: 0, Epoch: 0, Preferred: 1, Candidates: []ctlapi.Candidate{
		alive(1, 0, 0), alive(2, 0, 0), alive(3, 0, 0)}}
	tests := []struct {
		name        string
		clusterOpt  bool // cluster config unclean election
		ev          ctlapi.ElectMaster
		wantMaster  uint32
		wantEpoch   uint32
		wantSet     []uint32
		wantElected uint64
	}{
		{"master alive keeps group", false, ctlapi.ElectMaster{Groups: []ctlapi.ElectGroup{{Group: 0, Epoch: 1,
			Candidates: []ctlapi.Candidate{alive(1, 1, 5), alive(2, 1, 9)}}}}, 1, 1, []uint32{1, 2, 3}, 0},
		{"highest log end in set wins", false, ctlapi.ElectMaster{Groups: []ctlapi.ElectGroup{{Group: 0, Epoch: 1,
			Candidates: []ctlapi.Candidate{dead(1), alive(2, 1, 7), alive(3, 1, 9)}}}}, 3, 2, []uint32{3}, 1},
		{"epoch beats index", false, ctlapi.ElectMaster{Groups: []ctlapi.ElectGroup{{Group: 0, Epoch: 1,
			Candidates: []ctlapi.Candidate{dead(1), alive(2, 2, 1), alive(3, 1, 900)}}}}, 2, 2, []uint32{2}, 1},
		// Fenced: no master, and the set kept for when one of it is back.
		{"outside set is not clean", false, ctlapi.ElectMaster{Groups: []ctlapi.ElectGroup{{Group: 0, Epoch: 1,
			Candidates: []ctlapi.Candidate{dead(1), dead(2), dead(3), alive(4, 1, 100)}}}}, 0, 2, []uint32{1, 2, 3}, 1},
		{"unclean by event", false, ctlapi.ElectMaster{Unclean: true, Groups: []ctlapi.ElectGroup{{Group: 0, Epoch: 1,
			Candidates: []ctlapi.Candidate{dead(1), dead(2), dead(3), alive(4, 1, 100)}}}}, 4, 2, []uint32{4}, 1},
		{"unclean by cluster config", true, ctlapi.ElectMaster{Groups: []ctlapi.ElectGroup{{Group: 0, Epoch: 1,
			Candidates: []ctlapi.Candidate{dead(1), alive(4, 1, 100)}}}}, 4, 2, []uint32{4}, 1},
		{"clean preferred over unclean", false, ctlapi.ElectMaster{Unclean: true, Groups: []ctlapi.ElectGroup{{Group: 0, Epoch: 1,
			Candidates: []ctlapi.Candidate{dead(1), alive(2, 1, 1), alive(4, 1, 100)}}}}, 2, 2, []uint32{2}, 1},
		{"stale epoch ignored", false, ctlapi.ElectMaster{Groups: []ctlapi.ElectGroup{{Group: 0, Epoch: 0,
			Candidates: []ctlapi.Candidate{dead(1), alive(2, 1, 7)}}}}, 1, 1, []uint32{1, 2, 3}, 0},
		{"tie goes to preferred", false, ctlapi.ElectMaster{Groups: []ctlapi.ElectGroup{{Group: 0, Epoch: 1, Preferred: 3,
			Candidates: []ctlapi.Candidate{dead(1), alive(2, 1, 7), alive(3, 1, 7)}}}}, 3, 2, []uint32{3}, 1},
		{"preferred forces handover from live master", false, ctlapi.ElectMaster{Groups: []ctlapi.ElectGroup{{Group: 0, Epoch: 1, Preferred: 2,
			Candidates: []ctlapi.Candidate{alive(1, 1, 7), alive(2, 1, 7)}}}}, 2, 2, []uint32{2}, 1},
		{"unknown group ignored", false, ctlapi.ElectMaster{Groups: []ctlapi.ElectGroup{{Group: 99, Epoch: 1,
			Candidates: []ctlapi.Candidate{alive(2, 1, 7)}}}}, 1, 1, []uint32{1, 2, 3}, 0},
		{"unregistered candidate ignored", false, ctlapi.ElectMaster{Groups: []ctlapi.ElectGroup{{Group: 0, Epoch: 1,
			Candidates: []ctlapi.Candidate{dead(1), alive(77, 9, 9), alive(2, 1, 1)}}}}, 2, 2, []uint32{2}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newClusterReplicas(t, 4, 4, 4)
			if tt.clusterOpt {
				mustOK(t, s, &ctlapi.SetClusterConfig{Groups: 4, UncleanElection: true})
			}
			mustOK(t, s, &ctlapi.ElectMaster{Groups: []ctlapi.ElectGroup{first}})
			if g, _ := s.Group(0); g.Master != 1 || g.Epoch != 1 || !slices.Equal(g.SyncStateSet, []uint32{1, 2, 3}) {
				t.Fatalf("first election: %+v", g)
			}
			r := mustOK(t, s, &tt.ev)
			g, _ := s.Group(0)
			if g.Master != tt.wantMaster || g.Epoch != tt.wantEpoch || !slices.Equal(g.SyncStateSet, tt.wantSet) || r.Value != tt.wantElected {
				t.Fatalf("got master %d epoch %d set %v elected %d; want %d %d %v %d",
					g.Master, g.Epoch, g.SyncStateSet, r.Value, tt.wantMaster, tt.wantEpoch, tt.wantSet, tt.wantElected)
			}
			mastered := s.GroupsMasteredBy(tt.wantMaster)
			if tt.wantMaster != 0 && !slices.Contains(mastered, 0) {
				t.Fatalf("masterOf index misses group 0 for %d: %v", tt.wantMaster, mastered)
			}
			if tt.wantMaster != 1 && slices.Contains(s.GroupsMasteredBy(1), 0) {
				t.Fatalf("masterOf index still lists old master")
			}
		})
	}
}

// TestFencedGroupElectsReturningMember: a group fenced because no member
// of its set was alive elects the first member of that set to come back,
// and never a broker outside it.
func TestFencedGroupElectsReturningMember(t *testing.T) {
	s := newCluster(t, 4, 4)
	mustOK(t, s, &ctlapi.ElectMaster{Groups: []ctlapi.ElectGroup{{Group: 0, Epoch: 0, Preferred: 1,
		Candidates: []ctlapi.Candidate{alive(1, 0, 0), alive(2, 0, 0)}}}})
	mustOK(t, s, &ctlapi.AlterSyncStateSet{Group: 0, Master: 1, Epoch: 1, Set: []uint32{1}})
	mustOK(t, s, &ctlapi.ElectMaster{Groups: []ctlapi.ElectGroup{{Group: 0, Epoch: 1,
		Candidates: []ctlapi.Candidate{dead(1), alive(2, 1, 9)}}}})
	if g, _ := s.Group(0); g.Master != 0 || g.Epoch != 2 || !slices.Equal(g.SyncStateSet, []uint32{1}) {
		t.Fatalf("fenced: %+v", g)
	}
	mustOK(t, s, &ctlapi.ElectMaster{Groups: []ctlapi.ElectGroup{{Group: 0, Epoch: 2,
		Candidates: []ctlapi.Candidate{dead(1), alive(2, 1, 9), alive(3, 1, 9)}}}})
	if g, _ := s.Group(0); g.Master != 0 || g.Epoch != 2 {
		t.Fatalf("a broker outside the set was elected: %+v", g)
	}
	mustOK(t, s, &ctlapi.ElectMaster{Groups: []ctlapi.ElectGroup{{Group: 0, Epoch: 2,
		Candidates: []ctlapi.Candidate{alive(1, 1, 5), alive(2, 1, 9)}}}})
	if g, _ := s.Group(0); g.Master != 1 || g.Epoch != 3 || !slices.Equal(g.SyncStateSet, []uint32{1}) {
		t.Fatalf("the returning member was not elected: %+v", g)
	}
}

func TestElectionSpreadsTies(t *testing.T) {
	s := newCluster(t, 3, 30)
	ev := &ctlapi.ElectMaster{}
	for g := uint32(0); g < 30; g++ {
		ev.Groups = append(ev.Groups, ctlapi.ElectGroup{Group: g, Candidates: []ctlapi.Candidate{alive(1, 0, 0), alive(2, 0, 0), alive(3, 0, 0)}})
	}
	if r := mustOK(t, s, ev); r.Value != 30 {
		t.Fatalf("elected %d groups", r.Value)
	}
	for b := uint32(1); b <= 3; b++ {
		if n := len(s.GroupsMasteredBy(b)); n != 10 {
			t.Fatalf("broker %d masters %d groups, want 10", b, n)
		}
	}
}

func TestAlterSyncStateSet(t *testing.T) {
	s := newCluster(t, 3, 1)
	mustOK(t, s, &ctlapi.ElectMaster{Groups: []ctlapi.ElectGroup{{Group: 0, Preferred: 1, Candidates: []ctlapi.Candidate{alive(1, 0, 0)}}}})
	tests := []struct {
		ev   ctlapi.AlterSyncStateSet
		code uint8
		set  []uint32
	}{
		{ctlapi.AlterSyncStateSet{Group: 0, Master: 1, Epoch: 1, Set: []uint32{3, 1, 1}}, ctlapi.CodeOK, []uint32{1, 3}},
		{ctlapi.AlterSyncStateSet{Group: 0, Master: 1, Epoch: 0, Set: []uint32{1, 2}}, ctlapi.CodeStaleEpoch, []uint32{1, 3}},
		{ctlapi.AlterSyncStateSet{Group: 0, Master: 2, Epoch: 1, Set: []uint32{1, 2}}, ctlapi.CodeStaleEpoch, []uint32{1, 3}},
		{ctlapi.AlterSyncStateSet{Group: 0, Master: 1, Epoch: 1, Set: []uint32{2}}, ctlapi.CodeInvalid, []uint32{1, 3}},
		{ctlapi.AlterSyncStateSet{Group: 0, Master: 1, Epoch: 1, Set: []uint32{1, 8}}, ctlapi.CodeNotFound, []uint32{1, 3}},
		{ctlapi.AlterSyncStateSet{Group: 5, Master: 1, Epoch: 1, Set: []uint32{1}}, ctlapi.CodeNotFound, []uint32{1, 3}},
		// Made from the set the group has: granted. A late copy of an
		// older request, made from a set changed since: refused.
		{ctlapi.AlterSyncStateSet{Group: 0, Master: 1, Epoch: 1, Set: []uint32{1, 2, 3}, From: []uint32{3, 1}}, ctlapi.CodeOK, []uint32{1, 2, 3}},
		{ctlapi.AlterSyncStateSet{Group: 0, Master: 1, Epoch: 1, Set: []uint32{1, 2}, From: []uint32{1, 2, 3}}, ctlapi.CodeOK, []uint32{1, 2}},
		{ctlapi.AlterSyncStateSet{Group: 0, Master: 1, Epoch: 1, Set: []uint32{1, 2, 3}, From: []uint32{1, 3}}, ctlapi.CodeStaleEpoch, []uint32{1, 2}},
	}
	for i, tt := range tests {
		if r := s.Apply(&tt.ev); r.Code != tt.code {
			t.Fatalf("%d: code %d want %d (%s)", i, r.Code, tt.code, r.Msg)
		}
		if g, _ := s.Group(0); !slices.Equal(g.SyncStateSet, tt.set) {
			t.Fatalf("%d: set %v want %v", i, g.SyncStateSet, tt.set)
		}
	}
}

func TestWiring(t *testing.T) {
	s := NewState()
	steps := []struct {
		ev   ctlapi.Event
		code uint8
	}{
		{&ctlapi.DeclareExchange{Name: "x", Type: "direct", Durable: true}, ctlapi.CodeOK},
		{&ctlapi.DeclareExchange{Name: "x", Type: "direct", Durable: true}, ctlapi.CodeOK},
		{&ctlapi.DeclareExchange{Name: "x", Type: "fanout"}, ctlapi.CodeConflict},
		{&ctlapi.DeclareQueue{Name: "q", Options: ctlapi.QueueOptions{Durable: true, MaxLength: 10}}, ctlapi.CodeOK},
		{&ctlapi.DeclareQueue{Name: "q", Options: ctlapi.QueueOptions{Durable: false}}, ctlapi.CodeConflict},
		{&ctlapi.Bind{Exchange: "x", Queue: "q", Key: "k"}, ctlapi.CodeOK},
		{&ctlapi.Bind{Exchange: "nope", Queue: "q", Key: "k"}, ctlapi.CodeNotFound},
		{&ctlapi.Bind{Exchange: "x", Queue: "nope", Key: "k"}, ctlapi.CodeNotFound},
		{&ctlapi.DeclareQueue{Name: "q2"}, ctlapi.CodeOK},
		{&ctlapi.Bind{Exchange: "x", Queue: "q2", Key: "k"}, ctlapi.CodeOK},
		{&ctlapi.Unbind{Exchange: "x", Queue: "q2", Key: "other"}, ctlapi.CodeNotFound},
		{&ctlapi.DeleteQueue{Name: "q"}, ctlapi.CodeOK},
		{&ctlapi.DeleteQueue{Name: "q"}, ctlapi.CodeNotFound},
	}
	for i, st := range steps {
		if r := s.Apply(st.ev); r.Code != st.code {
			t.Fatalf("step %d %T: code %d want %d (%s)", i, st.ev, r.Code, st.code, r.Msg)
		}
	}
	w := s.Wiring()
	if len(w.Queues) != 1 || w.Queues[0].Name != "q2" || len(w.Bindings) != 1 || w.Bindings[0] != (ctlapi.Binding{Exchange: "x", Queue: "q2", Key: "k"}) {
		t.Fatalf("wiring %+v", w)
	}
	s.Apply(&ctlapi.DeleteExchange{Name: "x"})
	if w := s.Wiring(); len(w.Bindings) != 0 || len(w.Exchanges) != 0 || len(s.byQueue) != 0 {
		t.Fatalf("delete exchange left %+v", w)
	}
}

func TestClusterConfigGroupsFixed(t *testing.T) {
	s := NewState()
	if r := s.Apply(&ctlapi.SetClusterConfig{Groups: 8, Mode: ctlapi.ModeActivePassive}); r.Code != ctlapi.CodeOK {
		t.Fatal(r.Err())
	}
	if r := s.Apply(&ctlapi.SetClusterConfig{Groups: 9}); r.Code != ctlapi.CodeConflict {
		t.Fatalf("group count changed: %+v", r)
	}
	if r := s.Apply(&ctlapi.SetClusterConfig{Groups: 8, UncleanElection: true}); r.Code != ctlapi.CodeOK || !s.Config().UncleanElection {
		t.Fatalf("config update: %+v", r)
	}
	if s.GroupCount() != 8 {
		t.Fatalf("groups %d", s.GroupCount())
	}
}

// randomEvent draws from a small name space so events interact.
func randomEvent(r *rand.Rand) ctlapi.Event {
	name := func() string { return fmt.Sprintf("n%d", r.Intn(4)) }
	ids := func() []uint32 {
		var out []uint32
		for i := 0; i < 1+r.Intn(3); i++ {
			out = append(out, uint32(1+r.Intn(5)))
		}
		return out
	}
	// KindElectPrimary is the last kind; a new kind needs a case here.
	switch ctlapi.EventKind(1 + r.Intn(int(ctlapi.KindElectPrimary))) {
	case ctlapi.KindApplyBrokerID:
		return &ctlapi.ApplyBrokerID{Requested: uint32(r.Intn(3))}
	case ctlapi.KindRegisterBroker:
		return &ctlapi.RegisterBroker{ID: uint32(1 + r.Intn(5)), Addrs: []string{name()}, Version: uint16(0x100 + r.Intn(3))}
	case ctlapi.KindElectMaster:
		ev := &ctlapi.ElectMaster{Unclean: r.Intn(4) == 0}
		for i := 0; i < 1+r.Intn(3); i++ {
			g := ctlapi.ElectGroup{Group: uint32(r.Intn(5)), Epoch: uint32(r.Intn(3)), Preferred: uint32(r.Intn(3))}
			for _, id := range ids() {
				g.Candidates = append(g.Candidates, ctlapi.Candidate{Broker: id, Alive: r.Intn(3) != 0, LogEnd: ctlapi.LogEnd{Epoch: uint32(r.Intn(3)), Index: uint64(r.Intn(10))}})
			}
			ev.Groups = append(ev.Groups, g)
		}
		return ev
	case ctlapi.KindAlterSyncStateSet:
		return &ctlapi.AlterSyncStateSet{Group: uint32(r.Intn(4)), Master: uint32(r.Intn(5)), Epoch: uint32(r.Intn(3)), Set: ids()}
	case ctlapi.KindCleanBrokerData:
		return &ctlapi.CleanBrokerData{ID: uint32(1 + r.Intn(5))}
	case ctlapi.KindDeclareExchange:
		return &ctlapi.DeclareExchange{Name: name(), Type: []string{"direct", "topic"}[r.Intn(2)]}
	case ctlapi.KindDeclareQueue:
		return &ctlapi.DeclareQueue{Name: name(), Options: ctlapi.QueueOptions{Durable: r.Intn(2) == 0, DeadLetterExchange: name()}}
	case ctlapi.KindBind:
		return &ctlapi.Bind{Exchange: name(), Queue: name(), Key: name()}
	case ctlapi.KindUnbind:
		return &ctlapi.Unbind{Exchange: name(), Queue: name(), Key: name()}
	case ctlapi.KindDeleteQueue:
		return &ctlapi.DeleteQueue{Name: name()}
	case ctlapi.KindDeleteExchange:
		return &ctlapi.DeleteExchange{Name: name()}
	case ctlapi.KindSetClusterConfig:
		return &ctlapi.SetClusterConfig{Groups: 4, Mode: uint8(r.Intn(2)), UncleanElection: r.Intn(2) == 0}
	case ctlapi.KindElectPrimary:
		ev := &ctlapi.ElectPrimary{Epoch: uint32(r.Intn(4)), Preferred: uint32(r.Intn(7)) * uint32(r.Intn(2))}
		for _, id := range ids() {
			ev.Candidates = append(ev.Candidates, ctlapi.PrimaryCandidate{Broker: id, Alive: r.Intn(3) != 0, Data: uint64(r.Intn(3))})
		}
		return ev
	default:
		return &ctlapi.SetAttribute{Key: name(), Value: name()}
	}
}

// TestDeterminism applies the same random log to two states, one of which
// is snapshotted and restored part way, and requires identical bytes and
// identical results: the property raft replication relies on.
func TestDeterminism(t *testing.T) {
	for seed := int64(1); seed <= 20; seed++ {
		r := rand.New(rand.NewSource(seed))
		a, b := NewState(), NewState()
		for i := 0; i < 400; i++ {
			ev := randomEvent(r)
			raw := ctlapi.EncodeEvent(nil, ev)
			evA, err := ctlapi.DecodeEvent(raw)
			if err != nil {
				t.Fatalf("seed %d: decode: %v", seed, err)
			}
			evB, _ := ctlapi.DecodeEvent(raw)
			ra, rb := a.Apply(evA), b.Apply(evB)
			if ra != rb {
				t.Fatalf("seed %d step %d: results differ %+v %+v", seed, i, ra, rb)
			}
			if i%97 == 0 {
				restored, err := DecodeState(decompressMust(t, compressSnapshot(b.Encode())))
				if err != nil {
					t.Fatalf("seed %d: restore: %v", seed, err)
				}
				b = restored
			}
		}
		ea, eb := a.Encode(), b.Encode()
		if !bytes.Equal(ea, eb) {
			t.Fatalf("seed %d: states differ after snapshot restore", seed)
		}
		for id := uint32(0); id < 6; id++ {
			if !slices.Equal(a.GroupsMasteredBy(id), b.GroupsMasteredBy(id)) {
				t.Fatalf("seed %d: masterOf index differs for %d", seed, id)
			}
			for _, g := range a.GroupsMasteredBy(id) {
				if gg, _ := a.Group(g); gg.Master != id {
					t.Fatalf("seed %d: index says %d masters %d, group says %d", seed, id, g, gg.Master)
				}
			}
		}
	}
}

func decompressMust(t *testing.T, b []byte) []byte {
	t.Helper()
	raw, err := decompressSnapshot(b)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

func TestDecodeRejectsGarbage(t *testing.T) {
	r := rand.New(rand.NewSource(3))
	for i := 0; i < 2000; i++ {
		raw := ctlapi.EncodeEvent(nil, randomEvent(r))
		for cut := 0; cut < len(raw); cut++ {
			if _, err := ctlapi.DecodeEvent(raw[:cut]); err == nil {
				t.Fatalf("truncated event decoded: %x", raw[:cut])
			}
		}
	}
	if _, err := ctlapi.DecodeEvent([]byte{200}); err == nil {
		t.Fatal("unknown kind decoded")
	}
	// A count claiming more items than bytes left must not allocate.
	if _, err := ctlapi.DecodeEvent([]byte{byte(ctlapi.KindElectMaster), 0, 0xff, 0xff, 0xff, 0xff}); err == nil {
		t.Fatal("huge count decoded")
	}
	if _, err := DecodeState([]byte{snapshotFormat, 0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff}); err == nil {
		t.Fatal("bad snapshot decoded")
	}
}

func FuzzDecodeEvent(f *testing.F) {
	r := rand.New(rand.NewSource(1))
	for i := 0; i < 20; i++ {
		f.Add(ctlapi.EncodeEvent(nil, randomEvent(r)))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		ev, err := ctlapi.DecodeEvent(b)
		if err != nil {
			return
		}
		NewState().Apply(ev) // must not panic
		if !bytes.Equal(ctlapi.EncodeEvent(nil, ev), b) {
			t.Fatalf("re-encode differs")
		}
	})
}

func TestValidateEvent(t *testing.T) {
	bad := []ctlapi.Event{
		&ctlapi.DeclareQueue{Name: ""},
		&ctlapi.DeclareExchange{Name: "x", Type: "weird"},
		&ctlapi.Bind{Exchange: "x", Queue: ""},
		&ctlapi.SetClusterConfig{Groups: 0},
		&ctlapi.ElectMaster{},
		&ctlapi.AlterSyncStateSet{Group: 1},
		&ctlapi.RegisterBroker{ID: 0},
		nil,
	}
	for _, ev := range bad {
		if err := ctlapi.ValidateEvent(ev); err == nil {
			t.Fatalf("%#v validated", ev)
		}
	}
	if err := ctlapi.ValidateEvent(&ctlapi.DeclareQueue{Name: "ok"}); err != nil {
		t.Fatal(err)
	}
}

// TestElectionInvariants drives random elections, SyncStateSet changes and
// broker removals through the state machine and checks, after every event,
// the rules a replication group relies on: epochs never go back, a master
// is registered and in its SyncStateSet, a clean election never picks a
// broker outside the set or one behind another live in-sync candidate, and
// a group whose master lives keeps it unless a preferred broker is named.
func TestElectionInvariants(t *testing.T) {
	for seed := int64(1); seed <= 30; seed++ {
		r := rand.New(rand.NewSource(seed))
		s := newCluster(t, 5, 6)
		epochs := make([]uint32, 6)
		reelected := 0
		for step := 0; step < 300; step++ {
			before := make([]ctlapi.Group, 6)
			for g := range before {
				before[g], _ = s.Group(uint32(g))
			}
			var ev ctlapi.Event
			switch r.Intn(10) {
			case 0:
				g := uint32(r.Intn(6))
				cur, _ := s.Group(g)
				set := []uint32{cur.Master}
				for b := uint32(1); b <= 5; b++ {
					if r.Intn(2) == 0 {
						set = append(set, b)
					}
				}
				ev = &ctlapi.AlterSyncStateSet{Group: g, Master: cur.Master, Epoch: cur.Epoch, Set: set}
			case 1:
				if r.Intn(10) == 0 {
					ev = &ctlapi.CleanBrokerData{ID: uint32(1 + r.Intn(5))}
				} else {
					id := uint32(1 + r.Intn(5))
					if _, ok := s.Broker(id); !ok {
						ev = &ctlapi.ApplyBrokerID{Requested: id}
					}
				}
			default:
				em := &ctlapi.ElectMaster{Unclean: r.Intn(5) == 0}
				for g := uint32(0); g < 6; g++ {
					if r.Intn(2) == 0 {
						continue
					}
					cur, _ := s.Group(g)
					eg := ctlapi.ElectGroup{Group: g, Epoch: cur.Epoch}
					if r.Intn(4) == 0 {
						eg.Preferred = uint32(1 + r.Intn(5))
					}
					for b := uint32(1); b <= 5; b++ {
						eg.Candidates = append(eg.Candidates, ctlapi.Candidate{Broker: b, Alive: r.Intn(3) != 0,
							LogEnd: ctlapi.LogEnd{Epoch: uint32(r.Intn(3)), Index: uint64(r.Intn(5))}})
					}
					em.Groups = append(em.Groups, eg)
				}
				if len(em.Groups) > 0 {
					ev = em
				}
			}
			if ev == nil {
				continue
			}
			s.Apply(ev)
			for g := uint32(0); g < 6; g++ {
				after, _ := s.Group(g)
				old := before[g]
				if after.Epoch < epochs[g] {
					t.Fatalf("seed %d step %d: group %d epoch went back %d -> %d", seed, step, g, epochs[g], after.Epoch)
				}
				epochs[g] = after.Epoch
				if after.Master != 0 {
					if _, ok := s.Broker(after.Master); !ok {
						t.Fatalf("seed %d step %d: group %d master %d not registered", seed, step, g, after.Master)
					}
					if !slices.Contains(after.SyncStateSet, after.Master) {
						t.Fatalf("seed %d step %d: group %d master %d outside its set %v", seed, step, g, after.Master, after.SyncStateSet)
					}
				}
				em, ok := ev.(*ctlapi.ElectMaster)
				if !ok || after.Epoch == old.Epoch {
					continue
				}
				var eg *ctlapi.ElectGroup
				for i := range em.Groups {
					if em.Groups[i].Group == g {
						eg = &em.Groups[i]
					}
				}
				if eg == nil {
					t.Fatalf("seed %d step %d: group %d changed without being named", seed, step, g)
				}
				if old.Master != 0 && candidateAlive(eg, old.Master) && (eg.Preferred == 0 || eg.Preferred == old.Master) {
					t.Fatalf("seed %d step %d: group %d lost live master %d", seed, step, g, old.Master)
				}
				if after.Master == 0 || old.Epoch == 0 {
					continue
				}
				reelected++
				var win ctlapi.Candidate
				for _, c := range eg.Candidates {
					if c.Broker == after.Master {
						win = c
					}
				}
				if !slices.Contains(after.Replicas, after.Master) {
					t.Fatalf("seed %d step %d: group %d elected %d outside its replicas %v", seed, step, g, after.Master, after.Replicas)
				}
				inSet := slices.Contains(old.SyncStateSet, after.Master)
				if !inSet && !em.Unclean {
					t.Fatalf("seed %d step %d: group %d clean election chose %d outside %v", seed, step, g, after.Master, old.SyncStateSet)
				}
				for _, c := range eg.Candidates {
					_, registered := s.Broker(c.Broker)
					if c.Alive && registered && slices.Contains(after.Replicas, c.Broker) && slices.Contains(old.SyncStateSet, c.Broker) == inSet && win.LogEnd.Less(c.LogEnd) {
						t.Fatalf("seed %d step %d: group %d chose %d at %v over %d at %v", seed, step, g, after.Master, win.LogEnd, c.Broker, c.LogEnd)
					}
				}
			}
		}
		if reelected < 20 {
			t.Fatalf("seed %d: only %d re-elections; the schedule checks too little", seed, reelected)
		}
	}
}
