package driver

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func init() { register("nats", openNATS) }

// natsConsumerName is the one durable cursor all bench consumers of a
// stream share: a work-queue stream admits only non-overlapping consumers,
// so competing consumers must pull from the same one.
const natsConsumerName = "berth-bench"

// ErrNATSAckNone is returned for ack mode none: JetStream refuses pull
// consumers without explicit acks on a work-queue stream.
var ErrNATSAckNone = errors.New("driver: nats: a JetStream work-queue stream needs explicit acks; ack mode none is not supported")

type natsDriver struct {
	opts Options
	own  owned
}

func openNATS(opts Options) (Driver, error) { return &natsDriver{opts: opts}, nil }

func (d *natsDriver) connect(id int, name string) (*nats.Conn, error) {
	urls := make([]string, 0, len(d.opts.Addrs))
	for _, a := range rotated(d.opts.Addrs, id) {
		if !strings.Contains(a, "://") {
			a = "nats://" + a
		}
		urls = append(urls, a)
	}
	nc, err := nats.Connect(strings.Join(urls, ","), nats.Name(name), nats.DontRandomize())
	if err != nil {
		return nil, fmt.Errorf("driver: nats connect: %w", err)
	}
	return nc, nil
}

// jetStream opens a connection for setup or cleanup.
func (d *natsDriver) jetStream(name string) (*nats.Conn, jetstream.JetStream, error) {
	nc, err := d.connect(0, name)
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("driver: nats jetstream: %w", err)
	}
	return nc, js, nil
}

func (d *natsDriver) Setup(ctx context.Context, queues []string, cc ConsumerConfig, so SetupOptions) error {
	if cc.Ack == AckNone {
		return ErrNATSAckNone
	}
	nc, js, err := d.jetStream("berth-bench-setup")
	if err != nil {
		return err
	}
	defer nc.Close()
	return setupQueues(ctx, &natsOps{d: d, js: js}, &d.own, queues, cc, so)
}

func (d *natsDriver) Created() []string { return d.own.created() }

func (d *natsDriver) Cleanup(ctx context.Context) error {
	if d.own.empty() {
		return nil
	}
	nc, js, err := d.jetStream("berth-bench-cleanup")
	if err != nil {
		return err
	}
	defer nc.Close()
	return cleanupQueues(ctx, &natsOps{d: d, js: js}, &d.own)
}

func (d *natsDriver) Close() error { return nil }

// natsOps: a queue is a work-queue stream of the same name whose one
// subject is that name, read through one durable consumer.
type natsOps struct {
	d  *natsDriver
	js jetstream.JetStream
}

func (o *natsOps) inspect(ctx context.Context, q string) (queueState, error) {
	s, err := o.js.Stream(ctx, q)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return queueState{}, nil
	}
	if err != nil {
		return queueState{}, fmt.Errorf("driver: nats check stream %s: %w", q, err)
	}
	// Consumers are not counted: on JetStream they are configuration, not
	// readers that are there, and a work-queue stream refuses a second
	// consumer that would overlap with one it has.
	return queueState{exists: true, messages: int64(s.CachedInfo().State.Msgs)}, nil
}

func (o *natsOps) consumerConfig(cc ConsumerConfig) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       natsConsumerName,
		AckPolicy:     jetstream.AckExplicitPolicy,
		MaxAckPending: max(1, cc.Credit*max(1, cc.PerQueue)),
		Replicas:      o.d.opts.Replicas,
	}
}

func (o *natsOps) create(ctx context.Context, q string, cc ConsumerConfig) error {
	_, err := o.js.CreateStream(ctx, jetstream.StreamConfig{
		Name:      q,
		Subjects:  []string{q},
		Retention: jetstream.WorkQueuePolicy,
		Storage:   jetstream.FileStorage,
		Replicas:  o.d.opts.Replicas,
	})
	if err != nil {
		return fmt.Errorf("driver: nats create stream %s: %w", q, err)
	}
	if _, err := o.js.CreateConsumer(ctx, q, o.consumerConfig(cc)); err != nil {
		if derr := o.js.DeleteStream(context.WithoutCancel(ctx), q); derr != nil {
			err = errors.Join(err, fmt.Errorf("and deleting the stream it made: %w", derr))
		}
		return fmt.Errorf("driver: nats create consumer on %s: %w", q, err)
	}
	return nil
}

// adopt adds the bench's consumer to a stream that lacks it; one that is
// there already is used as it is.
func (o *natsOps) adopt(ctx context.Context, q string, cc ConsumerConfig) (bool, error) {
	_, err := o.js.Consumer(ctx, q, natsConsumerName)
	if err == nil {
		return false, nil
	}
	if !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return false, fmt.Errorf("driver: nats check consumer on %s: %w", q, err)
	}
	if _, err := o.js.CreateConsumer(ctx, q, o.consumerConfig(cc)); err != nil {
		return false, fmt.Errorf("driver: nats create consumer on %s: %w", q, err)
	}
	return true, nil
}

func (o *natsOps) remove(ctx context.Context, q string) error {
	if err := o.js.DeleteStream(ctx, q); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("driver: nats delete stream %s: %w", q, err)
	}
	return nil
}

func (o *natsOps) unadopt(ctx context.Context, q string) error {
	if err := o.js.DeleteConsumer(ctx, q, natsConsumerName); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return fmt.Errorf("driver: nats delete consumer on %s: %w", q, err)
	}
	return nil
}

// natsProducer waits for PubAcks in publish order on one goroutine: acks of
// one stream come back in order, and a single waiter avoids a goroutine per
// message.
type natsProducer struct {
	nc      *nats.Conn
	js      jetstream.JetStream
	pending chan natsPending // bounded by the window
	wg      sync.WaitGroup
}

type natsPending struct {
	f    jetstream.PubAckFuture
	done func(error)
}

func (d *natsDriver) NewProducer(ctx context.Context, id int) (Producer, error) {
	nc, err := d.connect(id, fmt.Sprintf("berth-bench-producer-%d", id))
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(d.opts.Window))
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("driver: nats jetstream: %w", err)
	}
	p := &natsProducer{nc: nc, js: js, pending: make(chan natsPending, d.opts.Window)}
	p.wg.Add(1)
	go p.waitAcks()
	return p, nil
}

func (p *natsProducer) waitAcks() {
	defer p.wg.Done()
	for pa := range p.pending {
		select {
		case <-pa.f.Ok():
			pa.done(nil)
		case err := <-pa.f.Err():
			pa.done(fmt.Errorf("driver: nats publish: %w", err))
		}
	}
}

func (p *natsProducer) Publish(ctx context.Context, queue string, payload []byte, done func(error)) error {
	f, err := p.js.PublishAsync(queue, payload)
	if err != nil {
		return fmt.Errorf("driver: nats publish: %w", err)
	}
	select {
	case p.pending <- natsPending{f: f, done: done}:
		return nil
	case <-ctx.Done():
		// Already sent: its outcome still has to reach done.
		go func() {
			select {
			case <-f.Ok():
				done(nil)
			case err := <-f.Err():
				done(err)
			}
		}()
		return nil
	}
}

func (p *natsProducer) Close() error {
	close(p.pending)
	p.wg.Wait()
	return p.nc.Drain()
}

type natsConsumer struct {
	nc *nats.Conn
	cc jetstream.ConsumeContext
}

func (d *natsDriver) NewConsumer(ctx context.Context, id int, queue string, cc ConsumerConfig, handle func([]byte)) (Consumer, error) {
	nc, err := d.connect(id, fmt.Sprintf("berth-bench-consumer-%d", id))
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("driver: nats jetstream: %w", err)
	}
	cons, err := js.Consumer(ctx, queue, natsConsumerName)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("driver: nats consumer %s: %w", queue, err)
	}
	consCtx, err := cons.Consume(func(m jetstream.Msg) {
		handle(m.Data())
		_ = m.Ack() // a lost ack redelivers; the bench counts by timestamp
	}, jetstream.PullMaxMessages(max(1, cc.Credit)))
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("driver: nats consume %s: %w", queue, err)
	}
	return &natsConsumer{nc: nc, cc: consCtx}, nil
}

func (c *natsConsumer) Close() error {
	c.cc.Stop()
	c.nc.Close()
	return nil
}
