package ctlapi

import (
	"bytes"
	"errors"
	"maps"
	"reflect"
	"strings"
	"testing"

	"github.com/berthmq/berth/wire"
)

// TestEveryEventKind: each kind below kindMax has an event type that
// reports that kind and round-trips through the codec; kindMax has none.
func TestEveryEventKind(t *testing.T) {
	for k := EventKind(1); k < kindMax; k++ {
		ev := newEvent(k)
		if ev == nil {
			t.Fatalf("kind %d has no event type", k)
		}
		if ev.Kind() != k {
			t.Fatalf("kind %d makes a %T of kind %d", k, ev, ev.Kind())
		}
		raw := EncodeEvent(nil, ev)
		dec, err := DecodeEvent(raw)
		if err != nil || dec.Kind() != k || !bytes.Equal(EncodeEvent(nil, dec), raw) {
			t.Fatalf("%T: decoded %#v, %v", ev, dec, err)
		}
	}
	if newEvent(kindMax) != nil || newEvent(0) != nil {
		t.Fatal("kind 0 or kindMax makes an event")
	}
	if _, err := DecodeEvent([]byte{byte(kindMax)}); err == nil {
		t.Fatal("an unknown kind decoded")
	}
	if _, err := DecodeEvent(nil); !errors.Is(err, wire.ErrMalformed) {
		t.Fatalf("empty event: %v", err)
	}
}

// TestStringBound: a string longer than StringLenMax is cut when encoded,
// so it still decodes, and a longer one on the wire does not decode.
func TestStringBound(t *testing.T) {
	long := strings.Repeat("x", StringLenMax+100)
	r := wire.NewReader(AppendString(nil, long))
	if got := ReadString(r); got != long[:StringLenMax] || r.Done() != nil {
		t.Fatalf("cut string decoded as %d bytes, %v", len(got), r.Done())
	}
	r = wire.NewReader(wire.AppendStr(nil, long[:StringLenMax+1]))
	if ReadString(r); r.Done() == nil {
		t.Fatal("a string over StringLenMax decoded")
	}
}

func TestProtocolBodies(t *testing.T) {
	ends := []GroupLogEnd{{Group: 3, LogEnd: LogEnd{Epoch: 2, Index: 1 << 40}}, {Group: 9}}
	broker, got, err := DecodeHeartbeat(AppendHeartbeat(nil, 7, ends))
	if err != nil || broker != 7 || !reflect.DeepEqual(got, ends) {
		t.Fatalf("heartbeat: %d %+v %v", broker, got, err)
	}
	if _, _, err := DecodeHeartbeat(AppendHeartbeat(nil, 7, ends)[:20]); err == nil {
		t.Fatal("truncated heartbeat decoded")
	}
	preferred, groups, err := DecodeElect(AppendElect(nil, 4, []uint32{5, 1}))
	if err != nil || preferred != 4 || !reflect.DeepEqual(groups, []uint32{5, 1}) {
		t.Fatalf("elect: %d %v %v", preferred, groups, err)
	}
	res := Result{Code: CodeStaleEpoch, Value: 1 << 50, Msg: "stale"}
	if got, err := DecodeResult(AppendResult(nil, res)); err != nil || got != res {
		t.Fatalf("result: %+v %v", got, err)
	}
	g := Group{ID: 2, Master: 3, Epoch: 4, SyncStateSet: []uint32{3, 5}, ElectedLogEnd: LogEnd{Epoch: 4, Index: 8}}
	r := wire.NewReader(AppendGroup(nil, g))
	if got := ReadGroup(r); r.Done() != nil || !reflect.DeepEqual(got, g) {
		t.Fatalf("group: %+v %v", got, r.Done())
	}
	add := map[uint64]string{6: "10.0.0.6:7402", 4: "10.0.0.4:7402"}
	a, rm, err := DecodeMembersChange(AppendMembersChange(nil, add, []uint64{1, 2}))
	if err != nil || !maps.Equal(a, add) || !reflect.DeepEqual(rm, []uint64{1, 2}) {
		t.Fatalf("members change: %v %v %v", a, rm, err)
	}
	tooMany := map[uint64]string{}
	for id := uint64(1); id <= MembersChangeMax+1; id++ {
		tooMany[id] = "h:1"
	}
	if _, _, err := DecodeMembersChange(AppendMembersChange(nil, tooMany, nil)); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("%d adds: %v", len(tooMany), err)
	}
}

// TestMaxPriorityStored: a queue's max priority rides in the high nibble
// of the stored overflow byte, so it round-trips with each overflow
// policy, and a queue without one stores exactly the bytes it did before
// priorities (the golden file pins those).
func TestMaxPriorityStored(t *testing.T) {
	for _, overflow := range []uint8{wire.OverflowRejectPublish, wire.OverflowDropHead} {
		for _, mp := range []uint8{0, 1, wire.PriorityMax} {
			ev := &DeclareQueue{Name: "q", Options: QueueOptions{Durable: true, Overflow: overflow, MaxPriority: mp, DeadLetterKey: "k"}}
			dec, err := DecodeEvent(EncodeEvent(nil, ev))
			if err != nil {
				t.Fatal(err)
			}
			if got := dec.(*DeclareQueue).Options; got != ev.Options {
				t.Fatalf("overflow %d max priority %d: decoded %+v", overflow, mp, got)
			}
		}
	}
	plain := EncodeEvent(nil, &DeclareQueue{Name: "q", Options: QueueOptions{Overflow: wire.OverflowDropHead}})
	prio := EncodeEvent(nil, &DeclareQueue{Name: "q", Options: QueueOptions{Overflow: wire.OverflowDropHead, MaxPriority: 3}})
	if len(plain) != len(prio) || bytes.Equal(plain, prio) {
		t.Fatalf("max priority changed the stored size or was not stored: % x vs % x", plain, prio)
	}
}
