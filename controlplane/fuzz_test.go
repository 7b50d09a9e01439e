package controlplane

import (
	"bytes"
	"testing"

	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/berthmq/berth/controlplane/ctlapi"
	"github.com/berthmq/berth/wire"
)

// FuzzControllerFrames feeds a stream of frames to what the controller's
// service does with each (service.go): raft messages unmarshalled, raft
// chunks assembled, hellos and requests decoded, and each request body
// parsed by its op, proposals applied to a state. None may panic, and an
// assembled message never exceeds raftMessageMax.
func FuzzControllerFrames(f *testing.F) {
	m := &pb.Message{Type: pb.MessageType_MsgApp.Enum(), To: proto.Uint64(2), From: proto.Uint64(1), Term: proto.Uint64(3),
		Index: proto.Uint64(9), Entries: []*pb.Entry{{Term: proto.Uint64(3), Index: proto.Uint64(10), Data: []byte("x")}}}
	raw, err := proto.Marshal(m)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(wire.AppendRaftMessage(nil, raw))
	chunked := wire.AppendRaftChunk(nil, uint64(len(raw)), 0, raw[:4])
	f.Add(wire.AppendRaftChunk(chunked, uint64(len(raw)), 4, raw[4:]))
	f.Add(wire.AppendRaftHello(nil, 2, "127.0.0.1:7412"))
	f.Add(wire.AppendCtlRequest(nil, wire.CtlRequest{ID: 1, Op: ctlapi.OpPropose,
		Body: ctlapi.EncodeEvent(nil, &ctlapi.DeclareQueue{Name: "q"})}))
	f.Add(wire.AppendCtlRequest(nil, wire.CtlRequest{ID: 2, Op: ctlapi.OpRead, Body: []byte{byte(ctlapi.ReadConsistent), ctlapi.QueryGroups, 0, 0, 0, 0, 0, 0, 0, 9}}))
	f.Add(wire.AppendCtlRequest(nil, wire.CtlRequest{ID: 3, Op: ctlapi.OpHeartbeat, Body: ctlapi.AppendHeartbeat(nil, 1, nil)}))
	f.Add(wire.AppendCtlRequest(nil, wire.CtlRequest{ID: 4, Op: ctlapi.OpChangeMembers,
		Body: ctlapi.AppendMembersChange(nil, map[uint64]string{4: "127.0.0.1:7432"}, nil)}))
	f.Fuzz(func(t *testing.T, data []byte) {
		var chunks chunkAssembler
		st := NewState()
		for len(data) > 0 {
			h, body, n, err := wire.Next(data, wire.FrameSizeMin)
			if err != nil || n == 0 {
				return
			}
			data = data[n:]
			switch h.Type {
			case wire.TypeRaftMessage:
				_ = proto.Unmarshal(body, &pb.Message{})
			case wire.TypeRaftHello:
				_, _, _ = wire.DecodeRaftHello(body)
			case wire.TypeRaftChunk:
				msg, err := chunks.add(body)
				if err == nil && msg != nil {
					if uint64(len(msg)) > raftMessageMax {
						t.Fatal("assembled a raft message over raftMessageMax")
					}
					_ = proto.Unmarshal(msg, &pb.Message{})
				}
			case wire.TypeCtlRequest:
				req, err := wire.DecodeCtlRequest(body)
				if err != nil {
					continue
				}
				switch req.Op {
				case ctlapi.OpPropose:
					if ev, err := ctlapi.DecodeEvent(req.Body); err == nil && ctlapi.ValidateEvent(ev) == nil {
						st.Apply(ev)
					}
				case ctlapi.OpRead:
					if q, err := parseRead(req.Body); err == nil {
						_ = q.appendAnswer(nil, st)
					}
				case ctlapi.OpHeartbeat:
					_, _, _ = ctlapi.DecodeHeartbeat(req.Body)
				case ctlapi.OpElect:
					_, _, _ = ctlapi.DecodeElect(req.Body)
				case ctlapi.OpChangeMembers:
					_, _, _ = ctlapi.DecodeMembersChange(req.Body)
				}
			case wire.TypeCtlResponse:
				if r, err := wire.DecodeCtlResponse(body); err == nil {
					_, _ = ctlapi.DecodeResult(r.Body)
				}
			}
		}
	})
}

// FuzzDecodeState: a snapshot from another member (or the disk) decodes
// to a state or an error; a state it accepts encodes to bytes that decode
// to the same encoding again.
func FuzzDecodeState(f *testing.F) {
	st := NewState()
	st.Apply(&ctlapi.RegisterBroker{ID: 1, Addrs: []string{"127.0.0.1:7400"}})
	st.Apply(&ctlapi.DeclareQueue{Name: "q"})
	st.Apply(&ctlapi.DeclareExchange{Name: "x", Type: "topic"})
	st.Apply(&ctlapi.Bind{Exchange: "x", Queue: "q", Key: "a.#"})
	f.Add(st.Encode())
	f.Add(NewState().Encode())
	f.Add(encodeAddressBook(map[uint64]string{1: "127.0.0.1:7402", 2: "127.0.0.1:7412"}))
	f.Fuzz(func(t *testing.T, data []byte) {
		_, _ = decodeAddressBook(data)
		s, err := DecodeState(data)
		if err != nil {
			return
		}
		enc := s.Encode()
		s2, err := DecodeState(enc)
		if err != nil {
			t.Fatalf("an encoded state does not decode: %v", err)
		}
		if !bytes.Equal(s2.Encode(), enc) {
			t.Fatal("state does not round-trip")
		}
	})
}
