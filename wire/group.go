package wire

// Broker peer frames: the replication groups' messages between brokers,
// on the peer port. Their types sit in 0xC0..0xFF, the range reserved for
// the data plane's peer protocol. A connection starts with a
// TypeGroupHello from the dialing broker; every frame after it carries one
// GroupMessage of one group.

import "encoding/binary"

const (
	// TypeGroupHello opens a peer connection: the sender's broker id
	// uint32 and the highest protocol version it speaks (uint16).
	TypeGroupHello Type = 0xC0
	// TypeGroupMessage carries one GroupMessage.
	TypeGroupMessage Type = 0xC1
)

// Group message kinds.
const (
	GroupAppend     uint8 = 1
	GroupAppendResp uint8 = 2
	// GroupInstall has an Append's fields and no entries: the master's
	// log starts after PrevIndex (replication/group MsgInstall).
	GroupInstall uint8 = 3
)

// GroupEntry is one event of a group log.
type GroupEntry struct {
	Epoch uint32
	Index uint64
	Data  []byte
}

// GroupMessage is one replication message of one group between two of
// its members (replication/group defines what the fields mean).
type GroupMessage struct {
	Group    uint32
	Kind     uint8
	From, To uint32
	Epoch    uint32

	// GroupAppend
	PrevIndex uint64
	PrevEpoch uint32
	Entries   []GroupEntry
	Commit    uint64

	// GroupAppendResp
	OK        bool
	Match     uint64
	Last      uint64
	HintEpoch uint32
	HintIndex uint64
}

// GroupEntriesMax bounds the entries of one GroupMessage.
const GroupEntriesMax = 1 << 16

// AppendGroupHello appends a whole TypeGroupHello frame.
func AppendGroupHello(dst []byte, broker uint32, version Version) []byte {
	dst = AppendHeader(dst, Header{Version: Current, Type: TypeGroupHello, Length: 6})
	dst = binary.BigEndian.AppendUint32(dst, broker)
	return binary.BigEndian.AppendUint16(dst, uint16(version))
}

// DecodeGroupHello decodes a TypeGroupHello body.
func DecodeGroupHello(body []byte) (broker uint32, version Version, err error) {
	if len(body) != 6 {
		return 0, 0, ErrMalformed
	}
	return binary.BigEndian.Uint32(body), Version(binary.BigEndian.Uint16(body[4:])), nil
}

// groupMessageSize is the encoded size of m, header included.
func groupMessageSize(m *GroupMessage) int {
	n := HeaderSize + 17 + 37 // the common fields; the larger of the two kinds' own
	for i := range m.Entries {
		n += 16 + len(m.Entries[i].Data)
	}
	return n
}

// AppendGroupMessage appends m as a whole TypeGroupMessage frame.
func AppendGroupMessage(dst []byte, m *GroupMessage) []byte {
	if need := groupMessageSize(m); cap(dst)-len(dst) < need {
		dst = append(make([]byte, 0, len(dst)+need), dst...)
	}
	dst, s := StartFrame(dst, Current, TypeGroupMessage, 0)
	dst = AppendU32(dst, m.Group)
	dst = AppendU8(dst, m.Kind)
	dst = AppendU32(dst, m.From)
	dst = AppendU32(dst, m.To)
	dst = AppendU32(dst, m.Epoch)
	switch m.Kind {
	case GroupAppend, GroupInstall:
		dst = AppendU64(dst, m.PrevIndex)
		dst = AppendU32(dst, m.PrevEpoch)
		dst = AppendU64(dst, m.Commit)
		dst = AppendU32(dst, uint32(len(m.Entries)))
		for i := range m.Entries {
			e := &m.Entries[i]
			dst = AppendU32(dst, e.Epoch)
			dst = AppendU64(dst, e.Index)
			dst = AppendBytes(dst, e.Data)
		}
	case GroupAppendResp:
		dst = AppendBool(dst, m.OK)
		dst = AppendU64(dst, m.Match)
		dst = AppendU64(dst, m.Last)
		dst = AppendU32(dst, m.HintEpoch)
		dst = AppendU64(dst, m.HintIndex)
	}
	EndFrame(dst, s, 0)
	return dst
}

// DecodeGroupMessage decodes a TypeGroupMessage body into m. The entries'
// data are copied into one new buffer, so m outlives body.
func DecodeGroupMessage(body []byte, m *GroupMessage) error {
	return decodeGroupMessage(body, m, false)
}

// DecodeGroupMessageOwned is DecodeGroupMessage for a body the caller
// gives up: the entries' data alias it, each capped at its own end,
// instead of being copied into a buffer of their own (the body of one
// frame, as the copy was).
func DecodeGroupMessageOwned(body []byte, m *GroupMessage) error {
	return decodeGroupMessage(body, m, true)
}

// GroupMessageKindOf is the kind of the TypeGroupMessage body that
// starts with prefix (at least GroupKindPrefix bytes), for a reader that
// chooses the buffer of a body before reading it.
func GroupMessageKindOf(prefix []byte) uint8 { return prefix[4] }

// GroupKindPrefix is the bytes of a TypeGroupMessage body that
// GroupMessageKindOf needs.
const GroupKindPrefix = 5

// GroupAppendHeadSize is the size of the body of a GroupAppend without
// entries (a heartbeat): a longer one holds entries.
const GroupAppendHeadSize = 41

func decodeGroupMessage(body []byte, m *GroupMessage, owned bool) error {
	var r Reader
	r.Reset(body)
	*m = GroupMessage{}
	m.Group = r.U32()
	m.Kind = r.U8()
	m.From, m.To, m.Epoch = r.U32(), r.U32(), r.U32()
	switch m.Kind {
	case GroupAppend, GroupInstall:
		m.PrevIndex, m.PrevEpoch, m.Commit = r.U64(), r.U32(), r.U64()
		n := r.Count(16) // an entry takes at least 16 bytes
		if n > GroupEntriesMax || (n > 0 && m.Kind == GroupInstall) {
			return ErrMalformed
		}
		if n > 0 {
			var data []byte
			if !owned {
				data = make([]byte, 0, r.Remaining())
			}
			m.Entries = make([]GroupEntry, n)
			for i := range m.Entries {
				e := &m.Entries[i]
				e.Epoch, e.Index = r.U32(), r.U64()
				b := r.Bytes(FrameSizeMax)
				if owned {
					e.Data = b[:len(b):len(b)]
					continue
				}
				start := len(data)
				data = append(data, b...)
				e.Data = data[start:len(data):len(data)]
			}
		}
	case GroupAppendResp:
		m.OK = r.Bool()
		m.Match, m.Last, m.HintEpoch, m.HintIndex = r.U64(), r.U64(), r.U32(), r.U64()
	default:
		return ErrMalformed
	}
	return r.Done()
}
