package ctlapi

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"

	"github.com/berthmq/berth/wire"
)

// The controller service's protocol: operations, read queries, reply
// statuses, their bounds, and the request and reply bodies that the client
// writes and the service reads (or the other way). A frame is a
// wire.CtlRequest or wire.CtlResponse; the bodies use the wire codec.

// Service operations (wire.CtlRequest.Op). Persisted nowhere, but brokers
// of other versions send them: never renumber.
const (
	OpPropose   uint8 = 1 // body: an event; reply: a Result
	OpRead      uint8 = 2 // body: mode, query, args; reply: per query
	OpHeartbeat uint8 = 3 // body: broker, log ends
	OpElect     uint8 = 4 // body: preferred broker, group ids; reply: a Result
	OpStatus    uint8 = 5 // reply: a Status
	OpWait      uint8 = 6 // body: an applied index; reply: the applied index once past it
	OpPrimary   uint8 = 7 // body: preferred broker; reply: a Result (elected on the leader from its heartbeats)
	// OpMembers: no body; reply: the leader's id, then the voters as
	// count + (id u64, address str)*. Served on the leader only, after a
	// ReadIndex round (a consistent read): the configuration it reports
	// holds every membership change committed before the request.
	OpMembers uint8 = 8
	// OpChangeMembers: body: adds as count + (id u64, address str)*,
	// removes as count + id*; each count at most MembersChangeMax. Runs
	// ChangeMembership on the leader; an empty reply once the joint
	// configuration is left. A write: a stopping leader's answer is
	// ambiguous. Repeating a change that took effect succeeds.
	OpChangeMembers uint8 = 9
	// OpHandover: body: a Handover; reply: a Result (1 when the master
	// moved). The group's master hands it to a member of its
	// SyncStateSet that holds its whole log (groups rebalance).
	OpHandover uint8 = 10
	// OpLogEnds: body: group ids, at most LogEndsGroupsMax; reply: for
	// each group in order, the brokers of its replica set as the
	// leader's heartbeats last reported them (AppendLogEnds). A read of
	// the leader's memory, not of the state machine: served by the
	// leader only, up to a heartbeat interval old.
	OpLogEnds uint8 = 11
)

// LogEndsGroupsMax bounds the groups of one OpLogEnds request.
const LogEndsGroupsMax = 1024

// MembersChangeMax bounds the adds and the removes in one OpChangeMembers
// request: no change leaves more than VotersMax voters, and replacing a
// whole 5-member group takes 5 of each.
const MembersChangeMax = VotersMax

// Read queries.
const (
	QueryWiring uint8 = iota + 1
	QueryGroups
	QueryBrokers
	QueryNextBrokerID
	QueryAttribute
	QueryClusterInfo
	QuerySyncStateSet
	QueryPrimary
	// QueryUsers answers every user with credentials and permissions
	// (brokers check logins with them); never a password.
	QueryUsers
)

// Response statuses (wire.CtlResponse.Status).
const (
	StatusOK uint8 = iota
	StatusNotLeader
	StatusLagging
	StatusBusy
	StatusBadRequest
	StatusUnavailable // not served; safe to retry
	StatusAmbiguous   // a write whose outcome is unknown
	StatusStopped
)

const (
	// RequestFrameMax bounds a service request frame.
	RequestFrameMax = 1 << 20
	// GroupsPerReplyMax bounds the groups in one GetGroups reply.
	GroupsPerReplyMax = 16384
)

// AppendHeartbeat appends an OpHeartbeat body: the broker, then each
// group's log end.
func AppendHeartbeat(b []byte, broker uint32, logEnds []GroupLogEnd) []byte {
	b = wire.AppendU32(b, broker)
	b = wire.AppendU32(b, uint32(len(logEnds)))
	for _, l := range logEnds {
		b = wire.AppendU32(b, l.Group)
		b = wire.AppendU32(b, l.LogEnd.Epoch)
		b = wire.AppendU64(b, l.LogEnd.Index)
	}
	return b
}

// DecodeHeartbeat reads an OpHeartbeat body.
func DecodeHeartbeat(body []byte) (broker uint32, logEnds []GroupLogEnd, err error) {
	r := wire.NewReader(body)
	broker = r.U32()
	logEnds = make([]GroupLogEnd, r.Count(16))
	for i := range logEnds {
		logEnds[i] = GroupLogEnd{r.U32(), LogEnd{r.U32(), r.U64()}}
	}
	return broker, logEnds, r.Done()
}

// MasterGrant is one group a heartbeat's reply confirms the broker as the
// master of, in Epoch (group.Member.Granted).
type MasterGrant struct {
	Group, Epoch uint32
}

// HeartbeatReply is what the leader answers a heartbeat with: the groups
// the broker masters in the controller's state, read after the leader
// confirmed its leadership, so a deposed leader never confirms a master
// its successor replaced. Known is false for the empty reply of a
// controller that predates it: nothing is confirmed or denied.
type HeartbeatReply struct {
	Known  bool
	Grants []MasterGrant // by group
}

// heartbeatReplyV1 tags the reply's layout: u8 1, u32 n, n x (group u32,
// epoch u32). An empty body is an older controller's.
const heartbeatReplyV1 = 1

// AppendHeartbeatReply appends an OpHeartbeat reply body.
func AppendHeartbeatReply(b []byte, grants []MasterGrant) []byte {
	b = append(b, heartbeatReplyV1)
	b = wire.AppendU32(b, uint32(len(grants)))
	for _, g := range grants {
		b = wire.AppendU32(b, g.Group)
		b = wire.AppendU32(b, g.Epoch)
	}
	return b
}

// DecodeHeartbeatReply reads an OpHeartbeat reply body. A later layout
// (a higher tag) keeps this one as its prefix.
func DecodeHeartbeatReply(body []byte) (HeartbeatReply, error) {
	if len(body) == 0 {
		return HeartbeatReply{}, nil
	}
	r := wire.NewReader(body[1:])
	if body[0] < heartbeatReplyV1 {
		return HeartbeatReply{}, fmt.Errorf("%w: heartbeat reply of layout %d", ErrBadRequest, body[0])
	}
	grants := make([]MasterGrant, r.Count(8))
	for i := range grants {
		grants[i] = MasterGrant{Group: r.U32(), Epoch: r.U32()}
	}
	if body[0] == heartbeatReplyV1 {
		if err := r.Done(); err != nil {
			return HeartbeatReply{}, err
		}
	} else if r.Err() != nil {
		return HeartbeatReply{}, r.Err()
	}
	return HeartbeatReply{Known: true, Grants: grants}, nil
}

// AppendElect appends an OpElect body: the preferred broker, then the
// groups.
func AppendElect(b []byte, preferred uint32, groups []uint32) []byte {
	return AppendIDs(wire.AppendU32(b, preferred), groups)
}

// DecodeElect reads an OpElect body.
func DecodeElect(body []byte) (preferred uint32, groups []uint32, err error) {
	r := wire.NewReader(body)
	preferred = r.U32()
	groups = ReadIDs(r)
	return preferred, groups, r.Done()
}

// Handover is an OpHandover body: broker From, master of Group in Epoch,
// asks that To become master. From has stopped taking proposals, every
// entry up to LogEnd (its log end) is committed, and To holds them all:
// the leader elects from these log ends for From and To rather than from
// its heartbeats, which may be a beat older.
type Handover struct {
	Group, Epoch, From, To uint32
	LogEnd                 LogEnd
}

// AppendHandover appends an OpHandover body.
func AppendHandover(b []byte, h *Handover) []byte {
	for _, v := range []uint32{h.Group, h.Epoch, h.From, h.To, h.LogEnd.Epoch} {
		b = wire.AppendU32(b, v)
	}
	return wire.AppendU64(b, h.LogEnd.Index)
}

// DecodeHandover reads an OpHandover body.
func DecodeHandover(body []byte) (Handover, error) {
	r := wire.NewReader(body)
	h := Handover{Group: r.U32(), Epoch: r.U32(), From: r.U32(), To: r.U32()}
	h.LogEnd = LogEnd{Epoch: r.U32(), Index: r.U64()}
	return h, r.Done()
}

// AppendLogEnds appends an OpLogEnds reply: per group, a count and the
// candidates (broker, alive, log end).
func AppendLogEnds(b []byte, groups [][]Candidate) []byte {
	for _, cs := range groups {
		b = wire.AppendU32(b, uint32(len(cs)))
		for _, c := range cs {
			b = wire.AppendU32(b, c.Broker)
			b = wire.AppendBool(b, c.Alive)
			b = wire.AppendU32(b, c.LogEnd.Epoch)
			b = wire.AppendU64(b, c.LogEnd.Index)
		}
	}
	return b
}

// DecodeLogEnds reads an OpLogEnds reply for n groups.
func DecodeLogEnds(body []byte, n int) ([][]Candidate, error) {
	r := wire.NewReader(body)
	out := make([][]Candidate, n)
	for i := range out {
		cs := make([]Candidate, r.Count(17))
		for j := range cs {
			cs[j] = Candidate{Broker: r.U32(), Alive: r.Bool(), LogEnd: LogEnd{Epoch: r.U32(), Index: r.U64()}}
		}
		out[i] = cs
	}
	return out, r.Done()
}

// AppendMembersChange appends an OpChangeMembers body.
func AppendMembersChange(b []byte, add map[uint64]string, remove []uint64) []byte {
	b = AppendMembers(b, add)
	b = wire.AppendU32(b, uint32(len(remove)))
	for _, id := range remove {
		b = wire.AppendU64(b, id)
	}
	return b
}

// DecodeMembersChange reads an OpChangeMembers body. ChangeMembership
// checks the ids and addresses against the membership; this checks only
// the shape and the bounds.
func DecodeMembersChange(body []byte) (map[uint64]string, []uint64, error) {
	r := wire.NewReader(body)
	na := r.Count(10) // id and string length
	if na > MembersChangeMax {
		return nil, nil, fmt.Errorf("%w: %d controllers to add; at most %d per change", ErrBadRequest, na, MembersChangeMax)
	}
	add := make(map[uint64]string, na)
	for i := 0; i < na && r.Err() == nil; i++ {
		id, addr := r.U64(), ReadString(r)
		if _, dup := add[id]; dup && r.Err() == nil {
			return nil, nil, fmt.Errorf("%w: controller %d is listed twice to add", ErrBadRequest, id)
		}
		add[id] = addr
	}
	nr := r.Count(8)
	if nr > MembersChangeMax {
		return nil, nil, fmt.Errorf("%w: %d controllers to remove; at most %d per change", ErrBadRequest, nr, MembersChangeMax)
	}
	remove := make([]uint64, 0, nr)
	for i := 0; i < nr && r.Err() == nil; i++ {
		remove = append(remove, r.U64())
	}
	if err := r.Done(); err != nil {
		return nil, nil, fmt.Errorf("%w: malformed membership change: %v", ErrBadRequest, err)
	}
	return add, remove, nil
}

// AppendResult appends the reply to a write: code, value, message.
func AppendResult(b []byte, r Result) []byte {
	b = wire.AppendU8(b, r.Code)
	b = wire.AppendU64(b, r.Value)
	return AppendString(b, r.Msg)
}

// DecodeResult reads what AppendResult wrote.
func DecodeResult(b []byte) (Result, error) {
	r := wire.NewReader(b)
	res := Result{Code: r.U8(), Value: r.U64(), Msg: ReadString(r)}
	return res, r.Done()
}

// AppendGroup appends a group as the group reads answer it.
func AppendGroup(b []byte, g Group) []byte {
	b = wire.AppendU32(b, g.ID)
	b = wire.AppendU32(b, g.Master)
	b = wire.AppendU32(b, g.Epoch)
	b = wire.AppendU32(b, g.ElectedLogEnd.Epoch)
	b = wire.AppendU64(b, g.ElectedLogEnd.Index)
	b = AppendIDs(b, g.SyncStateSet)
	return AppendIDs(b, g.Replicas)
}

// ReadGroup reads what AppendGroup wrote.
func ReadGroup(r *wire.Reader) Group {
	g := Group{ID: r.U32(), Master: r.U32(), Epoch: r.U32()}
	g.ElectedLogEnd = LogEnd{r.U32(), r.U64()}
	g.SyncStateSet = ReadIDs(r)
	if g.Replicas = ReadIDs(r); len(g.Replicas) == 0 {
		g.Replicas = nil
	}
	return g
}

// AppendMembers appends a count, then each controller id and its address,
// by id. Membership change entries in the raft log store their address
// book this way.
func AppendMembers(b []byte, members map[uint64]string) []byte {
	b = wire.AppendU32(b, uint32(len(members)))
	for _, id := range slices.Sorted(maps.Keys(members)) {
		b = wire.AppendU64(b, id)
		b = AppendString(b, members[id])
	}
	return b
}

// ReadMembers reads what AppendMembers wrote.
func ReadMembers(r *wire.Reader) map[uint64]string {
	n := r.Count(10)
	members := make(map[uint64]string, n)
	for i := 0; i < n; i++ {
		id := r.U64()
		members[id] = ReadString(r)
	}
	return members
}

// VotersMax bounds the voters a membership change may leave: a controller
// group has at most 5 members.
const VotersMax = 5

// CheckControllerAddr accepts host:port with a port in 1..65535 and at
// most 255 bytes: the other members dial it.
func CheckControllerAddr(addr string) error {
	if addr == "" {
		return errors.New("address is empty")
	}
	if len(addr) > NameLenMax {
		return fmt.Errorf("address is %d bytes, more than %d", len(addr), NameLenMax)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("address %q: %v", addr, err)
	}
	if host == "" {
		return fmt.Errorf("address %q has no host", addr)
	}
	if p, err := strconv.ParseUint(port, 10, 16); err != nil || p == 0 {
		return fmt.Errorf("address %q: port must be 1..65535", addr)
	}
	return nil
}
