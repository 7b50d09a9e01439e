package wire

import (
	"reflect"
	"testing"
)

func TestGroupMessageRoundTrip(t *testing.T) {
	msgs := []GroupMessage{
		{Group: 7, Kind: GroupAppend, From: 1, To: 2, Epoch: 3, PrevIndex: 10, PrevEpoch: 2, Commit: 9,
			Entries: []GroupEntry{{Epoch: 3, Index: 11, Data: []byte("a")}, {Epoch: 3, Index: 12, Data: []byte{}}}},
		{Group: 1, Kind: GroupAppend, From: 2, To: 3, Epoch: 1},
		{Group: 9, Kind: GroupAppendResp, From: 2, To: 1, Epoch: 3, OK: true, Match: 11, Last: 12},
		{Group: 9, Kind: GroupAppendResp, From: 2, To: 1, Epoch: 3, HintEpoch: 2, HintIndex: 5},
		{Group: 4, Kind: GroupInstall, From: 1, To: 3, Epoch: 5, PrevIndex: 1000, PrevEpoch: 4, Commit: 1200},
	}
	for _, m := range msgs {
		frame := AppendGroupMessage(nil, &m)
		h, body, n, err := Next(frame, FrameSizeMax)
		if err != nil || n != len(frame) || h.Type != TypeGroupMessage {
			t.Fatalf("frame: %v %d %v", err, n, h)
		}
		var got GroupMessage
		if err := DecodeGroupMessage(body, &got); err != nil {
			t.Fatal(err)
		}
		for i := range got.Entries {
			if len(got.Entries[i].Data) == 0 {
				got.Entries[i].Data = m.Entries[i].Data // nil and empty alike
			}
		}
		if !reflect.DeepEqual(got, m) {
			t.Fatalf("round trip\n got %+v\nwant %+v", got, m)
		}
		// Decoded data does not alias the frame.
		if len(got.Entries) > 0 && len(got.Entries[0].Data) > 0 {
			body[len(body)-1] ^= 0xff
			for i := range body {
				body[i] = 0
			}
			if string(got.Entries[0].Data) != string(m.Entries[0].Data) {
				t.Fatal("decoded entries alias the read buffer")
			}
		}
	}
	// An install carries no entries.
	bad := AppendGroupMessage(nil, &GroupMessage{Kind: GroupAppend, Entries: []GroupEntry{{Index: 1}}})
	bad[HeaderSize+4] = GroupInstall
	if _, body, _, err := Next(bad, FrameSizeMax); err != nil {
		t.Fatal(err)
	} else if err := DecodeGroupMessage(body, &GroupMessage{}); err == nil {
		t.Fatal("an install with entries decoded")
	}
	hello := AppendGroupHello(nil, 42, Current)
	_, body, _, err := Next(hello, FrameSizeMax)
	if err != nil {
		t.Fatal(err)
	}
	if id, v, err := DecodeGroupHello(body); err != nil || id != 42 || v != Current {
		t.Fatalf("hello: %d %v %v", id, v, err)
	}
}

func TestGroupMessageRejectsBadInput(t *testing.T) {
	m := GroupMessage{Group: 7, Kind: GroupAppend, From: 1, To: 2, Epoch: 3,
		Entries: []GroupEntry{{Epoch: 3, Index: 11, Data: []byte("abc")}}}
	frame := AppendGroupMessage(nil, &m)
	_, body, _, _ := Next(frame, FrameSizeMax)
	for cut := range len(body) {
		var got GroupMessage
		if err := DecodeGroupMessage(body[:cut], &got); err == nil {
			t.Fatalf("a body cut to %d of %d bytes decoded", cut, len(body))
		}
	}
	bad := append([]byte(nil), body...)
	bad[4] = 9 // unknown kind
	var got GroupMessage
	if err := DecodeGroupMessage(bad, &got); err == nil {
		t.Fatal("unknown kind decoded")
	}
	// A count far beyond what the body holds is refused before any
	// allocation for it.
	huge := append([]byte(nil), body[:17+20]...)
	huge = append(huge, 0xff, 0xff, 0xff, 0xff)
	if err := DecodeGroupMessage(huge, &got); err == nil {
		t.Fatal("an entry count larger than the body decoded")
	}
}

func FuzzGroupMessage(f *testing.F) {
	m := GroupMessage{Group: 7, Kind: GroupAppend, From: 1, To: 2, Epoch: 3,
		Entries: []GroupEntry{{Epoch: 3, Index: 11, Data: []byte("abc")}}}
	frame := AppendGroupMessage(nil, &m)
	f.Add(frame[HeaderSize:])
	resp := GroupMessage{Group: 1, Kind: GroupAppendResp, OK: true, Match: 3}
	f.Add(AppendGroupMessage(nil, &resp)[HeaderSize:])
	f.Fuzz(func(t *testing.T, body []byte) {
		var got GroupMessage
		if DecodeGroupMessage(body, &got) != nil {
			return
		}
		again := AppendGroupMessage(nil, &got)
		var back GroupMessage
		if err := DecodeGroupMessage(again[HeaderSize:], &back); err != nil {
			t.Fatalf("re-encoded message does not decode: %v", err)
		}
	})
}

// TestGroupMessageSizeBound: the size AppendGroupMessage reserves covers
// the frame, so it grows its buffer once.
func TestGroupMessageSizeBound(t *testing.T) {
	for _, m := range []GroupMessage{
		{Kind: GroupAppend, Entries: []GroupEntry{{Data: make([]byte, 1024)}, {Data: nil}, {Data: make([]byte, 7)}}},
		{Kind: GroupAppend},
		{Kind: GroupAppendResp, OK: true},
	} {
		if got, bound := len(AppendGroupMessage(nil, &m)), groupMessageSize(&m); got > bound {
			t.Fatalf("frame of %d bytes, reserved %d", got, bound)
		}
	}
}

// TestGroupMessageOwned: DecodeGroupMessageOwned decodes what
// DecodeGroupMessage does, its entries alias the body, each capped at its
// own end (an append to one does not write over the next), and
// GroupMessageKindOf reads the kind from the body's first bytes.
func TestGroupMessageOwned(t *testing.T) {
	m := GroupMessage{Group: 2, Kind: GroupAppend, From: 1, To: 2, Epoch: 3, PrevIndex: 9, PrevEpoch: 3, Commit: 8,
		Entries: []GroupEntry{{Epoch: 3, Index: 10, Data: []byte("first")}, {Epoch: 3, Index: 11, Data: []byte("second")}}}
	for _, k := range []uint8{GroupAppend, GroupAppendResp, GroupInstall} {
		mk := GroupMessage{Group: 2, Kind: k, From: 1, To: 2, Epoch: 3}
		_, body, _, err := Next(AppendGroupMessage(nil, &mk), FrameSizeMax)
		if err != nil {
			t.Fatal(err)
		}
		if got := GroupMessageKindOf(body[:GroupKindPrefix]); got != k {
			t.Fatalf("GroupMessageKindOf: %d, want %d", got, k)
		}
		if k == GroupAppend && len(body) != GroupAppendHeadSize {
			t.Fatalf("an append without entries has a body of %d bytes, not GroupAppendHeadSize (%d)", len(body), GroupAppendHeadSize)
		}
	}
	_, body, _, err := Next(AppendGroupMessage(nil, &m), FrameSizeMax)
	if err != nil {
		t.Fatal(err)
	}
	var copied, owned GroupMessage
	if err := DecodeGroupMessage(body, &copied); err != nil {
		t.Fatal(err)
	}
	if err := DecodeGroupMessageOwned(body, &owned); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(copied, owned) || !reflect.DeepEqual(owned, m) {
		t.Fatalf("owned decode\n got %+v\nwant %+v", owned, m)
	}
	first := owned.Entries[0].Data
	if cap(first) != len(first) {
		t.Fatalf("entry data of cap %d, len %d: an append to it would write over what follows", cap(first), len(first))
	}
	_ = append(first, 'x')
	if string(owned.Entries[1].Data) != "second" {
		t.Fatalf("an append to the first entry changed the second: %q", owned.Entries[1].Data)
	}
	for i := range body {
		body[i] = 0
	}
	if string(owned.Entries[0].Data) == "first" || string(copied.Entries[0].Data) != "first" {
		t.Fatal("the owned decode's entries do not alias the body, or the copying decode's do")
	}
}
