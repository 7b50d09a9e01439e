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
	// Id 2 stays out while many later ones cycle, far past the ring's
	// span: it moves off the ring and is still there to take, and no
	// slot is handed out twice.
	for i := 0; i < 1000; i++ {
		if !w.canAdd() {
			t.Fatalf("add %d refused with %d out", i, w.inflight)
		}
		id := w.add(nil, nil, nil)
		if s := w.lookup(2); s == nil || s.id != 2 {
			t.Fatalf("id 2 lost after adding %d", id)
		}
		if _, ok := w.take(id); !ok {
			t.Fatalf("took %d: not out", id)
		}
	}
	if len(w.old) != 2 || w.tail <= 4 {
		t.Fatalf("old %v, tail %d: ids 2 and 4 should have moved off the ring", w.old, w.tail)
	}
	if got := w.outIDs(nil); !slices.Equal(got, []uint64{2, 4}) {
		t.Fatalf("out %v; want [2 4]", got)
	}
	if w.oldest() != 2 {
		t.Fatalf("oldest %d, want 2", w.oldest())
	}
	var taken []uint64
	w.takeRange(1, 3, func(s slot) { taken = append(taken, s.id) })
	if !slices.Equal(taken, []uint64{2}) || w.lookup(2) != nil {
		t.Fatalf("takeRange(1, 3) took %v", taken)
	}
	if s, ok := w.take(4); !ok || s.id != 4 || w.inflight != 0 {
		t.Fatalf("id 4: %v %v, %d out", s.id, ok, w.inflight)
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

// TestWindowKeepsRoomForSettles: publishes stop at their share of the
// window while other commands still fit, and a publish held out for long
// (moved off the ring) keeps its slot.
func TestWindowKeepsRoomForSettles(t *testing.T) {
	w := newWindow(64)
	pubs := 0
	for w.canAddPublish() {
		w.addPublish(nil, nil)
		pubs++
	}
	if pubs != 64-windowReserve(64) || windowReserve(64) != 8 {
		t.Fatalf("%d publishes fit in a window of 64; want %d", pubs, 64-windowReserve(64))
	}
	// Settles cycle behind the held publishes, well past twice the window.
	for i := range 10000 {
		if !w.canAdd() {
			t.Fatalf("settle %d does not fit behind %d held publishes", i, pubs)
		}
		id := w.add(nil, nil, nil)
		if _, ok := w.take(id); !ok {
			t.Fatalf("settle %d lost", id)
		}
	}
	for id := uint64(1); id <= uint64(pubs); id++ {
		s, ok := w.take(id)
		if !ok || !s.pub {
			t.Fatalf("publish %d lost after it moved off the ring", id)
		}
	}
	if w.pubs != 0 || w.inflight != 0 || !w.canAddPublish() {
		t.Fatalf("after all completed: %d publishes, %d commands out", w.pubs, w.inflight)
	}
}
