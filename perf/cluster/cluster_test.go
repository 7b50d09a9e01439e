package cluster

import (
	"fmt"
	"testing"

	"github.com/berthmq/berth/replication"
)

// GroupOf places a queue where the broker does.
func TestGroupOfMatchesBroker(t *testing.T) {
	for i := range 200 {
		name := fmt.Sprintf("q-%d", i)
		for _, n := range []uint32{1, 3, 12, 64} {
			if got, want := GroupOf(name, n), replication.GroupOf(name, n); got != want {
				t.Fatalf("GroupOf(%q, %d) = %d, the broker says %d", name, n, got, want)
			}
		}
	}
}

// Spread finds names in distinct groups, spread evenly over masters and
// their shards.
func TestSpread(t *testing.T) {
	v := &View{Groups: 12, Masters: map[uint32]MasterView{}}
	for g := range uint32(12) {
		v.Masters[g] = MasterView{Broker: g%3 + 1}
	}
	for _, tc := range []struct{ n, shards int }{{6, 2}, {3, 1}, {12, 4}, {9, 2}} {
		prefix, pl, err := Spread(v, "bench", tc.n, tc.shards, 20000)
		if err != nil {
			t.Fatal(err)
		}
		if len(pl) != tc.n {
			t.Fatalf("%d placements, want %d", len(pl), tc.n)
		}
		groups := map[uint32]bool{}
		perBroker := map[uint32]int{}
		perCell := map[[2]uint32]int{}
		for i, p := range pl {
			if p.Queue != fmt.Sprintf("%s-%d", prefix, i) || p.Group != GroupOf(p.Queue, 12) || p.Master != p.Group%3+1 || p.Shard != int(p.Group)%tc.shards {
				t.Fatalf("placement %+v", p)
			}
			groups[p.Group] = true
			perBroker[p.Master]++
			perCell[[2]uint32{p.Master, uint32(p.Shard)}]++
		}
		if len(groups) != tc.n {
			t.Errorf("n=%d shards=%d: %d distinct groups", tc.n, tc.shards, len(groups))
		}
		for b, c := range perBroker {
			if c != tc.n/3 {
				t.Errorf("n=%d shards=%d: broker %d masters %d queues: %+v", tc.n, tc.shards, b, c, pl)
			}
		}
		if tc.n%(3*tc.shards) == 0 {
			for cell, c := range perCell {
				if c != tc.n/(3*tc.shards) || len(perCell) != 3*tc.shards {
					t.Errorf("n=%d shards=%d: cell %v has %d queues: %+v", tc.n, tc.shards, cell, c, pl)
				}
			}
		}
	}
	if _, _, err := Spread(&View{}, "x", 3, 1, 10); err == nil {
		t.Error("spread over no groups")
	}
}
