package driver

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"
)

func init() { register("amqp", openAMQP) }

type amqpDriver struct{ opts Options }

func openAMQP(opts Options) (Driver, error) { return &amqpDriver{opts: opts}, nil }

// amqpURL accepts host:port (as guest, the default loopback account) or a
// full amqp:// URL.
func amqpURL(addr string) string {
	if strings.Contains(addr, "://") {
		return addr
	}
	return "amqp://guest:guest@" + addr + "/"
}

func (d *amqpDriver) dial(id int) (*amqp.Connection, *amqp.Channel, error) {
	conn, err := amqp.Dial(amqpURL(addrFor(d.opts.Addrs, id)))
	if err != nil {
		return nil, nil, fmt.Errorf("driver: amqp dial: %w", err)
	}
	ch, err := conn.Channel()
	if err != nil {
		conn.Close()
		return nil, nil, fmt.Errorf("driver: amqp channel: %w", err)
	}
	return conn, ch, nil
}

func (d *amqpDriver) Setup(ctx context.Context, queues []string, _ ConsumerConfig) error {
	conn, ch, err := d.dial(0)
	if err != nil {
		return err
	}
	defer conn.Close()
	for _, q := range queues {
		if _, err := ch.QueueDelete(q, false, false, false); err != nil {
			return fmt.Errorf("driver: amqp delete queue %s: %w", q, err)
		}
		// Quorum queues are always durable and replicated by Raft.
		_, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
		if err != nil {
			return fmt.Errorf("driver: amqp declare queue %s: %w", q, err)
		}
	}
	return nil
}

func (d *amqpDriver) Close() error { return nil }

// amqpProducer waits for confirms in publish order on one goroutine; a
// channel's confirms arrive in delivery-tag order.
type amqpProducer struct {
	conn    *amqp.Connection
	ch      *amqp.Channel
	mode    uint8
	pending chan amqpPending // bounded by the window
	wg      sync.WaitGroup
}

type amqpPending struct {
	dc   *amqp.DeferredConfirmation
	done func(error)
}

var errNacked = errors.New("driver: amqp publish nacked by broker")

func (d *amqpDriver) NewProducer(ctx context.Context, id int) (Producer, error) {
	conn, ch, err := d.dial(id)
	if err != nil {
		return nil, err
	}
	if err := ch.Confirm(false); err != nil {
		conn.Close()
		return nil, fmt.Errorf("driver: amqp confirm mode: %w", err)
	}
	mode := amqp.Transient
	if d.opts.Persistent {
		mode = amqp.Persistent
	}
	p := &amqpProducer{conn: conn, ch: ch, mode: mode, pending: make(chan amqpPending, d.opts.Window)}
	p.wg.Add(1)
	go p.waitConfirms()
	return p, nil
}

func (p *amqpProducer) waitConfirms() {
	defer p.wg.Done()
	for pa := range p.pending {
		<-pa.dc.Done()
		if pa.dc.Acked() {
			pa.done(nil)
		} else {
			pa.done(errNacked)
		}
	}
}

func (p *amqpProducer) Publish(ctx context.Context, queue string, payload []byte, done func(error)) error {
	dc, err := p.ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, false, false,
		amqp.Publishing{DeliveryMode: p.mode, Body: payload})
	if err != nil {
		return fmt.Errorf("driver: amqp publish: %w", err)
	}
	select {
	case p.pending <- amqpPending{dc: dc, done: done}:
	case <-ctx.Done():
		go func() {
			<-dc.Done()
			if dc.Acked() {
				done(nil)
			} else {
				done(errNacked)
			}
		}()
	}
	return nil
}

func (p *amqpProducer) Close() error {
	close(p.pending)
	p.wg.Wait()
	return p.conn.Close()
}

type amqpConsumer struct {
	conn *amqp.Connection
	wg   sync.WaitGroup
}

func (d *amqpDriver) NewConsumer(ctx context.Context, id int, queue string, cc ConsumerConfig, handle func([]byte)) (Consumer, error) {
	conn, ch, err := d.dial(id)
	if err != nil {
		return nil, err
	}
	if err := ch.Qos(max(1, cc.Credit), 0, false); err != nil {
		conn.Close()
		return nil, fmt.Errorf("driver: amqp qos: %w", err)
	}
	autoAck := cc.Ack == AckNone
	deliveries, err := ch.Consume(queue, fmt.Sprintf("berth-bench-%d", id), autoAck, false, false, false, nil)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("driver: amqp consume %s: %w", queue, err)
	}
	c := &amqpConsumer{conn: conn}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		// The channel closes when the connection does.
		for m := range deliveries {
			handle(m.Body)
			if !autoAck {
				_ = m.Ack(false)
			}
		}
	}()
	return c, nil
}

func (c *amqpConsumer) Close() error {
	err := c.conn.Close()
	c.wg.Wait()
	return err
}
