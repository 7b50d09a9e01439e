package wire

// Controller peer frames: raft messages between controllers, and the
// request/response pair that brokers and the admin CLI use to talk to a
// controller. Their types sit in 0x80..0xBF, the range reserved for the
// control plane. Like the rest of this package, nothing here does I/O and
// decoders alias the buffer they are given.

import "encoding/binary"

const (
	// TypeRaftMessage carries one marshalled raftpb.Message between
	// controllers. The body is the protobuf bytes, nothing else.
	TypeRaftMessage Type = 0x80
	// TypeCtlRequest is a controller service request:
	// id uint64, op uint8, body (uint32 length then bytes).
	TypeCtlRequest Type = 0x81
	// TypeCtlResponse answers a TypeCtlRequest with the same id:
	// id uint64, status uint8, leader hint (string), body (uint32 length
	// then bytes).
	TypeCtlResponse Type = 0x82
	// TypeRaftChunk carries part of a marshalled raftpb.Message too big
	// for one frame (a large snapshot): total uint64 (the whole message's
	// length), offset uint64, then the bytes. The chunks of one message
	// are sent in order on one connection with nothing between them; the
	// receiver steps the message when offset + len reaches total.
	TypeRaftChunk Type = 0x83
	// TypeRaftHello opens a controller's raft connection to a peer: id
	// uint64, then the sender's own service address (string). A member
	// that did not know the sender's address (one joining the group with
	// a partial peer list) learns where to answer.
	TypeRaftHello Type = 0x84
)

// raftHelloAddrMax bounds the address in a TypeRaftHello.
const raftHelloAddrMax = 255

// AppendRaftHello appends a whole TypeRaftHello frame.
func AppendRaftHello(dst []byte, id uint64, addr string) []byte {
	if len(addr) > raftHelloAddrMax {
		addr = addr[:raftHelloAddrMax]
	}
	dst = AppendHeader(dst, Header{Version: Current, Type: TypeRaftHello, Length: uint32(8 + 1 + len(addr))})
	dst = binary.BigEndian.AppendUint64(dst, id)
	dst = append(dst, byte(len(addr)))
	return append(dst, addr...)
}

// DecodeRaftHello decodes a TypeRaftHello body.
func DecodeRaftHello(body []byte) (id uint64, addr string, err error) {
	if len(body) < 9 || int(body[8]) != len(body)-9 {
		return 0, "", ErrMalformed
	}
	return binary.BigEndian.Uint64(body), string(body[9:]), nil
}

// raftChunkPrefix is the size of a TypeRaftChunk body before its bytes.
const raftChunkPrefix = 16

// AppendRaftChunk appends a whole TypeRaftChunk frame carrying part, which
// starts at offset in a message of total bytes.
func AppendRaftChunk(dst []byte, total, offset uint64, part []byte) []byte {
	return append(AppendRaftChunkHeader(dst, total, offset, len(part)), part...)
}

// AppendRaftChunkHeader appends a TypeRaftChunk frame's header and prefix
// for a part of n bytes, which the caller writes after it.
func AppendRaftChunkHeader(dst []byte, total, offset uint64, n int) []byte {
	dst = AppendHeader(dst, Header{Version: Current, Type: TypeRaftChunk, Length: uint32(raftChunkPrefix + n)})
	dst = binary.BigEndian.AppendUint64(dst, total)
	return binary.BigEndian.AppendUint64(dst, offset)
}

// DecodeRaftChunk decodes a TypeRaftChunk body. part aliases body.
func DecodeRaftChunk(body []byte) (total, offset uint64, part []byte, err error) {
	if len(body) < raftChunkPrefix {
		return 0, 0, nil, ErrMalformed
	}
	total = binary.BigEndian.Uint64(body)
	offset = binary.BigEndian.Uint64(body[8:])
	part = body[raftChunkPrefix:]
	if offset > total || uint64(len(part)) > total-offset {
		return 0, 0, nil, ErrMalformed
	}
	return total, offset, part, nil
}

// CtlRequest is a decoded TypeCtlRequest body.
type CtlRequest struct {
	ID   uint64
	Op   uint8
	Body []byte // aliases the decoded buffer
}

// CtlResponse is a decoded TypeCtlResponse body. Status 0 is success; other
// values are defined by the control plane. Leader, when set, is the address
// of the controller the caller should retry at.
type CtlResponse struct {
	ID     uint64
	Status uint8
	Leader string // aliases the decoded buffer when decoded
	Body   []byte // aliases the decoded buffer
}

// ctlLeaderLenMax bounds the leader hint, which is a host:port.
const ctlLeaderLenMax = 255

// AppendRaftMessage appends a whole TypeRaftMessage frame carrying msg.
func AppendRaftMessage(dst []byte, msg []byte) []byte {
	dst = AppendHeader(dst, Header{Version: Current, Type: TypeRaftMessage, Length: uint32(len(msg))})
	return append(dst, msg...)
}

// AppendCtlRequest appends a whole TypeCtlRequest frame.
func AppendCtlRequest(dst []byte, r CtlRequest) []byte {
	n := 8 + 1 + 4 + len(r.Body)
	dst = AppendHeader(dst, Header{Version: Current, Type: TypeCtlRequest, Length: uint32(n)})
	dst = binary.BigEndian.AppendUint64(dst, r.ID)
	dst = append(dst, r.Op)
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(r.Body)))
	return append(dst, r.Body...)
}

// DecodeCtlRequest decodes a TypeCtlRequest body (the bytes after the
// header).
func DecodeCtlRequest(body []byte) (CtlRequest, error) {
	if len(body) < 13 {
		return CtlRequest{}, ErrMalformed
	}
	r := CtlRequest{ID: binary.BigEndian.Uint64(body), Op: body[8]}
	n := binary.BigEndian.Uint32(body[9:])
	rest := body[13:]
	if uint64(n) != uint64(len(rest)) {
		return CtlRequest{}, ErrMalformed
	}
	r.Body = rest
	return r, nil
}

// AppendCtlResponse appends a whole TypeCtlResponse frame. A leader hint
// longer than 255 bytes is a programmer error and is cut.
func AppendCtlResponse(dst []byte, r CtlResponse) []byte {
	leader := r.Leader
	if len(leader) > ctlLeaderLenMax {
		leader = leader[:ctlLeaderLenMax]
	}
	n := 8 + 1 + 2 + len(leader) + 4 + len(r.Body)
	dst = AppendHeader(dst, Header{Version: Current, Type: TypeCtlResponse, Length: uint32(n)})
	dst = binary.BigEndian.AppendUint64(dst, r.ID)
	dst = append(dst, r.Status)
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(leader)))
	dst = append(dst, leader...)
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(r.Body)))
	return append(dst, r.Body...)
}

// DecodeCtlResponse decodes a TypeCtlResponse body.
func DecodeCtlResponse(body []byte) (CtlResponse, error) {
	if len(body) < 11 {
		return CtlResponse{}, ErrMalformed
	}
	r := CtlResponse{ID: binary.BigEndian.Uint64(body), Status: body[8]}
	ln := int(binary.BigEndian.Uint16(body[9:]))
	rest := body[11:]
	if ln > ctlLeaderLenMax || len(rest) < ln+4 {
		return CtlResponse{}, ErrMalformed
	}
	r.Leader = string(rest[:ln])
	rest = rest[ln:]
	n := binary.BigEndian.Uint32(rest)
	rest = rest[4:]
	if uint64(n) != uint64(len(rest)) {
		return CtlResponse{}, ErrMalformed
	}
	r.Body = rest
	return r, nil
}
