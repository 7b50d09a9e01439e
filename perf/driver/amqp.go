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

type amqpDriver struct {
	opts Options
	own  owned
}

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

func (d *amqpDriver) Setup(ctx context.Context, queues []string, cc ConsumerConfig, so SetupOptions) error {
	conn, err := amqp.Dial(amqpURL(addrFor(d.opts.Addrs, 0)))
	if err != nil {
		return fmt.Errorf("driver: amqp dial: %w", err)
	}
	defer conn.Close()
	return setupQueues(ctx, &amqpOps{conn: conn}, &d.own, queues, cc, so)
}

func (d *amqpDriver) Created() []string { return d.own.created() }

func (d *amqpDriver) Cleanup(ctx context.Context) error {
	if d.own.empty() {
		return nil
	}
	conn, err := amqp.Dial(amqpURL(addrFor(d.opts.Addrs, 0)))
	if err != nil {
		return fmt.Errorf("driver: amqp dial: %w", err)
	}
	defer conn.Close()
	return cleanupQueues(ctx, &amqpOps{conn: conn}, &d.own)
}

func (d *amqpDriver) Close() error { return nil }

// amqpOps open a channel per step: a failed passive declare closes its
// channel.
type amqpOps struct{ conn *amqp.Connection }

func (o *amqpOps) channel() (*amqp.Channel, error) {
	ch, err := o.conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("driver: amqp channel: %w", err)
	}
	return ch, nil
}

func (o *amqpOps) inspect(_ context.Context, q string) (queueState, error) {
	ch, err := o.channel()
	if err != nil {
		return queueState{}, err
	}
	defer ch.Close()
	info, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
	var aerr *amqp.Error
	if errors.As(err, &aerr) && aerr.Code == amqp.NotFound {
		return queueState{}, nil
	}
	if err != nil {
		return queueState{}, fmt.Errorf("driver: amqp check queue %s: %w", q, err)
	}
	// Messages counts ready ones only; a queue with unacked ones has a
	// consumer, which is counted.
	return queueState{exists: true, messages: int64(info.Messages), consumers: info.Consumers}, nil
}

func (o *amqpOps) create(_ context.Context, q string, _ ConsumerConfig) error {
	ch, err := o.channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	// Quorum queues are always durable and replicated by Raft.
	if _, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		return fmt.Errorf("driver: amqp declare queue %s: %w", q, err)
	}
	return nil
}

func (o *amqpOps) adopt(context.Context, string, ConsumerConfig) (bool, error) { return false, nil }

func (o *amqpOps) remove(_ context.Context, q string) error {
	ch, err := o.channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	_, err = ch.QueueDelete(q, false, false, false)
	var aerr *amqp.Error
	if err != nil && !(errors.As(err, &aerr) && aerr.Code == amqp.NotFound) {
		return fmt.Errorf("driver: amqp delete queue %s: %w", q, err)
	}
	return nil
}

func (o *amqpOps) unadopt(context.Context, string) error { return nil }

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
