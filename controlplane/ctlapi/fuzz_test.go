package ctlapi

import (
	"bytes"
	"testing"

	"github.com/berthmq/berth/wire"
)

// FuzzDecodeEvent: whatever a proposal's body holds, DecodeEvent returns
// an event or an error, never panics; an event it accepts encodes to a
// canonical form that decodes to the same encoding again, and
// ValidateEvent judges it without panicking.
func FuzzDecodeEvent(f *testing.F) {
	for k := EventKind(1); k < kindMax; k++ {
		f.Add(EncodeEvent(nil, newEvent(k)))
	}
	f.Add(EncodeEvent(nil, &RegisterBroker{ID: 2, Addrs: []string{"127.0.0.1:7400"}}))
	f.Add(EncodeEvent(nil, &DeclareQueue{Name: "q", Options: QueueOptions{Durable: true, MaxLength: 10}}))
	f.Add(EncodeEvent(nil, &Bind{Exchange: "x", Queue: "q", Key: "a.#"}))
	f.Add(EncodeEvent(nil, &ElectMaster{Groups: []ElectGroup{{Group: 1, Epoch: 2, Preferred: 3}}}))
	f.Fuzz(func(t *testing.T, data []byte) {
		ev, err := DecodeEvent(data)
		if err != nil {
			return
		}
		_ = ValidateEvent(ev)
		raw := EncodeEvent(nil, ev)
		again, err := DecodeEvent(raw)
		if err != nil {
			t.Fatalf("%T re-encoded does not decode: %v", ev, err)
		}
		if !bytes.Equal(EncodeEvent(nil, again), raw) {
			t.Fatalf("%T does not round-trip", ev)
		}
	})
}

// FuzzRequestBodies: the bodies of the controller's service requests
// other than proposals and reads (those have targets of their own), and
// the result every write answers with.
func FuzzRequestBodies(f *testing.F) {
	f.Add(uint8(0), AppendHeartbeat(nil, 7, []GroupLogEnd{{Group: 3, LogEnd: LogEnd{Epoch: 2, Index: 9}}}))
	f.Add(uint8(1), AppendElect(nil, 2, []uint32{1, 2, 3}))
	f.Add(uint8(2), AppendMembersChange(nil, map[uint64]string{4: "127.0.0.1:7432"}, []uint64{1}))
	f.Add(uint8(3), AppendResult(nil, Result{Code: 1, Value: 9, Msg: "x"}))
	f.Add(uint8(4), AppendGroup(nil, Group{ID: 1, Master: 2, Epoch: 3, SyncStateSet: []uint32{2, 3}}))
	f.Fuzz(func(t *testing.T, which uint8, body []byte) {
		switch which % 5 {
		case 0:
			broker, ends, err := DecodeHeartbeat(body)
			if err == nil && !bytes.Equal(AppendHeartbeat(nil, broker, ends), body) {
				t.Fatal("heartbeat does not encode back to its bytes")
			}
		case 1:
			_, _, _ = DecodeElect(body)
		case 2:
			add, remove, err := DecodeMembersChange(body)
			if err == nil && (len(add) > MembersChangeMax || len(remove) > MembersChangeMax) {
				t.Fatal("a change over MembersChangeMax accepted")
			}
		case 3:
			r, err := DecodeResult(body)
			if err == nil && !bytes.Equal(AppendResult(nil, r), body) {
				t.Fatal("result does not encode back to its bytes")
			}
		case 4:
			r := wire.NewReader(body)
			_ = ReadGroup(r)
			_ = r.Done()
			r = wire.NewReader(body)
			_ = ReadWiring(r)
			r = wire.NewReader(body)
			_ = ReadBroker(r)
			r = wire.NewReader(body)
			_ = ReadUser(r)
		}
	})
}
