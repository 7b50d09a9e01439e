package wire

import (
	"bytes"
	"reflect"
	"testing"
)

// decodePeer decodes a stream of peer-port frames (the controller's raft
// and service frames, the brokers' group frames) as their readers do, and
// checks what each decoder accepted: it encodes again to the same bytes,
// or decodes again to the same value.
func decodePeer(data []byte, maxFrame uint32) error {
	for len(data) > 0 {
		h, body, n, err := Next(data, maxFrame)
		if err != nil {
			return err
		}
		if n == 0 {
			return ErrShort
		}
		data = data[n:]
		switch h.Type {
		case TypeRaftMessage:
		case TypeRaftHello:
			id, addr, err := DecodeRaftHello(body)
			if err == nil && !bytes.Equal(AppendRaftHello(nil, id, addr)[HeaderSize:], body) {
				panic("raft hello does not encode back to its bytes")
			}
		case TypeRaftChunk:
			total, off, part, err := DecodeRaftChunk(body)
			if err == nil && off+uint64(len(part)) > total {
				panic("raft chunk past its total accepted")
			}
		case TypeCtlRequest:
			r, err := DecodeCtlRequest(body)
			if err == nil && !bytes.Equal(AppendCtlRequest(nil, r)[HeaderSize:], body) {
				panic("ctl request does not encode back to its bytes")
			}
		case TypeCtlResponse:
			r, err := DecodeCtlResponse(body)
			if err == nil && !bytes.Equal(AppendCtlResponse(nil, r)[HeaderSize:], body) {
				panic("ctl response does not encode back to its bytes")
			}
		case TypeGroupHello:
			broker, v, err := DecodeGroupHello(body)
			if err == nil && !bytes.Equal(AppendGroupHello(nil, broker, v)[HeaderSize:], body) {
				panic("group hello does not encode back to its bytes")
			}
		case TypeGroupMessage:
			var m, owned GroupMessage
			err := DecodeGroupMessage(body, &m)
			if oerr := DecodeGroupMessageOwned(bytes.Clone(body), &owned); (oerr == nil) != (err == nil) || err == nil && !sameGroupMessage(&m, &owned) {
				panic("the owned decode of a group message differs from the copying one")
			}
			if err != nil {
				break
			}
			if len(m.Entries) > GroupEntriesMax {
				panic("group message over GroupEntriesMax accepted")
			}
			again := AppendGroupMessage(nil, &m)
			var m2 GroupMessage
			if err := DecodeGroupMessage(again[HeaderSize:], &m2); err != nil {
				panic("a decoded group message does not decode again: " + err.Error())
			}
			if !sameGroupMessage(&m, &m2) {
				panic("group message changed on the way round")
			}
		}
	}
	return nil
}

// sameGroupMessage compares two messages, with an empty entry's data
// equal to none.
func sameGroupMessage(a, b *GroupMessage) bool {
	if len(a.Entries) != len(b.Entries) {
		return false
	}
	for i := range a.Entries {
		x, y := a.Entries[i], b.Entries[i]
		if x.Epoch != y.Epoch || x.Index != y.Index || !bytes.Equal(x.Data, y.Data) {
			return false
		}
	}
	a2, b2 := *a, *b
	a2.Entries, b2.Entries = nil, nil
	return reflect.DeepEqual(a2, b2)
}

func FuzzPeerDecode(f *testing.F) {
	f.Add(AppendRaftHello(nil, 3, "127.0.0.1:7402"))
	f.Add(AppendRaftChunk(nil, 10, 4, []byte("abcdef")))
	f.Add(AppendRaftMessage(nil, []byte{8, 1, 16, 2}))
	f.Add(AppendCtlRequest(nil, CtlRequest{ID: 7, Op: 2, Body: []byte{1, 2, 3}}))
	f.Add(AppendCtlResponse(nil, CtlResponse{ID: 7, Status: 1, Leader: "127.0.0.1:7412", Body: []byte("x")}))
	f.Add(AppendGroupHello(nil, 2, Current))
	f.Add(AppendGroupMessage(nil, &GroupMessage{Group: 1, Kind: GroupAppend, From: 1, To: 2, Epoch: 3, PrevIndex: 9, PrevEpoch: 2,
		Commit: 8, Entries: []GroupEntry{{Epoch: 3, Index: 10, Data: []byte("e1")}, {Epoch: 3, Index: 11}}}))
	f.Add(AppendGroupMessage(nil, &GroupMessage{Group: 1, Kind: GroupAppendResp, From: 2, To: 1, Epoch: 3, OK: true, Match: 11, Last: 11}))
	f.Fuzz(func(t *testing.T, data []byte) {
		_ = decodePeer(data, FrameSizeMin)
	})
}
