package controlplane

import (
	"bytes"
	"fmt"
	"math/rand"
	"reflect"
	"slices"
	"testing"
)

// newCluster returns a state with brokers 1..n registered and G groups.
func newCluster(t *testing.T, n int, groups uint32) *State {
	t.Helper()
	s := NewState()
	for i := 1; i <= n; i++ {
		mustOK(t, s, &ApplyBrokerID{})
		mustOK(t, s, &RegisterBroker{ID: uint32(i), Addrs: []string{fmt.Sprintf("127.0.0.1:%d", 7400+i)}, Version: 0x0100})
	}
	mustOK(t, s, &SetClusterConfig{Groups: groups})
	return s
}

func mustOK(t *testing.T, s *State, ev Event) Result {
	t.Helper()
	// Every event also goes through the codec, as it would through the log.
	dec, err := DecodeEvent(EncodeEvent(nil, ev))
	if err != nil {
		t.Fatalf("codec %T: %v", ev, err)
	}
	if !reflect.DeepEqual(dec, ev) {
		t.Fatalf("codec round trip: %#v != %#v", dec, ev)
	}
	r := s.Apply(dec)
	if r.Code != CodeOK {
		t.Fatalf("apply %T: %v", ev, r.Err())
	}
	return r
}

func alive(id uint32, epoch uint32, index uint64) Candidate {
	return Candidate{Broker: id, Alive: true, LogEnd: LogEnd{epoch, index}}
}

func dead(id uint32) Candidate { return Candidate{Broker: id} }

func TestBrokerIDs(t *testing.T) {
	s := NewState()
	if r := s.Apply(&ApplyBrokerID{}); r.Value != 1 {
		t.Fatalf("first id %d", r.Value)
	}
	if r := s.Apply(&ApplyBrokerID{Requested: 5}); r.Code != CodeOK || r.Value != 5 {
		t.Fatalf("requested 5: %+v", r)
	}
	if r := s.Apply(&ApplyBrokerID{Requested: 5}); r.Code != CodeConflict {
		t.Fatalf("duplicate id accepted: %+v", r)
	}
	if r := s.Apply(&ApplyBrokerID{}); r.Value != 6 {
		t.Fatalf("next id after 5 is %d", r.Value)
	}
	if r := s.Apply(&RegisterBroker{ID: 9}); r.Code != CodeNotFound {
		t.Fatalf("register of unknown id: %+v", r)
	}
	s.Apply(&RegisterBroker{ID: 1, Version: 0x0102})
	s.Apply(&RegisterBroker{ID: 5, Version: 0x0101})
	if v := s.ClusterVersion(); v != 0x0101 {
		t.Fatalf("cluster version %x, want lowest 0x0101", v)
	}
	s.Apply(&CleanBrokerData{ID: 5})
	if v := s.ClusterVersion(); v != 0x0102 {
		t.Fatalf("cluster version after clean %x", v)
	}
}

// TestElection is a table of elections applied to a fresh 4-broker cluster
// whose group 0 first elected broker 1 with SyncStateSet {1,2,3}.
func TestElection(t *testing.T) {
	first := ElectGroup{Group: 0, Epoch: 0, Preferred: 1, Candidates: []Candidate{
		alive(1, 0, 0), alive(2, 0, 0), alive(3, 0, 0)}}
	tests := []struct {
		name        string
		clusterOpt  bool // cluster config unclean election
		ev          ElectMaster
		wantMaster  uint32
		wantEpoch   uint32
		wantSet     []uint32
		wantElected uint64
	}{
		{"master alive keeps group", false, ElectMaster{Groups: []ElectGroup{{Group: 0, Epoch: 1,
			Candidates: []Candidate{alive(1, 1, 5), alive(2, 1, 9)}}}}, 1, 1, []uint32{1, 2, 3}, 0},
		{"highest log end in set wins", false, ElectMaster{Groups: []ElectGroup{{Group: 0, Epoch: 1,
			Candidates: []Candidate{dead(1), alive(2, 1, 7), alive(3, 1, 9)}}}}, 3, 2, []uint32{3}, 1},
		{"epoch beats index", false, ElectMaster{Groups: []ElectGroup{{Group: 0, Epoch: 1,
			Candidates: []Candidate{dead(1), alive(2, 2, 1), alive(3, 1, 900)}}}}, 2, 2, []uint32{2}, 1},
		{"outside set is not clean", false, ElectMaster{Groups: []ElectGroup{{Group: 0, Epoch: 1,
			Candidates: []Candidate{dead(1), dead(2), dead(3), alive(4, 1, 100)}}}}, 0, 2, nil, 1},
		{"unclean by event", false, ElectMaster{Unclean: true, Groups: []ElectGroup{{Group: 0, Epoch: 1,
			Candidates: []Candidate{dead(1), dead(2), dead(3), alive(4, 1, 100)}}}}, 4, 2, []uint32{4}, 1},
		{"unclean by cluster config", true, ElectMaster{Groups: []ElectGroup{{Group: 0, Epoch: 1,
			Candidates: []Candidate{dead(1), alive(4, 1, 100)}}}}, 4, 2, []uint32{4}, 1},
		{"clean preferred over unclean", false, ElectMaster{Unclean: true, Groups: []ElectGroup{{Group: 0, Epoch: 1,
			Candidates: []Candidate{dead(1), alive(2, 1, 1), alive(4, 1, 100)}}}}, 2, 2, []uint32{2}, 1},
		{"stale epoch ignored", false, ElectMaster{Groups: []ElectGroup{{Group: 0, Epoch: 0,
			Candidates: []Candidate{dead(1), alive(2, 1, 7)}}}}, 1, 1, []uint32{1, 2, 3}, 0},
		{"tie goes to preferred", false, ElectMaster{Groups: []ElectGroup{{Group: 0, Epoch: 1, Preferred: 3,
			Candidates: []Candidate{dead(1), alive(2, 1, 7), alive(3, 1, 7)}}}}, 3, 2, []uint32{3}, 1},
		{"preferred forces handover from live master", false, ElectMaster{Groups: []ElectGroup{{Group: 0, Epoch: 1, Preferred: 2,
			Candidates: []Candidate{alive(1, 1, 7), alive(2, 1, 7)}}}}, 2, 2, []uint32{2}, 1},
		{"unknown group ignored", false, ElectMaster{Groups: []ElectGroup{{Group: 99, Epoch: 1,
			Candidates: []Candidate{alive(2, 1, 7)}}}}, 1, 1, []uint32{1, 2, 3}, 0},
		{"unregistered candidate ignored", false, ElectMaster{Groups: []ElectGroup{{Group: 0, Epoch: 1,
			Candidates: []Candidate{dead(1), alive(77, 9, 9), alive(2, 1, 1)}}}}, 2, 2, []uint32{2}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newCluster(t, 4, 4)
			if tt.clusterOpt {
				mustOK(t, s, &SetClusterConfig{Groups: 4, UncleanElection: true})
			}
			mustOK(t, s, &ElectMaster{Groups: []ElectGroup{first}})
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

func TestElectionSpreadsTies(t *testing.T) {
	s := newCluster(t, 3, 30)
	ev := &ElectMaster{}
	for g := uint32(0); g < 30; g++ {
		ev.Groups = append(ev.Groups, ElectGroup{Group: g, Candidates: []Candidate{alive(1, 0, 0), alive(2, 0, 0), alive(3, 0, 0)}})
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
	mustOK(t, s, &ElectMaster{Groups: []ElectGroup{{Group: 0, Preferred: 1, Candidates: []Candidate{alive(1, 0, 0)}}}})
	tests := []struct {
		ev   AlterSyncStateSet
		code uint8
		set  []uint32
	}{
		{AlterSyncStateSet{Group: 0, Master: 1, Epoch: 1, Set: []uint32{3, 1, 1}}, CodeOK, []uint32{1, 3}},
		{AlterSyncStateSet{Group: 0, Master: 1, Epoch: 0, Set: []uint32{1, 2}}, CodeStaleEpoch, []uint32{1, 3}},
		{AlterSyncStateSet{Group: 0, Master: 2, Epoch: 1, Set: []uint32{1, 2}}, CodeStaleEpoch, []uint32{1, 3}},
		{AlterSyncStateSet{Group: 0, Master: 1, Epoch: 1, Set: []uint32{2}}, CodeInvalid, []uint32{1, 3}},
		{AlterSyncStateSet{Group: 0, Master: 1, Epoch: 1, Set: []uint32{1, 8}}, CodeNotFound, []uint32{1, 3}},
		{AlterSyncStateSet{Group: 5, Master: 1, Epoch: 1, Set: []uint32{1}}, CodeNotFound, []uint32{1, 3}},
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
		ev   Event
		code uint8
	}{
		{&DeclareExchange{Name: "x", Type: "direct", Durable: true}, CodeOK},
		{&DeclareExchange{Name: "x", Type: "direct", Durable: true}, CodeOK},
		{&DeclareExchange{Name: "x", Type: "fanout"}, CodeConflict},
		{&DeclareQueue{Name: "q", Options: QueueOptions{Durable: true, MaxLength: 10}}, CodeOK},
		{&DeclareQueue{Name: "q", Options: QueueOptions{Durable: false}}, CodeConflict},
		{&Bind{Exchange: "x", Queue: "q", Key: "k"}, CodeOK},
		{&Bind{Exchange: "nope", Queue: "q", Key: "k"}, CodeNotFound},
		{&Bind{Exchange: "x", Queue: "nope", Key: "k"}, CodeNotFound},
		{&DeclareQueue{Name: "q2"}, CodeOK},
		{&Bind{Exchange: "x", Queue: "q2", Key: "k"}, CodeOK},
		{&Unbind{Exchange: "x", Queue: "q2", Key: "other"}, CodeNotFound},
		{&DeleteQueue{Name: "q"}, CodeOK},
		{&DeleteQueue{Name: "q"}, CodeNotFound},
	}
	for i, st := range steps {
		if r := s.Apply(st.ev); r.Code != st.code {
			t.Fatalf("step %d %T: code %d want %d (%s)", i, st.ev, r.Code, st.code, r.Msg)
		}
	}
	w := s.Wiring()
	if len(w.Queues) != 1 || w.Queues[0].Name != "q2" || len(w.Bindings) != 1 || w.Bindings[0] != (Binding{"x", "q2", "k"}) {
		t.Fatalf("wiring %+v", w)
	}
	s.Apply(&DeleteExchange{Name: "x"})
	if w := s.Wiring(); len(w.Bindings) != 0 || len(w.Exchanges) != 0 || len(s.byQueue) != 0 {
		t.Fatalf("delete exchange left %+v", w)
	}
}

func TestClusterConfigGroupsFixed(t *testing.T) {
	s := NewState()
	if r := s.Apply(&SetClusterConfig{Groups: 8, Mode: ModeActivePassive}); r.Code != CodeOK {
		t.Fatal(r.Err())
	}
	if r := s.Apply(&SetClusterConfig{Groups: 9}); r.Code != CodeConflict {
		t.Fatalf("group count changed: %+v", r)
	}
	if r := s.Apply(&SetClusterConfig{Groups: 8, UncleanElection: true}); r.Code != CodeOK || !s.Config().UncleanElection {
		t.Fatalf("config update: %+v", r)
	}
	if s.GroupCount() != 8 {
		t.Fatalf("groups %d", s.GroupCount())
	}
}

// randomEvent draws from a small name space so events interact.
func randomEvent(r *rand.Rand) Event {
	name := func() string { return fmt.Sprintf("n%d", r.Intn(4)) }
	ids := func() []uint32 {
		var out []uint32
		for i := 0; i < 1+r.Intn(3); i++ {
			out = append(out, uint32(1+r.Intn(5)))
		}
		return out
	}
	switch EventKind(1 + r.Intn(int(kindMax)-1)) {
	case KindApplyBrokerID:
		return &ApplyBrokerID{Requested: uint32(r.Intn(3))}
	case KindRegisterBroker:
		return &RegisterBroker{ID: uint32(1 + r.Intn(5)), Addrs: []string{name()}, Version: uint16(0x100 + r.Intn(3))}
	case KindElectMaster:
		ev := &ElectMaster{Unclean: r.Intn(4) == 0}
		for i := 0; i < 1+r.Intn(3); i++ {
			g := ElectGroup{Group: uint32(r.Intn(5)), Epoch: uint32(r.Intn(3)), Preferred: uint32(r.Intn(3))}
			for _, id := range ids() {
				g.Candidates = append(g.Candidates, Candidate{Broker: id, Alive: r.Intn(3) != 0, LogEnd: LogEnd{uint32(r.Intn(3)), uint64(r.Intn(10))}})
			}
			ev.Groups = append(ev.Groups, g)
		}
		return ev
	case KindAlterSyncStateSet:
		return &AlterSyncStateSet{Group: uint32(r.Intn(4)), Master: uint32(r.Intn(5)), Epoch: uint32(r.Intn(3)), Set: ids()}
	case KindCleanBrokerData:
		return &CleanBrokerData{ID: uint32(1 + r.Intn(5))}
	case KindDeclareExchange:
		return &DeclareExchange{Name: name(), Type: []string{"direct", "topic"}[r.Intn(2)]}
	case KindDeclareQueue:
		return &DeclareQueue{Name: name(), Options: QueueOptions{Durable: r.Intn(2) == 0, DeadLetterExchange: name()}}
	case KindBind:
		return &Bind{name(), name(), name()}
	case KindUnbind:
		return &Unbind{name(), name(), name()}
	case KindDeleteQueue:
		return &DeleteQueue{Name: name()}
	case KindDeleteExchange:
		return &DeleteExchange{Name: name()}
	case KindSetClusterConfig:
		return &SetClusterConfig{Groups: 4, Mode: uint8(r.Intn(2)), UncleanElection: r.Intn(2) == 0}
	case KindElectPrimary:
		ev := &ElectPrimary{Epoch: uint32(r.Intn(4)), Preferred: uint32(r.Intn(7)) * uint32(r.Intn(2))}
		for _, id := range ids() {
			ev.Candidates = append(ev.Candidates, PrimaryCandidate{Broker: id, Alive: r.Intn(3) != 0, Data: uint64(r.Intn(3))})
		}
		return ev
	default:
		return &SetAttribute{Key: name(), Value: name()}
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
			raw := EncodeEvent(nil, ev)
			evA, err := DecodeEvent(raw)
			if err != nil {
				t.Fatalf("seed %d: decode: %v", seed, err)
			}
			evB, _ := DecodeEvent(raw)
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
		raw := EncodeEvent(nil, randomEvent(r))
		for cut := 0; cut < len(raw); cut++ {
			if _, err := DecodeEvent(raw[:cut]); err == nil {
				t.Fatalf("truncated event decoded: %x", raw[:cut])
			}
		}
	}
	if _, err := DecodeEvent([]byte{200}); err == nil {
		t.Fatal("unknown kind decoded")
	}
	// A count claiming more items than bytes left must not allocate.
	if _, err := DecodeEvent([]byte{byte(KindElectMaster), 0, 0xff, 0xff, 0xff, 0xff}); err == nil {
		t.Fatal("huge count decoded")
	}
	if _, err := DecodeState([]byte{snapshotFormat, 0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff}); err == nil {
		t.Fatal("bad snapshot decoded")
	}
}

func FuzzDecodeEvent(f *testing.F) {
	r := rand.New(rand.NewSource(1))
	for i := 0; i < 20; i++ {
		f.Add(EncodeEvent(nil, randomEvent(r)))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		ev, err := DecodeEvent(b)
		if err != nil {
			return
		}
		NewState().Apply(ev) // must not panic
		if !bytes.Equal(EncodeEvent(nil, ev), b) {
			t.Fatalf("re-encode differs")
		}
	})
}

func TestValidateEvent(t *testing.T) {
	bad := []Event{
		&DeclareQueue{Name: ""},
		&DeclareExchange{Name: "x", Type: "weird"},
		&Bind{Exchange: "x", Queue: ""},
		&SetClusterConfig{Groups: 0},
		&ElectMaster{},
		&AlterSyncStateSet{Group: 1},
		&RegisterBroker{ID: 0},
		nil,
	}
	for _, ev := range bad {
		if err := ValidateEvent(ev); err == nil {
			t.Fatalf("%#v validated", ev)
		}
	}
	if err := ValidateEvent(&DeclareQueue{Name: "ok"}); err != nil {
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
			before := make([]Group, 6)
			for g := range before {
				before[g], _ = s.Group(uint32(g))
			}
			var ev Event
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
				ev = &AlterSyncStateSet{Group: g, Master: cur.Master, Epoch: cur.Epoch, Set: set}
			case 1:
				if r.Intn(10) == 0 {
					ev = &CleanBrokerData{ID: uint32(1 + r.Intn(5))}
				} else {
					id := uint32(1 + r.Intn(5))
					if _, ok := s.Broker(id); !ok {
						ev = &ApplyBrokerID{Requested: id}
					}
				}
			default:
				em := &ElectMaster{Unclean: r.Intn(5) == 0}
				for g := uint32(0); g < 6; g++ {
					if r.Intn(2) == 0 {
						continue
					}
					cur, _ := s.Group(g)
					eg := ElectGroup{Group: g, Epoch: cur.Epoch}
					if r.Intn(4) == 0 {
						eg.Preferred = uint32(1 + r.Intn(5))
					}
					for b := uint32(1); b <= 5; b++ {
						eg.Candidates = append(eg.Candidates, Candidate{Broker: b, Alive: r.Intn(3) != 0,
							LogEnd: LogEnd{uint32(r.Intn(3)), uint64(r.Intn(5))}})
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
				em, ok := ev.(*ElectMaster)
				if !ok || after.Epoch == old.Epoch {
					continue
				}
				var eg *ElectGroup
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
				var win Candidate
				for _, c := range eg.Candidates {
					if c.Broker == after.Master {
						win = c
					}
				}
				inSet := slices.Contains(old.SyncStateSet, after.Master)
				if !inSet && !em.Unclean {
					t.Fatalf("seed %d step %d: group %d clean election chose %d outside %v", seed, step, g, after.Master, old.SyncStateSet)
				}
				for _, c := range eg.Candidates {
					_, registered := s.Broker(c.Broker)
					if c.Alive && registered && slices.Contains(old.SyncStateSet, c.Broker) == inSet && win.LogEnd.Less(c.LogEnd) {
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
