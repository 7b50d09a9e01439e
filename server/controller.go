package server

import (
	"context"
	"errors"
	"time"

	"github.com/berthmq/berth/controlplane"
	"github.com/berthmq/berth/shards"
	"github.com/berthmq/berth/wire"
)

// controllerWiring records durable wiring in the controller (single-node
// mode: the one-member controller berthd runs in-process). It implements
// shards.WiringLog.
type controllerWiring struct {
	n       *controlplane.Node
	timeout time.Duration
}

func (w *controllerWiring) propose(ev controlplane.Event) error {
	ctx, cancel := context.WithTimeout(context.Background(), w.timeout)
	defer cancel()
	res, err := w.n.Propose(ctx, ev)
	if err != nil {
		return shards.Errorf(wire.CodeInternal, "controller: %v", err)
	}
	if err := res.Err(); err != nil {
		var re *controlplane.ResultError
		code := wire.CodeInternal
		if errors.As(err, &re) {
			switch re.Code {
			case controlplane.CodeNotFound:
				code = wire.CodeNotFound
			case controlplane.CodeConflict:
				code = wire.CodePreconditionFailed
			case controlplane.CodeInvalid:
				code = wire.CodeInvalid
			}
		}
		return shards.Errorf(code, "controller: %s", res.Msg)
	}
	return nil
}

var exchangeKinds = [...]string{shards.KindDirect: "direct", shards.KindFanout: "fanout", shards.KindTopic: "topic"}

func toControllerQueue(o shards.QueueOptions) controlplane.QueueOptions {
	overflow := controlplane.OverflowRejectPublish
	if o.Overflow == wire.OverflowDropHead {
		overflow = controlplane.OverflowDropHead
	}
	return controlplane.QueueOptions{
		Durable: o.Durable, Exclusive: o.Exclusive, AutoDelete: o.AutoDelete,
		TTLMs: uint64(o.MessageTTLNanos / 1e6), MaxLength: o.MaxLength, MaxLengthBytes: o.MaxLengthBytes,
		Overflow: overflow, DeadLetterExchange: o.DeadLetterExchange, DeadLetterKey: o.DeadLetterKey,
		MaxDeliveries: o.MaxDeliveries,
	}
}

func fromControllerQueue(o controlplane.QueueOptions) shards.QueueOptions {
	overflow := wire.OverflowRejectPublish
	if o.Overflow == controlplane.OverflowDropHead {
		overflow = wire.OverflowDropHead
	}
	return shards.QueueOptions{
		Durable: o.Durable, Exclusive: o.Exclusive, AutoDelete: o.AutoDelete,
		MessageTTLNanos: int64(o.TTLMs) * 1e6, MaxLength: o.MaxLength, MaxLengthBytes: o.MaxLengthBytes,
		Overflow: overflow, DeadLetterExchange: o.DeadLetterExchange, DeadLetterKey: o.DeadLetterKey,
		MaxDeliveries: o.MaxDeliveries,
	}
}

func (w *controllerWiring) DeclareExchange(name string, kind uint8, opts shards.ExchangeOptions) error {
	return w.propose(&controlplane.DeclareExchange{Name: name, Type: exchangeKinds[kind], Durable: opts.Durable})
}

func (w *controllerWiring) DeclareQueue(name string, opts shards.QueueOptions) error {
	return w.propose(&controlplane.DeclareQueue{Name: name, Options: toControllerQueue(opts)})
}

func (w *controllerWiring) Bind(exchange, queue, key string) error {
	return w.propose(&controlplane.Bind{Exchange: exchange, Queue: queue, Key: key})
}

func (w *controllerWiring) Unbind(exchange, queue, key string) error {
	return w.propose(&controlplane.Unbind{Exchange: exchange, Queue: queue, Key: key})
}

func (w *controllerWiring) DeleteQueue(name string) error {
	return w.propose(&controlplane.DeleteQueue{Name: name})
}

func (w *controllerWiring) DeleteExchange(name string) error {
	return w.propose(&controlplane.DeleteExchange{Name: name})
}

// Load reads the wiring by a consistent read, so it sees every change the
// controller committed.
func (w *controllerWiring) Load() (*shards.WiringSnapshot, error) {
	ctx, cancel := context.WithTimeout(context.Background(), w.timeout)
	defer cancel()
	var cw controlplane.Wiring
	if err := w.n.Read(ctx, controlplane.ReadConsistent, func(st *controlplane.State) { cw = st.Wiring() }); err != nil {
		return nil, err
	}
	snap := &shards.WiringSnapshot{}
	for _, x := range cw.Exchanges {
		kind := -1
		for k, name := range exchangeKinds {
			if name == x.Type {
				kind = k
			}
		}
		if kind < 0 {
			continue // a kind this broker does not serve
		}
		snap.Exchanges = append(snap.Exchanges, shards.WiringExchange{Name: x.Name, Kind: uint8(kind), Options: shards.ExchangeOptions{Durable: x.Durable}})
	}
	for _, q := range cw.Queues {
		snap.Queues = append(snap.Queues, shards.WiringQueue{Name: q.Name, Options: fromControllerQueue(q.Options)})
	}
	for _, b := range cw.Bindings {
		snap.Bindings = append(snap.Bindings, shards.Binding{Exchange: b.Exchange, Queue: b.Queue, Key: b.Key})
	}
	return snap, nil
}
