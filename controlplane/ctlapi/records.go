package ctlapi

import "github.com/berthmq/berth/wire"

// The records clients read from the controller, and their encodings. The
// controller's state and its snapshots are made of the same records with
// the same encodings.

// ReadMode picks how a read is served.
type ReadMode uint8

const (
	// ReadConsistent is linearizable: the leader confirms it is still
	// leader by ReadIndex (a heartbeat round) or, when the node runs with
	// LeaseRead, by its lease.
	ReadConsistent ReadMode = iota
	// ReadFollower is linearizable and served by any controller: it asks
	// the leader for a ReadIndex and waits to apply up to it, or redirects
	// when too far behind.
	ReadFollower
	// ReadUnsafe is served from the leader's state with no check.
	ReadUnsafe
)

// GroupLogEnd is one group's log end as a broker reports it.
type GroupLogEnd struct {
	Group  uint32
	LogEnd LogEnd
}

// Broker is a registered broker.
type Broker struct {
	ID      uint32
	Addrs   []string
	Version uint16
}

// AppendBroker appends a broker as a RegisterBroker event's body.
func AppendBroker(b []byte, br Broker) []byte { return (*RegisterBroker)(&br).appendBody(b) }

// ReadBroker reads what AppendBroker wrote.
func ReadBroker(r *wire.Reader) Broker {
	var rb RegisterBroker
	rb.decodeBody(r)
	return Broker(rb)
}

// Group is a replication group's controller record.
type Group struct {
	ID           uint32
	Master       uint32 // 0: no master
	Epoch        uint32
	SyncStateSet []uint32 // sorted
	// ElectedLogEnd is the winner's log end when it was elected.
	ElectedLogEnd LogEnd
	// Replicas is the group's replica set as the controller placed it at
	// "cluster init" (placement.go in package controlplane): the brokers
	// that hold the group's log, the first one the group's first master.
	// Only they are elected master or join the SyncStateSet. Empty: not
	// placed yet (the cluster was initialised before any broker registered).
	Replicas []uint32
}

// Binding binds a queue to an exchange with a key.
type Binding struct{ Exchange, Queue, Key string }

// ClusterConfig is the cluster-wide configuration.
type ClusterConfig struct {
	Groups          uint32
	Mode            uint8
	UncleanElection bool
	// Replicas is the replica count asked at "cluster init"; 0 asked for
	// the default (ReplicasDefault, or every broker registered when fewer).
	Replicas uint32
}

// AppendClusterConfig appends a configuration: a SetClusterConfig event's
// body, with the replica count always present.
func AppendClusterConfig(b []byte, c ClusterConfig) []byte {
	b = wire.AppendU32(b, c.Groups)
	b = wire.AppendU8(b, c.Mode)
	b = wire.AppendBool(b, c.UncleanElection)
	return wire.AppendU32(b, c.Replicas)
}

// ReadClusterConfig reads what AppendClusterConfig wrote.
func ReadClusterConfig(r *wire.Reader) ClusterConfig {
	return ClusterConfig{Groups: r.U32(), Mode: r.U8(), UncleanElection: r.Bool(), Replicas: r.U32()}
}

// Result codes of applying an event.
const (
	CodeOK uint8 = iota
	CodeNotFound
	CodeConflict
	CodeStaleEpoch
	CodeInvalid
	CodeWrongMode // the cluster mode does not allow it (a primary in active-active)
)

// Result is what applying one event returned.
type Result struct {
	Code  uint8
	Value uint64 // event-specific: the assigned broker id, groups elected
	Msg   string
}

// Err turns a non-OK result into an error.
func (r Result) Err() error {
	if r.Code == CodeOK {
		return nil
	}
	return &ResultError{Code: r.Code, Msg: r.Msg}
}

// ResultError is a state machine refusal: the event was applied and refused.
type ResultError struct {
	Code uint8
	Msg  string
}

func (e *ResultError) Error() string { return "controlplane: " + e.Msg }

// Wiring is a copy of all exchanges, queues and bindings.
type Wiring struct {
	Exchanges []DeclareExchange
	Queues    []DeclareQueue
	Bindings  []Binding
}

// AppendWiring appends the exchanges, the queues and the bindings, each as
// a count, then each item as its declaring event's body.
func AppendWiring(b []byte, w Wiring) []byte {
	b = wire.AppendU32(b, uint32(len(w.Exchanges)))
	for i := range w.Exchanges {
		b = w.Exchanges[i].appendBody(b)
	}
	b = wire.AppendU32(b, uint32(len(w.Queues)))
	for i := range w.Queues {
		b = w.Queues[i].appendBody(b)
	}
	b = wire.AppendU32(b, uint32(len(w.Bindings)))
	for _, bd := range w.Bindings {
		b = appendBinding(b, bd.Exchange, bd.Queue, bd.Key)
	}
	return b
}

// ReadWiring reads what AppendWiring wrote.
func ReadWiring(r *wire.Reader) Wiring {
	var w Wiring
	n := r.Count(5)
	w.Exchanges = make([]DeclareExchange, n)
	for i := range w.Exchanges {
		w.Exchanges[i].decodeBody(r)
	}
	n = r.Count(20)
	w.Queues = make([]DeclareQueue, n)
	for i := range w.Queues {
		w.Queues[i].decodeBody(r)
	}
	n = r.Count(6)
	w.Bindings = make([]Binding, n)
	for i := range w.Bindings {
		w.Bindings[i] = Binding{ReadString(r), ReadString(r), ReadString(r)}
	}
	return w
}
