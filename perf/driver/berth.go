package driver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/wire"
)

func init() { register("berth", openBerth) }

// acceptBatchMax bounds how many delivery tags one ACCEPT carries; a
// consumer also accepts whenever it has nothing more buffered.
const acceptBatchMax = 256

type berthDriver struct {
	opts Options
	own  owned
}

func openBerth(opts Options) (Driver, error) { return &berthDriver{opts: opts}, nil }

// dial opens a session to the first of at that answers, or, with no at,
// to the first of the driver's addresses from id's share on.
func (d *berthDriver) dial(ctx context.Context, id int, name string, at ...string) (*client.Conn, error) {
	cfg := client.Config{Name: name, TLS: d.opts.TLS, User: d.opts.User, Password: d.opts.Password}
	// The bench enforces its own window; the client's must not be the
	// tighter one, or it would measure the client's wait instead.
	if d.opts.Window > client.WindowDefault {
		cfg.Window = d.opts.Window
	}
	addrs := rotated(d.opts.Addrs, id)
	if len(at) > 0 {
		addrs = at
	}
	c, err := client.DialConfig(ctx, cfg, addrs...)
	if err != nil {
		return nil, fmt.Errorf("driver: berth dial: %w", err)
	}
	return c, nil
}

func (d *berthDriver) Setup(ctx context.Context, queues []string, cc ConsumerConfig, so SetupOptions) error {
	c, err := d.dial(ctx, 0, "berth-bench-setup")
	if err != nil {
		return err
	}
	ops := &berthOps{d: d, c: c}
	defer ops.close()
	return setupQueues(ctx, ops, &d.own, queues, cc, so)
}

func (d *berthDriver) Created() []string { return d.own.created() }

func (d *berthDriver) Cleanup(ctx context.Context) error {
	if d.own.empty() {
		return nil
	}
	c, err := d.dial(ctx, 0, "berth-bench-cleanup")
	if err != nil {
		return err
	}
	ops := &berthOps{d: d, c: c}
	defer ops.close()
	return cleanupQueues(ctx, ops, &d.own)
}

func (d *berthDriver) Close() error { return nil }

// berthOps act on one session, and with Options.Route also on one per
// queue's address for declares and deletes.
type berthOps struct {
	d      *berthDriver
	c      *client.Conn
	routed map[string]*client.Conn
}

// at is the session for queue q's declare and delete.
func (o *berthOps) at(ctx context.Context, q string) (*client.Conn, error) {
	if o.d.opts.Route == nil {
		return o.c, nil
	}
	addr, err := o.d.opts.Route(ctx, q)
	if err != nil {
		return nil, fmt.Errorf("driver: berth route %s: %w", q, err)
	}
	if c, ok := o.routed[addr]; ok {
		return c, nil
	}
	c, err := o.d.dial(ctx, 0, "berth-bench-setup", addr)
	if err != nil {
		return nil, err
	}
	if o.routed == nil {
		o.routed = map[string]*client.Conn{}
	}
	o.routed[addr] = c
	return c, nil
}

func (o *berthOps) close() {
	o.c.Close()
	for _, c := range o.routed {
		c.Close()
	}
}

func (o *berthOps) inspect(ctx context.Context, q string) (queueState, error) {
	err := o.c.DeclareQueue(ctx, q, client.QueueOptions{Passive: true})
	switch {
	case client.Code(err) == wire.CodeNotFound:
		return queueState{}, nil
	case err != nil:
		return queueState{}, fmt.Errorf("driver: berth check queue %s: %w", q, err)
	}
	st := queueState{exists: true, messages: -1}
	if o.d.opts.Admin == "" {
		st.unknown = "queue depths come from the broker's admin HTTP; give its address (--admin)"
		return st, nil
	}
	qs, err := adminQueues(ctx, o.d.opts.Admin)
	if err != nil {
		return st, err
	}
	for _, info := range qs {
		if info.Name == q {
			st.messages = int64(info.Ready) + int64(info.Unacked)
			st.consumers = info.Consumers
			return st, nil
		}
	}
	st.unknown = "the broker at " + o.d.opts.Admin + " does not list it"
	return st, nil
}

func (o *berthOps) create(ctx context.Context, q string, _ ConsumerConfig) error {
	c, err := o.at(ctx, q)
	if err != nil {
		return err
	}
	// Another client could declare the same queue between the check and
	// this declare: the protocol has no "create only if absent".
	if err := c.DeclareQueue(ctx, q, client.QueueOptions{Durable: o.d.opts.Persistent, MaxPriority: o.d.opts.MaxPriority}); err != nil {
		return fmt.Errorf("driver: berth declare queue %s: %w", q, err)
	}
	return nil
}

func (o *berthOps) adopt(context.Context, string, ConsumerConfig) (bool, error) { return false, nil }

func (o *berthOps) remove(ctx context.Context, q string) error {
	c, err := o.at(ctx, q)
	if err != nil {
		return err
	}
	if err := c.DeleteQueue(ctx, q, client.QueueDeleteOptions{}); err != nil && client.Code(err) != wire.CodeNotFound {
		return fmt.Errorf("driver: berth delete queue %s: %w", q, err)
	}
	return nil
}

func (o *berthOps) unadopt(context.Context, string) error { return nil }

// berthQueueInfo is the part of the admin endpoint's /v1/queues entries
// Setup reads.
type berthQueueInfo struct {
	Name      string `json:"name"`
	Ready     int    `json:"ready"`
	Unacked   int    `json:"unacked"`
	Consumers int    `json:"consumers"`
}

// adminBodyMax bounds the /v1/queues reply read.
const adminBodyMax = 64 << 20

func adminQueues(ctx context.Context, addr string) ([]berthQueueInfo, error) {
	url := addr
	if !strings.Contains(url, "://") {
		url = "http://" + url
	}
	url = strings.TrimRight(url, "/") + "/v1/queues"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("driver: berth admin address %q: %w", addr, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("driver: berth queue depths: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, adminBodyMax+1))
	if err != nil {
		return nil, fmt.Errorf("driver: berth queue depths: GET %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK || len(body) > adminBodyMax {
		return nil, fmt.Errorf("driver: berth queue depths: GET %s: %s", url, resp.Status)
	}
	var qs []berthQueueInfo
	if err := json.Unmarshal(body, &qs); err != nil {
		return nil, fmt.Errorf("driver: berth queue depths: GET %s: not a queue list: %w", url, err)
	}
	return qs, nil
}

// berthProducer publishes on one session, or with Options.Route on one
// session per address, each queue's messages to its own. Publish runs on
// one goroutine, so the maps need no lock.
type berthProducer struct {
	d     *berthDriver
	id    int
	c     *client.Conn // without Route
	conns map[string]*client.Conn
	queue map[string]*client.Conn // queue -> its route's session
	opts  client.PublishOptions
	// levels is MaxPriority+1: the priorities the producer cycles through.
	levels uint8
}

func (d *berthDriver) NewProducer(ctx context.Context, id int) (Producer, error) {
	p := &berthProducer{d: d, id: id, opts: client.PublishOptions{Persistent: d.opts.Persistent}, levels: d.opts.MaxPriority + 1}
	if d.opts.Route != nil {
		p.conns, p.queue = map[string]*client.Conn{}, map[string]*client.Conn{}
		return p, nil
	}
	c, err := d.dial(ctx, id, fmt.Sprintf("berth-bench-producer-%d", id))
	if err != nil {
		return nil, err
	}
	p.c = c
	return p, nil
}

func (p *berthProducer) conn(ctx context.Context, queue string) (*client.Conn, error) {
	if p.c != nil {
		return p.c, nil
	}
	if c, ok := p.queue[queue]; ok {
		return c, nil
	}
	addr, err := p.d.opts.Route(ctx, queue)
	if err != nil {
		return nil, fmt.Errorf("driver: berth route %s: %w", queue, err)
	}
	c, ok := p.conns[addr]
	if !ok {
		if c, err = p.d.dial(ctx, p.id, fmt.Sprintf("berth-bench-producer-%d", p.id), addr); err != nil {
			return nil, err
		}
		p.conns[addr] = c
	}
	p.queue[queue] = c
	return c, nil
}

func (p *berthProducer) Publish(ctx context.Context, queue string, payload []byte, done func(error)) error {
	c, err := p.conn(ctx, queue)
	if err != nil {
		return err
	}
	if p.levels > 1 {
		p.opts.Priority = (p.opts.Priority + 1) % p.levels
	}
	return c.PublishAsync(ctx, "", queue, payload, p.opts, done)
}

func (p *berthProducer) Close() error {
	if p.c != nil {
		return p.c.Close()
	}
	var errs []error
	for _, c := range p.conns {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}

type berthConsumer struct {
	c      *client.Conn
	cancel context.CancelFunc
	wg     sync.WaitGroup
	err    error // loop's failure other than being stopped; read after wg.Wait
}

func (d *berthDriver) NewConsumer(ctx context.Context, id int, queue string, cc ConsumerConfig, handle func([]byte)) (Consumer, error) {
	var at []string
	if d.opts.Route != nil {
		addr, err := d.opts.Route(ctx, queue)
		if err != nil {
			return nil, fmt.Errorf("driver: berth route %s: %w", queue, err)
		}
		at = []string{addr}
	}
	c, err := d.dial(ctx, id, fmt.Sprintf("berth-bench-consumer-%d", id), at...)
	if err != nil {
		return nil, err
	}
	mode := client.AckExplicit
	if cc.Ack == AckNone {
		mode = client.AckNone
	}
	sub, err := c.Subscribe(ctx, queue, client.SubscribeOptions{Credit: uint32(cc.Credit), AckMode: mode, AutoCredit: true})
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("driver: berth subscribe %s: %w", queue, err)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	bc := &berthConsumer{c: c, cancel: cancel}
	bc.wg.Add(1)
	go func() {
		defer bc.wg.Done()
		bc.err = consumeBerth(runCtx, sub, mode, handle)
	}()
	return bc, nil
}

func consumeBerth(ctx context.Context, sub *client.Consumer, mode client.AckMode, handle func([]byte)) error {
	tags := make([]uint64, 0, acceptBatchMax)
	for {
		m, err := sub.Next(ctx)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, client.ErrConsumerClosed) || errors.Is(err, client.ErrClosed) {
				return nil
			}
			return fmt.Errorf("driver: berth next: %w", err)
		}
		handle(m.Payload)
		if mode == client.AckNone {
			continue
		}
		tags = append(tags, m.Tag)
		if len(tags) >= acceptBatchMax || sub.Buffered() == 0 {
			// AcceptAsync reads tags before it returns, so the slice is
			// reused at once.
			if err := sub.AcceptAsync(ctx, tags, nil); err != nil {
				if ctx.Err() != nil || errors.Is(err, client.ErrClosed) {
					return nil
				}
				return fmt.Errorf("driver: berth accept: %w", err)
			}
			tags = tags[:0]
		}
	}
}

func (bc *berthConsumer) Close() error {
	bc.cancel()
	err := bc.c.Close()
	bc.wg.Wait()
	return errors.Join(bc.err, err)
}
