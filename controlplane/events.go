package controlplane

import (
	"fmt"
	"slices"
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
	kindMax
)

// Event is a write event: it goes through the raft log and is applied by
// every controller's state machine.
type Event interface {
	Kind() EventKind
	encode(e *encoder)
	decode(d *decoder)
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
// at the current epoch may do it.
type AlterSyncStateSet struct {
	Group  uint32
	Master uint32
	Epoch  uint32
	Set    []uint32
}

// CleanBrokerData removes a broker and everything that points at it.
type CleanBrokerData struct{ ID uint32 }

// DeclareExchange creates an exchange, or checks an existing one matches.
type DeclareExchange struct {
	Name    string
	Type    string // "direct", "fanout", "topic", "headers"
	Durable bool
}

// Overflow policies for a queue at its max length.
const (
	OverflowDropHead uint8 = iota
	OverflowRejectPublish
)

// QueueOptions are a queue's declared options. Brokers interpret them; the
// controller only stores and compares them.
type QueueOptions struct {
	Durable            bool
	Exclusive          bool
	AutoDelete         bool
	TTLMs              uint64
	MaxLength          uint64
	Overflow           uint8
	DeadLetterExchange string
	MaxDeliveries      uint32
	MaxLengthBytes     uint64
	DeadLetterKey      string
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
// election default.
type SetClusterConfig struct {
	Groups          uint32
	Mode            uint8
	UncleanElection bool
}

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

// ElectPrimary elects the primary broker of an active-passive cluster (see
// primary.go for the rule). Epoch is the primary epoch the proposer saw; a
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

func (ev *ApplyBrokerID) encode(e *encoder) { e.u32(ev.Requested) }
func (ev *ApplyBrokerID) decode(d *decoder) { ev.Requested = d.u32() }

func (ev *RegisterBroker) encode(e *encoder) {
	e.u32(ev.ID)
	e.u16(ev.Version)
	e.u32(uint32(len(ev.Addrs)))
	for _, a := range ev.Addrs {
		e.str(a)
	}
}
func (ev *RegisterBroker) decode(d *decoder) {
	ev.ID = d.u32()
	ev.Version = d.u16()
	n := d.count(2)
	ev.Addrs = make([]string, 0, n)
	for i := 0; i < n; i++ {
		ev.Addrs = append(ev.Addrs, d.str())
	}
}

func (ev *ElectMaster) encode(e *encoder) {
	e.boolean(ev.Unclean)
	e.u32(uint32(len(ev.Groups)))
	for _, g := range ev.Groups {
		e.u32(g.Group)
		e.u32(g.Epoch)
		e.u32(g.Preferred)
		e.u32(uint32(len(g.Candidates)))
		for _, c := range g.Candidates {
			e.u32(c.Broker)
			e.boolean(c.Alive)
			e.u32(c.LogEnd.Epoch)
			e.u64(c.LogEnd.Index)
		}
	}
}
func (ev *ElectMaster) decode(d *decoder) {
	ev.Unclean = d.boolean()
	n := d.count(16)
	ev.Groups = make([]ElectGroup, n)
	for i := range ev.Groups {
		g := &ev.Groups[i]
		g.Group, g.Epoch, g.Preferred = d.u32(), d.u32(), d.u32()
		m := d.count(17)
		g.Candidates = make([]Candidate, m)
		for j := range g.Candidates {
			c := &g.Candidates[j]
			c.Broker = d.u32()
			c.Alive = d.boolean()
			c.LogEnd.Epoch = d.u32()
			c.LogEnd.Index = d.u64()
		}
	}
}

func (ev *AlterSyncStateSet) encode(e *encoder) {
	e.u32(ev.Group)
	e.u32(ev.Master)
	e.u32(ev.Epoch)
	encodeIDs(e, ev.Set)
}
func (ev *AlterSyncStateSet) decode(d *decoder) {
	ev.Group, ev.Master, ev.Epoch = d.u32(), d.u32(), d.u32()
	ev.Set = decodeIDs(d)
}

func encodeIDs(e *encoder, ids []uint32) {
	e.u32(uint32(len(ids)))
	for _, id := range ids {
		e.u32(id)
	}
}
func decodeIDs(d *decoder) []uint32 {
	n := d.count(4)
	ids := make([]uint32, n)
	for i := range ids {
		ids[i] = d.u32()
	}
	return ids
}

func (ev *CleanBrokerData) encode(e *encoder) { e.u32(ev.ID) }
func (ev *CleanBrokerData) decode(d *decoder) { ev.ID = d.u32() }

func (ev *DeclareExchange) encode(e *encoder) { e.str(ev.Name); e.str(ev.Type); e.boolean(ev.Durable) }
func (ev *DeclareExchange) decode(d *decoder) {
	ev.Name, ev.Type, ev.Durable = d.str(), d.str(), d.boolean()
}

func encodeQueueOptions(e *encoder, o *QueueOptions) {
	e.boolean(o.Durable)
	e.boolean(o.Exclusive)
	e.boolean(o.AutoDelete)
	e.u64(o.TTLMs)
	e.u64(o.MaxLength)
	e.u8(o.Overflow)
	e.str(o.DeadLetterExchange)
	e.u32(o.MaxDeliveries)
	e.u64(o.MaxLengthBytes)
	e.str(o.DeadLetterKey)
}
func decodeQueueOptions(d *decoder, o *QueueOptions) {
	o.Durable, o.Exclusive, o.AutoDelete = d.boolean(), d.boolean(), d.boolean()
	o.TTLMs, o.MaxLength = d.u64(), d.u64()
	o.Overflow = d.u8()
	o.DeadLetterExchange = d.str()
	o.MaxDeliveries = d.u32()
	o.MaxLengthBytes = d.u64()
	o.DeadLetterKey = d.str()
}

func (ev *DeclareQueue) encode(e *encoder) { e.str(ev.Name); encodeQueueOptions(e, &ev.Options) }
func (ev *DeclareQueue) decode(d *decoder) { ev.Name = d.str(); decodeQueueOptions(d, &ev.Options) }

func (ev *Bind) encode(e *encoder)   { e.str(ev.Exchange); e.str(ev.Queue); e.str(ev.Key) }
func (ev *Bind) decode(d *decoder)   { ev.Exchange, ev.Queue, ev.Key = d.str(), d.str(), d.str() }
func (ev *Unbind) encode(e *encoder) { e.str(ev.Exchange); e.str(ev.Queue); e.str(ev.Key) }
func (ev *Unbind) decode(d *decoder) { ev.Exchange, ev.Queue, ev.Key = d.str(), d.str(), d.str() }

func (ev *DeleteQueue) encode(e *encoder)    { e.str(ev.Name) }
func (ev *DeleteQueue) decode(d *decoder)    { ev.Name = d.str() }
func (ev *DeleteExchange) encode(e *encoder) { e.str(ev.Name) }
func (ev *DeleteExchange) decode(d *decoder) { ev.Name = d.str() }

func (ev *SetClusterConfig) encode(e *encoder) {
	e.u32(ev.Groups)
	e.u8(ev.Mode)
	e.boolean(ev.UncleanElection)
}
func (ev *SetClusterConfig) decode(d *decoder) {
	ev.Groups, ev.Mode, ev.UncleanElection = d.u32(), d.u8(), d.boolean()
}

func (ev *SetAttribute) encode(e *encoder) { e.str(ev.Key); e.str(ev.Value) }
func (ev *SetAttribute) decode(d *decoder) { ev.Key, ev.Value = d.str(), d.str() }

func (ev *ElectPrimary) encode(e *encoder) {
	e.u32(ev.Epoch)
	e.u32(ev.Preferred)
	e.u32(uint32(len(ev.Candidates)))
	for _, c := range ev.Candidates {
		e.u32(c.Broker)
		e.boolean(c.Alive)
		e.u64(c.Data)
	}
}
func (ev *ElectPrimary) decode(d *decoder) {
	ev.Epoch, ev.Preferred = d.u32(), d.u32()
	n := d.count(13)
	ev.Candidates = nil // none (an admin handover) decodes as it was built
	if n > 0 {
		ev.Candidates = make([]PrimaryCandidate, n)
	}
	for i := range ev.Candidates {
		c := &ev.Candidates[i]
		c.Broker = d.u32()
		c.Alive = d.boolean()
		c.Data = d.u64()
	}
}

// EncodeEvent appends the encoding of ev (kind byte then body) to dst.
func EncodeEvent(dst []byte, ev Event) []byte {
	e := encoder{b: append(dst, byte(ev.Kind()))}
	ev.encode(&e)
	return e.b
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
	}
	return nil
}

// DecodeEvent decodes one event. It returns pointer event types.
func DecodeEvent(b []byte) (Event, error) {
	if len(b) < 1 {
		return nil, errCodec
	}
	ev := newEvent(EventKind(b[0]))
	if ev == nil {
		return nil, fmt.Errorf("controlplane: unknown event kind %d", b[0])
	}
	d := decoder{b: b[1:]}
	ev.decode(&d)
	if err := d.finish(); err != nil {
		return nil, err
	}
	return ev, nil
}

// Limits checked by ValidateEvent before an event is proposed.
const (
	nameLenMax           = 255
	addrsMax             = 16
	electGroupsMax       = 4096 // groups per ElectMaster event
	candidatesMax        = 64
	primaryCandidatesMax = 1024 // candidates per ElectPrimary event
	syncStateSetSizeMax  = 64
	groupCountMax        = 1 << 20
)

func validName(what, s string) error {
	if s == "" || len(s) > nameLenMax {
		return fmt.Errorf("controlplane: %s name must be 1..%d bytes", what, nameLenMax)
	}
	return nil
}

// ValidateEvent rejects events that are malformed before they reach the log.
// Apply also copes with them, so this is about clear errors, not safety.
func ValidateEvent(ev Event) error {
	switch ev := ev.(type) {
	case *RegisterBroker:
		if ev.ID == 0 || len(ev.Addrs) > addrsMax {
			return fmt.Errorf("controlplane: register broker needs an id and at most %d addresses", addrsMax)
		}
		for _, a := range ev.Addrs {
			if a == "" || len(a) > nameLenMax {
				return fmt.Errorf("controlplane: bad broker address %q", a)
			}
		}
	case *ElectMaster:
		if len(ev.Groups) == 0 || len(ev.Groups) > electGroupsMax {
			return fmt.Errorf("controlplane: elect master needs 1..%d groups", electGroupsMax)
		}
		for _, g := range ev.Groups {
			if len(g.Candidates) > candidatesMax {
				return fmt.Errorf("controlplane: at most %d candidates per group", candidatesMax)
			}
		}
	case *AlterSyncStateSet:
		if len(ev.Set) == 0 || len(ev.Set) > syncStateSetSizeMax {
			return fmt.Errorf("controlplane: SyncStateSet size must be 1..%d", syncStateSetSizeMax)
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
		if ev.Options.Overflow > OverflowRejectPublish || len(ev.Options.DeadLetterExchange) > nameLenMax {
			return fmt.Errorf("controlplane: bad queue options")
		}
	case *Bind:
		if err := validName("exchange", ev.Exchange); err != nil {
			return err
		}
		if err := validName("queue", ev.Queue); err != nil {
			return err
		}
		if len(ev.Key) > nameLenMax {
			return fmt.Errorf("controlplane: binding key longer than %d bytes", nameLenMax)
		}
	case *Unbind:
		return ValidateEvent(&Bind{ev.Exchange, ev.Queue, ev.Key})
	case *DeleteQueue:
		return validName("queue", ev.Name)
	case *DeleteExchange:
		return validName("exchange", ev.Name)
	case *SetClusterConfig:
		if ev.Groups == 0 || ev.Groups > groupCountMax || ev.Mode > ModeActivePassive {
			return fmt.Errorf("controlplane: group count must be 1..%d and mode known", groupCountMax)
		}
	case *SetAttribute:
		if err := validName("attribute", ev.Key); err != nil {
			return err
		}
		if len(ev.Value) > stringLenMax {
			return fmt.Errorf("controlplane: attribute value longer than %d bytes", stringLenMax)
		}
	case *ElectPrimary:
		if len(ev.Candidates) > primaryCandidatesMax {
			return fmt.Errorf("controlplane: at most %d candidates per primary election", primaryCandidatesMax)
		}
	case nil:
		return fmt.Errorf("controlplane: nil event")
	}
	return nil
}
