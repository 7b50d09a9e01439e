package client

import (
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/berthmq/berth/wire"
)

func TestBuildRanges(t *testing.T) {
	cases := []struct {
		tags []uint64
		want []wire.Range
	}{
		{[]uint64{5}, []wire.Range{rng(5, 5)}},
		{[]uint64{1, 2, 3}, []wire.Range{rng(1, 3)}},
		{[]uint64{3, 1, 2}, []wire.Range{rng(1, 3)}},
		{[]uint64{1, 1, 2, 2, 4}, []wire.Range{rng(1, 2), rng(4, 4)}},
		{[]uint64{10, 7, 8, 1, 3, 2}, []wire.Range{rng(1, 3), rng(7, 8), rng(10, 10)}},
		{[]uint64{^uint64(0), ^uint64(0) - 1}, []wire.Range{rng(^uint64(0)-1, ^uint64(0))}},
	}
	for _, c := range cases {
		orig := slices.Clone(c.tags)
		got := buildRanges(nil, c.tags)
		if !slices.Equal(got, c.want) {
			t.Errorf("buildRanges(%v) = %v, want %v", orig, got, c.want)
		}
		if !slices.Equal(c.tags, orig) {
			t.Errorf("buildRanges reordered its input: %v", c.tags)
		}
	}
	if got := buildRanges(nil, nil); len(got) != 0 {
		t.Errorf("empty input gave %v", got)
	}
}

// TestBuildRangesRandom checks that the ranges cover exactly the tag set,
// are sorted, and never touch (adjacent ranges would have been merged).
func TestBuildRangesRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for iter := 0; iter < 500; iter++ {
		n := r.IntN(200) + 1
		set := map[uint64]bool{}
		tags := make([]uint64, n)
		for i := range tags {
			tags[i] = r.Uint64N(300) + 1
			set[tags[i]] = true
		}
		rs := buildRanges(nil, tags)
		covered := 0
		for i, rg := range rs {
			if rg.First > rg.Last {
				t.Fatalf("inverted range %v", rg)
			}
			if i > 0 && rs[i-1].Last+1 >= rg.First {
				t.Fatalf("ranges %v and %v overlap or touch", rs[i-1], rg)
			}
			for v := rg.First; v <= rg.Last; v++ {
				if !set[v] {
					t.Fatalf("range %v covers %d, not a tag", rg, v)
				}
				covered++
			}
		}
		if covered != len(set) {
			t.Fatalf("covered %d of %d tags", covered, len(set))
		}
	}
}

func TestRangesPerFrame(t *testing.T) {
	if n := rangesPerFrame(wire.FrameSizeMin); n <= 0 || wire.HeaderSize+14+16*n > wire.FrameSizeMin {
		t.Fatalf("rangesPerFrame(min) = %d does not fit", n)
	}
	if n := rangesPerFrame(wire.FrameSizeMax); n != wire.RangesMax {
		t.Fatalf("rangesPerFrame(max) = %d, want %d", n, wire.RangesMax)
	}
	// The frame it sizes must decode.
	per := rangesPerFrame(wire.FrameSizeMin)
	rs := make([]wire.Range, per)
	for i := range rs {
		rs[i] = wire.Range{First: uint64(3 * i), Last: uint64(3*i + 1)}
	}
	b := wire.AppendSettle(nil, wire.Current, wire.TypeAccept, 9, 1, rs)
	_, body, n, err := wire.Next(b, wire.FrameSizeMin)
	if err != nil || n != len(b) {
		t.Fatalf("settle frame of %d ranges: n=%d err=%v", per, n, err)
	}
	var s wire.Settle
	if err := wire.DecodeSettle(body, &s); err != nil || s.Tags.Len() != per {
		t.Fatalf("decode: %v, %d ranges", err, s.Tags.Len())
	}
}

func TestWindowBoundsAndOutOfOrder(t *testing.T) {
	w := newWindow(4)
	var ids []uint64
	for w.canAdd() {
		ids = append(ids, w.add(nil, nil, nil))
	}
	if len(ids) != 4 || ids[0] != 1 || ids[3] != 4 {
		t.Fatalf("ids %v", ids)
	}
	// Complete out of order: the tail only moves past a contiguous prefix.
	if _, ok := w.take(3); !ok {
		t.Fatal("take 3")
	}
	if w.tail != 1 || w.inflight != 3 {
		t.Fatalf("tail %d inflight %d", w.tail, w.inflight)
	}
	if _, ok := w.take(3); ok {
		t.Fatal("took 3 twice")
	}
	if _, ok := w.take(99); ok {
		t.Fatal("took an id never handed out")
	}
	w.take(1)
	if w.tail != 2 {
		t.Fatalf("tail %d, want 2", w.tail)
	}
	// Id 2 stays out while many later ones cycle: the span bound must stop
	// new ids before a slot would be reused.
	added := 0
	for i := 0; i < 100; i++ {
		if !w.canAdd() {
			// Complete everything newer than 2.
			for id := w.tail + 1; id < w.next; id++ {
				w.take(id)
			}
			if !w.canAdd() {
				break
			}
		}
		id := w.add(nil, nil, nil)
		added++
		if id-2 >= uint64(len(w.slots)) {
			t.Fatalf("id %d would share a slot with outstanding id 2", id)
		}
	}
	if added == 100 {
		t.Fatal("span bound never stopped adds while id 2 was out")
	}
	if s, ok := w.take(2); !ok || s.id != 2 {
		t.Fatal("id 2 lost")
	}
}

func TestGroupResolve(t *testing.T) {
	cl := &call{ch: make(chan error, 1)}
	g := &group{remaining: 3, call: cl}
	boom := errors.New("boom")
	for i, err := range []error{nil, boom, nil} {
		cp, ok := resolve(slot{grp: g}, err)
		if ok != (i == 2) {
			t.Fatalf("step %d fired=%v", i, ok)
		}
		if ok {
			cp.fire()
		}
	}
	if err := <-cl.ch; err != boom {
		t.Fatalf("group err %v", err)
	}
}

func rng(first, last uint64) wire.Range { return wire.Range{First: first, Last: last} }
