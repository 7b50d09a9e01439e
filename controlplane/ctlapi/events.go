package ctlapi

import (
	"fmt"
	"slices"

	"github.com/berthmq/berth/wire"
)

// EventKind identifies a write event. Values are persisted in the raft log:
// never renumber them.
type EventKind uint8

const (
	KindRegisterBroker EventKind = iota + 1
	KindApplyBrokerID
	KindElectMaster
	KindAlterSyncStateSet
	KindCleanBrokerData
	KindDeclareExchange
	KindDeclareQueue
	KindBind
	KindUnbind
	KindDeleteQueue
	KindDeleteExchange
	KindSetClusterConfig
	KindSetAttribute
	KindElectPrimary
	KindAddUser
	KindSetUserCredentials
	KindSetPermissions
	KindRemoveUser
	kindMax
)

// Event is a write event: it goes through the raft log and is applied by
// every controller's state machine.
type Event interface {
	Kind() EventKind
	appendBody(b []byte) []byte // the encoding without the kind byte
	decodeBody(r *wire.Reader)
}

// ApplyBrokerID asks for a broker id. Requested 0 takes the next free id.
type ApplyBrokerID struct{ Requested uint32 }

// RegisterBroker records the addresses and protocol version of an existing
// broker id.
type RegisterBroker struct {
	ID      uint32
	Addrs   []string
	Version uint16
}

// LogEnd is the position of the last event in a group log.
type LogEnd struct {
	Epoch uint32
	Index uint64
}

// Less orders log ends by epoch, then index.
func (a LogEnd) Less(b LogEnd) bool {
	return a.Epoch < b.Epoch || (a.Epoch == b.Epoch && a.Index < b.Index)
}

// Candidate is one broker's entry in the heartbeat snapshot an election is
// decided from.
type Candidate struct {
	Broker uint32
	Alive  bool
	LogEnd LogEnd
}

// ElectGroup is the election request for one group. Epoch is the epoch the
// proposer saw; a group whose epoch has moved on ignores the request.
type ElectGroup struct {
	Group      uint32
	Epoch      uint32
	Preferred  uint32 // 0: none; wins ties when eligible
	Candidates []Candidate
}

// ElectMaster elects masters for many groups at once. The heartbeat data is
// carried in the event so apply never looks outside the state machine.
type ElectMaster struct {
	Unclean bool // allow a master from outside the SyncStateSet
	Groups  []ElectGroup
}

// AlterSyncStateSet replaces a group's SyncStateSet. Only the current master
// at the current epoch may do it, and, when From is set, only while the
// group's set is From: a request made from a set the controller has
// changed since (a late or repeated one) is refused, so the master's
// answer-driven view of the set cannot fall behind the controller's.
// Encoded after Set only when not nil (events logged before it have none).
type AlterSyncStateSet struct {
	Group  uint32
	Master uint32
	Epoch  uint32
	Set    []uint32
	From   []uint32
}

// CleanBrokerData removes a broker and everything that points at it.
type CleanBrokerData struct{ ID uint32 }

// DeclareExchange creates an exchange, or checks an existing one matches.
type DeclareExchange struct {
	Name    string
	Type    string // "direct", "fanout", "topic", "headers"
	Durable bool
}

// QueueOptions are a queue's declared options, as the wire defines them.
// Brokers interpret them; the controller only stores and compares them.
type QueueOptions = wire.QueueOptions

// The overflow policy as the controller's log and snapshots store it: the
// opposite numbering of the wire's, kept so that existing logs read the
// same. appendQueueOptions and decodeQueueOptions translate.
const (
	storedOverflowDropHead uint8 = iota
	storedOverflowRejectPublish
)

// storedOverflow and wireOverflow swap the two policies' numbers and keep
// any other byte as it is, so decoding and re-encoding give the same bytes.
func storedOverflow(o uint8) uint8 {
	switch o {
	case wire.OverflowDropHead:
		return storedOverflowDropHead
	case wire.OverflowRejectPublish:
		return storedOverflowRejectPublish
	}
	return o
}

func wireOverflow(stored uint8) uint8 {
	switch stored {
	case storedOverflowDropHead:
		return wire.OverflowDropHead
	case storedOverflowRejectPublish:
		return wire.OverflowRejectPublish
	}
	return stored
}

// DeclareQueue creates a queue, or checks an existing one matches.
type DeclareQueue struct {
	Name    string
	Options QueueOptions
}

// Bind binds a queue to an exchange with a key.
type Bind struct{ Exchange, Queue, Key string }

// Unbind removes a binding.
type Unbind struct{ Exchange, Queue, Key string }

// DeleteQueue deletes a queue and its bindings.
type DeleteQueue struct{ Name string }

// DeleteExchange deletes an exchange and its bindings.
type DeleteExchange struct{ Name string }

// Cluster modes.
const (
	ModeActiveActive uint8 = iota
	ModeActivePassive
)

// SetClusterConfig sets the group count (once), the mode and the unclean
// election default. The event that creates the groups also places them:
// each group gets a replica set of Replicas brokers (0: ReplicasDefault,
// or every registered broker when fewer) chosen from the brokers
// registered then; a later SetClusterConfig places only groups left
// unplaced and moves no placed group.
type SetClusterConfig struct {
	Groups          uint32
	Mode            uint8
	UncleanElection bool
	Replicas        uint32 // encoded only when not 0: older logs hold none
}

// ReplicasDefault is a group's replica count when cluster init names none.
const ReplicasDefault = 3

// SetAttribute sets a cluster attribute (an admin key/value). Empty value
// deletes it.
type SetAttribute struct{ Key, Value string }

// PrimaryCandidate is one broker's entry in the heartbeat snapshot a
// primary election is decided from. Data is the sum of the indexes of the
// group log ends the broker last reported: how much it holds.
type PrimaryCandidate struct {
	Broker uint32
	Alive  bool
	Data   uint64
}

// ElectPrimary elects the primary broker of an active-passive cluster (the
// controlplane package's primary.go states the rule). Epoch is the primary epoch the proposer saw; a
// primary epoch that has moved on refuses the event. The heartbeat data is
// carried in the event so apply never looks outside the state machine.
type ElectPrimary struct {
	Epoch      uint32
	Preferred  uint32 // 0: none; otherwise a handover to this broker
	Candidates []PrimaryCandidate
}

func (ApplyBrokerID) Kind() EventKind     { return KindApplyBrokerID }
func (RegisterBroker) Kind() EventKind    { return KindRegisterBroker }
func (ElectMaster) Kind() EventKind       { return KindElectMaster }
func (AlterSyncStateSet) Kind() EventKind { return KindAlterSyncStateSet }
func (CleanBrokerData) Kind() EventKind   { return KindCleanBrokerData }
func (DeclareExchange) Kind() EventKind   { return KindDeclareExchange }
func (DeclareQueue) Kind() EventKind      { return KindDeclareQueue }
func (Bind) Kind() EventKind              { return KindBind }
func (Unbind) Kind() EventKind            { return KindUnbind }
func (DeleteQueue) Kind() EventKind       { return KindDeleteQueue }
func (DeleteExchange) Kind() EventKind    { return KindDeleteExchange }
func (SetClusterConfig) Kind() EventKind  { return KindSetClusterConfig }
func (SetAttribute) Kind() EventKind      { return KindSetAttribute }
func (ElectPrimary) Kind() EventKind      { return KindElectPrimary }

func (ev *ApplyBrokerID) appendBody(b []byte) []byte { return wire.AppendU32(b, ev.Requested) }
func (ev *ApplyBrokerID) decodeBody(r *wire.Reader)  { ev.Requested = r.U32() }

func (ev *RegisterBroker) appendBody(b []byte) []byte {
	b = wire.AppendU32(b, ev.ID)
	b = wire.AppendU16(b, ev.Version)
	b = wire.AppendU32(b, uint32(len(ev.Addrs)))
	for _, a := range ev.Addrs {
		b = AppendString(b, a)
	}
	return b
}
func (ev *RegisterBroker) decodeBody(r *wire.Reader) {
	ev.ID = r.U32()
	ev.Version = r.U16()
	n := r.Count(2)
	ev.Addrs = make([]string, 0, n)
	for i := 0; i < n; i++ {
		ev.Addrs = append(ev.Addrs, ReadString(r))
	}
}

func (ev *ElectMaster) appendBody(b []byte) []byte {
	b = wire.AppendBool(b, ev.Unclean)
	b = wire.AppendU32(b, uint32(len(ev.Groups)))
	for _, g := range ev.Groups {
		b = wire.AppendU32(b, g.Group)
		b = wire.AppendU32(b, g.Epoch)
		b = wire.AppendU32(b, g.Preferred)
		b = wire.AppendU32(b, uint32(len(g.Candidates)))
		for _, c := range g.Candidates {
			b = wire.AppendU32(b, c.Broker)
			b = wire.AppendBool(b, c.Alive)
			b = wire.AppendU32(b, c.LogEnd.Epoch)
			b = wire.AppendU64(b, c.LogEnd.Index)
		}
	}
	return b
}
func (ev *ElectMaster) decodeBody(r *wire.Reader) {
	ev.Unclean = r.Bool()
	n := r.Count(16)
	ev.Groups = make([]ElectGroup, n)
	for i := range ev.Groups {
		g := &ev.Groups[i]
		g.Group, g.Epoch, g.Preferred = r.U32(), r.U32(), r.U32()
		m := r.Count(17)
		g.Candidates = make([]Candidate, m)
		for j := range g.Candidates {
			c := &g.Candidates[j]
			c.Broker = r.U32()
			c.Alive = r.Bool()
			c.LogEnd.Epoch = r.U32()
			c.LogEnd.Index = r.U64()
		}
	}
}

func (ev *AlterSyncStateSet) appendBody(b []byte) []byte {
	b = wire.AppendU32(b, ev.Group)
	b = wire.AppendU32(b, ev.Master)
	b = wire.AppendU32(b, ev.Epoch)
	b = AppendIDs(b, ev.Set)
	if ev.From != nil {
		b = AppendIDs(b, ev.From)
	}
	return b
}
func (ev *AlterSyncStateSet) decodeBody(r *wire.Reader) {
	ev.Group, ev.Master, ev.Epoch = r.U32(), r.U32(), r.U32()
	ev.Set = ReadIDs(r)
	if r.Remaining() > 0 {
		ev.From = ReadIDs(r)
		if ev.From == nil {
			ev.From = []uint32{}
		}
	}
}

func (ev *CleanBrokerData) appendBody(b []byte) []byte { return wire.AppendU32(b, ev.ID) }
func (ev *CleanBrokerData) decodeBody(r *wire.Reader)  { ev.ID = r.U32() }

func (ev *DeclareExchange) appendBody(b []byte) []byte {
	return wire.AppendBool(AppendString(AppendString(b, ev.Name), ev.Type), ev.Durable)
}
func (ev *DeclareExchange) decodeBody(r *wire.Reader) {
	ev.Name, ev.Type, ev.Durable = ReadString(r), ReadString(r), r.Bool()
}

func appendQueueOptions(b []byte, o *QueueOptions) []byte {
	b = wire.AppendBool(b, o.Durable)
	b = wire.AppendBool(b, o.Exclusive)
	b = wire.AppendBool(b, o.AutoDelete)
	b = wire.AppendU64(b, o.MessageTTLMs)
	b = wire.AppendU64(b, o.MaxLength)
	// The overflow byte's high nibble holds the max priority: stored
	// options from before priorities (nibble 0) read the same, and no
	// format changes. Overflow policies and max priorities both fit in 4
	// bits (QueueOptions.Check).
	b = wire.AppendU8(b, storedOverflow(o.Overflow)|o.MaxPriority<<4)
	b = AppendString(b, o.DeadLetterExchange)
	b = wire.AppendU32(b, o.MaxDeliveries)
	b = wire.AppendU64(b, o.MaxLengthBytes)
	return AppendString(b, o.DeadLetterKey)
}
func decodeQueueOptions(r *wire.Reader, o *QueueOptions) {
	o.Durable, o.Exclusive, o.AutoDelete = r.Bool(), r.Bool(), r.Bool()
	o.MessageTTLMs, o.MaxLength = r.U64(), r.U64()
	stored := r.U8()
	o.Overflow, o.MaxPriority = wireOverflow(stored&0x0f), stored>>4
	o.DeadLetterExchange = ReadString(r)
	o.MaxDeliveries = r.U32()
	o.MaxLengthBytes = r.U64()
	o.DeadLetterKey = ReadString(r)
}

func (ev *DeclareQueue) appendBody(b []byte) []byte {
	return appendQueueOptions(AppendString(b, ev.Name), &ev.Options)
}
func (ev *DeclareQueue) decodeBody(r *wire.Reader) {
	ev.Name = ReadString(r)
	decodeQueueOptions(r, &ev.Options)
}

func appendBinding(b []byte, exchange, queue, key string) []byte {
	return AppendString(AppendString(AppendString(b, exchange), queue), key)
}

func (ev *Bind) appendBody(b []byte) []byte { return appendBinding(b, ev.Exchange, ev.Queue, ev.Key) }
func (ev *Bind) decodeBody(r *wire.Reader) {
	ev.Exchange, ev.Queue, ev.Key = ReadString(r), ReadString(r), ReadString(r)
}
func (ev *Unbind) appendBody(b []byte) []byte { return appendBinding(b, ev.Exchange, ev.Queue, ev.Key) }
func (ev *Unbind) decodeBody(r *wire.Reader) {
	ev.Exchange, ev.Queue, ev.Key = ReadString(r), ReadString(r), ReadString(r)
}

func (ev *DeleteQueue) appendBody(b []byte) []byte    { return AppendString(b, ev.Name) }
func (ev *DeleteQueue) decodeBody(r *wire.Reader)     { ev.Name = ReadString(r) }
func (ev *DeleteExchange) appendBody(b []byte) []byte { return AppendString(b, ev.Name) }
func (ev *DeleteExchange) decodeBody(r *wire.Reader)  { ev.Name = ReadString(r) }

func (ev *SetClusterConfig) appendBody(b []byte) []byte {
	b = wire.AppendU32(b, ev.Groups)
	b = wire.AppendU8(b, ev.Mode)
	b = wire.AppendBool(b, ev.UncleanElection)
	if ev.Replicas != 0 {
		b = wire.AppendU32(b, ev.Replicas)
	}
	return b
}
func (ev *SetClusterConfig) decodeBody(r *wire.Reader) {
	ev.Groups, ev.Mode, ev.UncleanElection = r.U32(), r.U8(), r.Bool()
	if r.Remaining() > 0 {
		ev.Replicas = r.U32()
		if ev.Replicas == 0 {
			r.Skip(r.Remaining() + 1) // 0 is written as absent: one encoding per event
		}
	}
}

func (ev *SetAttribute) appendBody(b []byte) []byte {
	return AppendString(AppendString(b, ev.Key), ev.Value)
}
func (ev *SetAttribute) decodeBody(r *wire.Reader) { ev.Key, ev.Value = ReadString(r), ReadString(r) }

func (ev *ElectPrimary) appendBody(b []byte) []byte {
	b = wire.AppendU32(b, ev.Epoch)
	b = wire.AppendU32(b, ev.Preferred)
	b = wire.AppendU32(b, uint32(len(ev.Candidates)))
	for _, c := range ev.Candidates {
		b = wire.AppendU32(b, c.Broker)
		b = wire.AppendBool(b, c.Alive)
		b = wire.AppendU64(b, c.Data)
	}
	return b
}
func (ev *ElectPrimary) decodeBody(r *wire.Reader) {
	ev.Epoch, ev.Preferred = r.U32(), r.U32()
	n := r.Count(13)
	ev.Candidates = nil // none (an admin handover) decodes as it was built
	if n > 0 {
		ev.Candidates = make([]PrimaryCandidate, n)
	}
	for i := range ev.Candidates {
		c := &ev.Candidates[i]
		c.Broker = r.U32()
		c.Alive = r.Bool()
		c.Data = r.U64()
	}
}

// EncodeEvent appends the encoding of ev (kind byte then body) to dst.
func EncodeEvent(dst []byte, ev Event) []byte {
	return ev.appendBody(append(dst, byte(ev.Kind())))
}

func newEvent(k EventKind) Event {
	switch k {
	case KindApplyBrokerID:
		return &ApplyBrokerID{}
	case KindRegisterBroker:
		return &RegisterBroker{}
	case KindElectMaster:
		return &ElectMaster{}
	case KindAlterSyncStateSet:
		return &AlterSyncStateSet{}
	case KindCleanBrokerData:
		return &CleanBrokerData{}
	case KindDeclareExchange:
		return &DeclareExchange{}
	case KindDeclareQueue:
		return &DeclareQueue{}
	case KindBind:
		return &Bind{}
	case KindUnbind:
		return &Unbind{}
	case KindDeleteQueue:
		return &DeleteQueue{}
	case KindDeleteExchange:
		return &DeleteExchange{}
	case KindSetClusterConfig:
		return &SetClusterConfig{}
	case KindSetAttribute:
		return &SetAttribute{}
	case KindElectPrimary:
		return &ElectPrimary{}
	case KindAddUser:
		return &AddUser{}
	case KindSetUserCredentials:
		return &SetUserCredentials{}
	case KindSetPermissions:
		return &SetPermissions{}
	case KindRemoveUser:
		return &RemoveUser{}
	}
	return nil
}

// DecodeEvent decodes one event. It returns pointer event types.
func DecodeEvent(b []byte) (Event, error) {
	if len(b) < 1 {
		return nil, wire.ErrMalformed
	}
	ev := newEvent(EventKind(b[0]))
	if ev == nil {
		return nil, fmt.Errorf("controlplane: unknown event kind %d", b[0])
	}
	r := wire.NewReader(b[1:])
	ev.decodeBody(r)
	if err := r.Done(); err != nil {
		return nil, err
	}
	return ev, nil
}

// Limits checked by ValidateEvent before an event is proposed.
const (
	NameLenMax           = 255
	AddrsMax             = 16
	ElectGroupsMax       = 4096 // groups per ElectMaster event
	CandidatesMax        = 64
	PrimaryCandidatesMax = 1024 // candidates per ElectPrimary event
	SyncStateSetSizeMax  = 64
	GroupCountMax        = 1 << 20
)

func validName(what, s string) error {
	if s == "" || len(s) > NameLenMax {
		return fmt.Errorf("controlplane: %s name must be 1..%d bytes", what, NameLenMax)
	}
	return nil
}

// ValidateEvent rejects events that are malformed before they reach the log.
// Apply also copes with them, so this is about clear errors, not safety.
func ValidateEvent(ev Event) error {
	switch ev := ev.(type) {
	case *RegisterBroker:
		if ev.ID == 0 || len(ev.Addrs) > AddrsMax {
			return fmt.Errorf("controlplane: register broker needs an id and at most %d addresses", AddrsMax)
		}
		for _, a := range ev.Addrs {
			if a == "" || len(a) > NameLenMax {
				return fmt.Errorf("controlplane: bad broker address %q", a)
			}
		}
	case *ElectMaster:
		if len(ev.Groups) == 0 || len(ev.Groups) > ElectGroupsMax {
			return fmt.Errorf("controlplane: elect master needs 1..%d groups", ElectGroupsMax)
		}
		for _, g := range ev.Groups {
			if len(g.Candidates) > CandidatesMax {
				return fmt.Errorf("controlplane: at most %d candidates per group", CandidatesMax)
			}
		}
	case *AlterSyncStateSet:
		if len(ev.Set) == 0 || len(ev.Set) > SyncStateSetSizeMax {
			return fmt.Errorf("controlplane: SyncStateSet size must be 1..%d", SyncStateSetSizeMax)
		}
	case *DeclareExchange:
		if err := validName("exchange", ev.Name); err != nil {
			return err
		}
		if !slices.Contains([]string{"direct", "fanout", "topic", "headers"}, ev.Type) {
			return fmt.Errorf("controlplane: unknown exchange type %q", ev.Type)
		}
	case *DeclareQueue:
		if err := validName("queue", ev.Name); err != nil {
			return err
		}
		if ev.Options.Overflow > wire.OverflowDropHead || len(ev.Options.DeadLetterExchange) > NameLenMax {
			return fmt.Errorf("controlplane: bad queue options")
		}
	case *Bind:
		if err := validName("exchange", ev.Exchange); err != nil {
			return err
		}
		if err := validName("queue", ev.Queue); err != nil {
			return err
		}
		if len(ev.Key) > NameLenMax {
			return fmt.Errorf("controlplane: binding key longer than %d bytes", NameLenMax)
		}
	case *Unbind:
		return ValidateEvent(&Bind{ev.Exchange, ev.Queue, ev.Key})
	case *DeleteQueue:
		return validName("queue", ev.Name)
	case *DeleteExchange:
		return validName("exchange", ev.Name)
	case *SetClusterConfig:
		if ev.Groups == 0 || ev.Groups > GroupCountMax || ev.Mode > ModeActivePassive {
			return fmt.Errorf("controlplane: group count must be 1..%d and mode known", GroupCountMax)
		}
		if ev.Replicas > SyncStateSetSizeMax {
			return fmt.Errorf("controlplane: at most %d replicas per group", SyncStateSetSizeMax)
		}
	case *SetAttribute:
		if err := validName("attribute", ev.Key); err != nil {
			return err
		}
		if len(ev.Value) > StringLenMax {
			return fmt.Errorf("controlplane: attribute value longer than %d bytes", StringLenMax)
		}
	case *ElectPrimary:
		if len(ev.Candidates) > PrimaryCandidatesMax {
			return fmt.Errorf("controlplane: at most %d candidates per primary election", PrimaryCandidatesMax)
		}
	case *AddUser, *SetUserCredentials, *SetPermissions, *RemoveUser:
		return validateUserEvent(ev)
	case nil:
		return fmt.Errorf("controlplane: nil event")
	}
	return nil
}
