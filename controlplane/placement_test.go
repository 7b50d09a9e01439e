package controlplane

import (
	"fmt"

	"github.com/berthmq/berth/controlplane/ctlapi"
	"slices"
	"testing"
)

// spread is the largest count minus the smallest.
func spread(counts map[uint32]int, brokers []uint32) int {
	lo, hi := counts[brokers[0]], counts[brokers[0]]
	for _, b := range brokers {
		lo, hi = min(lo, counts[b]), max(hi, counts[b])
	}
	return hi - lo
}

// TestPlaceSpreadsEvenly: for several broker counts, replica counts and
// group counts, every group gets min(R, N) distinct registered brokers,
// and each broker holds, and is first master of, as many groups as any
// other give or take one.
func TestPlaceSpreadsEvenly(t *testing.T) {
	for _, n := range []int{1, 2, 3, 4, 5, 7, 9} {
		brokers := make([]uint32, n)
		for i := range brokers {
			brokers[i] = uint32(10 + 3*i) // ids need not be dense
		}
		for _, r := range []int{1, 2, 3, 5} {
			for _, g := range []uint32{1, 2, 3, 5, 7, 8, 16, 64, 100, 1000} {
				t.Run(fmt.Sprintf("brokers=%d/replicas=%d/groups=%d", n, r, g), func(t *testing.T) {
					sets := Place(brokers, g, r)
					if uint32(len(sets)) != g {
						t.Fatalf("%d sets", len(sets))
					}
					held, mastered := map[uint32]int{}, map[uint32]int{}
					for gi, set := range sets {
						if len(set) != min(r, n) {
							t.Fatalf("group %d: set %v, want %d brokers", gi, set, min(r, n))
						}
						sorted := slices.Sorted(slices.Values(set))
						if len(slices.Compact(sorted)) != len(set) {
							t.Fatalf("group %d: set %v repeats a broker", gi, set)
						}
						for _, b := range set {
							if !slices.Contains(brokers, b) {
								t.Fatalf("group %d: broker %d is not registered", gi, b)
							}
							held[b]++
						}
						mastered[set[0]]++
					}
					if s := spread(held, brokers); s > 1 {
						t.Errorf("replicas per broker %v: spread %d", held, s)
					}
					if s := spread(mastered, brokers); s > 1 {
						t.Errorf("first masters per broker %v: spread %d", mastered, s)
					}
					if again := Place(brokers, g, r); !slices.EqualFunc(again, sets, slices.Equal) {
						t.Fatal("Place is not deterministic")
					}
				})
			}
		}
	}
}

// TestPlaceRotates: with G = N and R = N every broker is first master of
// exactly one group (the start rotates by group), and with no brokers the
// groups stay unplaced.
func TestPlaceRotates(t *testing.T) {
	sets := Place([]uint32{1, 2, 3}, 3, 3)
	firsts := []uint32{sets[0][0], sets[1][0], sets[2][0]}
	if !slices.Equal(firsts, []uint32{1, 2, 3}) {
		t.Fatalf("first masters %v, want [1 2 3] (sets %v)", firsts, sets)
	}
	for g, set := range Place(nil, 4, 3) {
		if set != nil {
			t.Fatalf("group %d placed on no broker: %v", g, set)
		}
	}
}

// TestPlacementInState: the SetClusterConfig that creates the groups
// places them over the brokers registered then; only replicas are elected
// and join a SyncStateSet, even by an unclean election; a broker that
// registers later holds nothing and a repeated init moves nothing; a
// replica count above the brokers registered is refused; groups created
// before any broker registered are placed by a later SetClusterConfig.
func TestPlacementInState(t *testing.T) {
	s := newCluster(t, 5, 10) // default: 3 replicas each
	held := map[uint32]int{}
	for g := uint32(0); g < 10; g++ {
		gr, _ := s.Group(g)
		if len(gr.Replicas) != 3 {
			t.Fatalf("group %d replicas %v", g, gr.Replicas)
		}
		for _, b := range gr.Replicas {
			held[b]++
		}
	}
	if spread(held, []uint32{1, 2, 3, 4, 5}) > 1 {
		t.Fatalf("replicas per broker %v", held)
	}
	g0, _ := s.Group(0)
	outsider := uint32(0)
	for b := uint32(1); b <= 5; b++ {
		if !slices.Contains(g0.Replicas, b) {
			outsider = b
		}
	}
	var cands []ctlapi.Candidate
	for b := uint32(1); b <= 5; b++ {
		cands = append(cands, alive(b, 0, 0))
	}
	mustOK(t, s, &ctlapi.ElectMaster{Groups: []ctlapi.ElectGroup{{Group: 0, Candidates: cands}}})
	g0, _ = s.Group(0)
	if g0.Master != g0.Replicas[0] || !slices.Equal(g0.SyncStateSet, slices.Sorted(slices.Values(g0.Replicas))) {
		t.Fatalf("first election of group 0: master %d set %v, replicas %v", g0.Master, g0.SyncStateSet, g0.Replicas)
	}
	if r := s.Apply(&ctlapi.AlterSyncStateSet{Group: 0, Master: g0.Master, Epoch: g0.Epoch, Set: []uint32{g0.Master, outsider}}); r.Code != ctlapi.CodeInvalid {
		t.Fatalf("a non-replica joined the SyncStateSet: %+v", r)
	}
	// Only the outsider is alive: not even an unclean election takes it.
	var dead []ctlapi.Candidate
	for _, b := range g0.Replicas {
		dead = append(dead, ctlapi.Candidate{Broker: b})
	}
	mustOK(t, s, &ctlapi.ElectMaster{Unclean: true, Groups: []ctlapi.ElectGroup{{Group: 0, Epoch: g0.Epoch, Candidates: append(dead, alive(outsider, 1, 100))}}})
	if g, _ := s.Group(0); g.Master != 0 {
		t.Fatalf("broker %d, no replica of group 0 %v, was elected", g.Master, g.Replicas)
	}

	mustOK(t, s, &ctlapi.ApplyBrokerID{})
	mustOK(t, s, &ctlapi.SetClusterConfig{Groups: 10, Replicas: 5})
	for g := uint32(0); g < 10; g++ {
		gr, _ := s.Group(g)
		if slices.Contains(gr.Replicas, 6) || len(gr.Replicas) != 3 {
			t.Fatalf("a repeated init moved group %d: %v", g, gr.Replicas)
		}
	}
	if s.Config().Replicas != 0 {
		t.Fatalf("a repeated init changed the replica count to %d", s.Config().Replicas)
	}

	s2 := NewState()
	mustOK(t, s2, &ctlapi.ApplyBrokerID{})
	mustOK(t, s2, &ctlapi.ApplyBrokerID{})
	if r := s2.Apply(&ctlapi.SetClusterConfig{Groups: 4, Replicas: 3}); r.Code != ctlapi.CodeInvalid {
		t.Fatalf("3 replicas on 2 brokers: %+v", r)
	}
	s3 := NewState()
	mustOK(t, s3, &ctlapi.SetClusterConfig{Groups: 4})
	if g, _ := s3.Group(0); g.Replicas != nil {
		t.Fatalf("placed on no broker: %v", g.Replicas)
	}
	mustOK(t, s3, &ctlapi.ApplyBrokerID{})
	mustOK(t, s3, &ctlapi.ApplyBrokerID{})
	mustOK(t, s3, &ctlapi.SetClusterConfig{Groups: 4})
	for g := uint32(0); g < 4; g++ {
		if gr, _ := s3.Group(g); len(gr.Replicas) != 2 {
			t.Fatalf("group %d placed late on %v, want both brokers", g, gr.Replicas)
		}
	}
	// The placement survives a snapshot.
	r, err := DecodeState(s.Encode())
	if err != nil {
		t.Fatal(err)
	}
	for g := uint32(0); g < 10; g++ {
		a, _ := s.Group(g)
		b, _ := r.Group(g)
		if !slices.Equal(a.Replicas, b.Replicas) {
			t.Fatalf("group %d replicas %v restored as %v", g, a.Replicas, b.Replicas)
		}
	}
}
