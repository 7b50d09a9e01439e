// Package groups runs a broker's replication groups: the peer transport
// between brokers (port 7401 by default; with cluster credentials every
// connection proves membership before its first frame, internal/peerauth),
// a Node that drives the replication/group state machines of the groups the
// controller placed on this broker with a write-ahead journal on disk,
// the Manager that follows the controller, and the Forwarder that sends
// events taken for other brokers' groups to those groups' masters
// (forward.go), whose forwarding connections arrive on the same peer port.
package groups

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/bytebufferpool"

	"github.com/berthmq/berth/internal/peerauth"
	"github.com/berthmq/berth/wire"
)

// Faults are injected into a transport's traffic, for tests: messages to
// a peer in CutOut are dropped when sent, messages from a peer in CutIn
// are dropped when received, Drop is the chance that any message sent is
// lost, and Delay holds every outgoing batch that long before it is
// written (order is kept).
type Faults struct {
	CutOut map[uint32]bool
	CutIn  map[uint32]bool
	Drop   float64
	Delay  time.Duration
}

// peerQueueMax and peerQueueBytes bound the frames queued for one peer,
// in count and in bytes (an Append of 64 entries of 1 MiB each is one
// frame). Past either new frames are dropped: the replication protocol
// resends what is not acknowledged.
const (
	peerQueueMax   = 8192
	peerQueueBytes = 32 << 20
)

// dialBackoffMax bounds the wait between two dials of an unreachable peer.
const dialBackoffMax = 500 * time.Millisecond

// Transport carries group messages between brokers over TCP: one
// connection for each direction of each pair of brokers, all groups
// multiplexed on it.
type Transport struct {
	self    uint32
	ln      net.Listener
	handler func(*wire.GroupMessage)
	log     *slog.Logger
	faults  atomic.Pointer[Faults]
	forward atomic.Pointer[ForwardHandler] // forward.go
	proxy   atomic.Pointer[ProxyHandler]   // forward.go
	// peerLost is told the id of a peer whose group connection to this
	// broker ended (SetPeerLost).
	peerLost atomic.Pointer[func(id uint32)]
	// auth proves cluster membership on every connection, both ways,
	// before a frame is read or written (nil: none).
	auth *peerauth.Auth

	mu    sync.Mutex
	addrs map[uint32]string
	out   map[uint32]*peerOut
	in    map[net.Conn]struct{}

	done chan struct{}
	wg   sync.WaitGroup

	// Dropped counts messages lost to full queues and injected faults.
	Dropped atomic.Uint64

	// queued is the memory of the frames in every peer's queue (their
	// arrays' capacity; QueuedBytes).
	queued atomic.Int64
}

type peerOut struct {
	id     uint32
	queue  chan *bytebufferpool.ByteBuffer // frames, from framePool
	bytes  atomic.Int64                    // in queue
	queued *atomic.Int64                   // the transport's, all peers'
}

// take accounts for a frame taken off the queue.
func (p *peerOut) take(frame *bytebufferpool.ByteBuffer) *bytebufferpool.ByteBuffer {
	p.bytes.Add(-int64(len(frame.B)))
	p.queued.Add(-int64(cap(frame.B)))
	return frame
}

// framePool holds the buffers of encoded peer frames: a Send encodes
// into one, and the peer's writer gives it back once bufio took a copy.
// Each Append allocated its frame before: 62 MB of the 365 MB that
// BenchmarkProposeAsync allocated over 200,000 proposals. bytebufferpool
// sizes the buffers it keeps by what it is given back, and the frames'
// size follows the batches'.
var framePool bytebufferpool.Pool

// QueuedBytes is the memory of the frames waiting to be written to all
// peers (up to peerQueueBytes of frame a peer), held until a connection
// takes them. Safe from any goroutine: the shards count it against the
// memory budget (shards/memory.go).
func (t *Transport) QueuedBytes() int64 { return t.queued.Load() }

// Listen starts a transport for broker self on addr. handler is called
// with each message received, on the receiving connection's goroutine; it
// must not block for long.
func Listen(addr string, self uint32, handler func(*wire.GroupMessage), log *slog.Logger) (*Transport, error) {
	return ListenAuth(addr, self, nil, handler, log)
}

// ListenAuth is Listen with every connection, inbound and outbound,
// proving cluster membership through auth before any frame crosses it.
func ListenAuth(addr string, self uint32, auth *peerauth.Auth, handler func(*wire.GroupMessage), log *slog.Logger) (*Transport, error) {
	if log == nil {
		log = slog.Default()
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("groups: peer listen on %s: %w", addr, err)
	}
	t := &Transport{self: self, ln: ln, handler: handler, log: log, auth: auth,
		addrs: map[uint32]string{}, out: map[uint32]*peerOut{}, in: map[net.Conn]struct{}{}, done: make(chan struct{})}
	t.faults.Store(&Faults{})
	t.wg.Add(1)
	go t.accept()
	return t, nil
}

// Addr is the address the transport listens on.
func (t *Transport) Addr() string { return t.ln.Addr().String() }

// SetFaults replaces the injected faults.
func (t *Transport) SetFaults(f Faults) { t.faults.Store(&f) }

// SetPeerLost sets f to be told, on a goroutine of the transport, the id
// of each peer whose inbound group connection ends other than by Close: a
// peer killed drops it at once, long before any timeout notices. f must
// not block.
func (t *Transport) SetPeerLost(f func(id uint32)) { t.peerLost.Store(&f) }

// SetPeer records where broker id listens.
func (t *Transport) SetPeer(id uint32, addr string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.addrs[id] = addr
}

// Send queues m for its destination broker. It never blocks.
func (t *Transport) Send(m *wire.GroupMessage) {
	f := t.faults.Load()
	if f.CutOut[m.To] || (f.Drop > 0 && rand.Float64() < f.Drop) {
		t.Dropped.Add(1)
		return
	}
	p := t.peer(m.To)
	if p == nil {
		t.Dropped.Add(1)
		return
	}
	bb := framePool.Get()
	bb.B = wire.AppendGroupMessage(bb.B[:0], m)
	frame := bb.B
	if p.bytes.Load()+int64(len(frame)) > peerQueueBytes {
		framePool.Put(bb)
		t.Dropped.Add(1)
		return
	}
	p.bytes.Add(int64(len(frame)))
	p.queued.Add(int64(cap(frame))) // what it holds in memory
	select {
	case p.queue <- bb:
	default:
		p.bytes.Add(-int64(len(frame)))
		p.queued.Add(-int64(cap(frame)))
		framePool.Put(bb)
		t.Dropped.Add(1)
	}
}

func (t *Transport) peer(id uint32) *peerOut {
	t.mu.Lock()
	defer t.mu.Unlock()
	select {
	case <-t.done:
		return nil
	default:
	}
	if p := t.out[id]; p != nil {
		return p
	}
	if _, ok := t.addrs[id]; !ok {
		return nil
	}
	p := &peerOut{id: id, queue: make(chan *bytebufferpool.ByteBuffer, peerQueueMax), queued: &t.queued}
	t.out[id] = p
	t.wg.Add(1)
	go t.write(p)
	return p
}

// write dials the peer and writes its queue, redialling after failures.
func (t *Transport) write(p *peerOut) {
	defer t.wg.Done()
	backoff := 10 * time.Millisecond
	for {
		t.mu.Lock()
		addr := t.addrs[p.id]
		t.mu.Unlock()
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			select {
			case <-t.done:
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, dialBackoffMax)
			continue
		}
		raw := conn
		if conn, err = t.auth.Client(raw, addr); err != nil {
			raw.Close()
			if t.auth.AllowLog(true) {
				t.log.Warn("groups: peer refused or failed the cluster handshake", "peer", p.id, "addr", addr, "err", err)
			}
			select {
			case <-t.done:
				return
			case <-time.After(dialBackoffMax):
			}
			continue
		}
		backoff = 10 * time.Millisecond
		if err := t.writeConn(conn, p); err != nil && !errors.Is(err, net.ErrClosed) {
			t.log.Debug("groups: peer connection ended", "peer", p.id, "err", err)
		}
		conn.Close()
		select {
		case <-t.done:
			return
		default:
		}
	}
}

func (t *Transport) writeConn(conn net.Conn, p *peerOut) error {
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		select {
		case <-t.done:
			conn.Close()
		case <-stop:
		}
	}()
	w := bufio.NewWriterSize(conn, 64<<10)
	if _, err := w.Write(wire.AppendGroupHello(nil, t.self, wire.Current)); err != nil {
		return err
	}
	// write copies a frame into w and gives its buffer back.
	write := func(frame *bytebufferpool.ByteBuffer) error {
		_, err := w.Write(frame.B)
		framePool.Put(frame)
		return err
	}
	for {
		var frame *bytebufferpool.ByteBuffer
		select {
		case frame = <-p.queue:
			p.take(frame)
		case <-t.done:
			return w.Flush()
		}
		if d := t.faults.Load().Delay; d > 0 {
			time.Sleep(d)
		}
		if err := write(frame); err != nil {
			return err
		}
		// Batch what is queued already into one write.
		for n := len(p.queue); n > 0; n-- {
			if err := write(p.take(<-p.queue)); err != nil {
				return err
			}
		}
		if err := w.Flush(); err != nil {
			return err
		}
	}
}

func (t *Transport) accept() {
	defer t.wg.Done()
	for {
		conn, err := t.ln.Accept()
		if err != nil {
			return
		}
		t.mu.Lock()
		select {
		case <-t.done:
			t.mu.Unlock()
			conn.Close()
			return
		default:
		}
		t.in[conn] = struct{}{}
		t.wg.Add(1)
		t.mu.Unlock()
		go t.read(conn)
	}
}

// read decodes the frames of one inbound connection, once it proved
// cluster membership. A malformed frame ends the connection (the peer
// redials); it never reaches the handler.
func (t *Transport) read(raw net.Conn) {
	defer t.wg.Done()
	defer func() {
		t.mu.Lock()
		delete(t.in, raw)
		t.mu.Unlock()
		raw.Close()
	}()
	conn, err := t.auth.Server(raw)
	if err != nil {
		if t.auth.AllowLog(false) {
			t.log.Warn("groups: refused a peer connection before any frame (logged at most once a second)", "remote", raw.RemoteAddr().String(), "err", err)
		}
		return
	}
	r := bufio.NewReaderSize(conn, 64<<10)
	var hdr [wire.HeaderSize]byte
	var body, scratch []byte
	from := uint32(0)
	defer func() {
		if from == 0 {
			return
		}
		select {
		case <-t.done:
			return
		default:
		}
		if f := t.peerLost.Load(); f != nil {
			(*f)(from)
		}
	}()
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return
		}
		h, err := wire.ReadHeader(hdr[:], wire.FrameSizeMax)
		if err != nil {
			t.log.Warn("groups: bad frame from peer", "peer", from, "remote", conn.RemoteAddr().String(), "err", err)
			return
		}
		// The entries of an append that has some alias its body, which is
		// its own (their data were copied out of a reused buffer before);
		// every other frame is decoded from one reused buffer.
		owned := false
		if h.Type == wire.TypeGroupMessage && h.Length > wire.GroupAppendHeadSize {
			if p, err := r.Peek(wire.GroupKindPrefix); err == nil {
				owned = wire.GroupMessageKindOf(p) == wire.GroupAppend
			}
		}
		if owned {
			body = make([]byte, h.Length)
		} else {
			if cap(scratch) < int(h.Length) {
				scratch = make([]byte, h.Length)
			}
			body = scratch[:h.Length]
		}
		if _, err := io.ReadFull(r, body); err != nil {
			return
		}
		switch {
		case from == 0 && h.Type == wire.TypeGroupHello:
			id, _, err := wire.DecodeGroupHello(body)
			if err != nil || id == 0 {
				t.log.Warn("groups: bad hello from peer", "remote", conn.RemoteAddr().String())
				return
			}
			from = id
		case from == 0 && h.Type == wire.TypeForwardHello:
			id, version, err := wire.DecodeForwardHello(body)
			if err != nil || id == 0 {
				t.log.Warn("groups: bad forwarding hello from peer", "remote", conn.RemoteAddr().String())
				return
			}
			t.serveForwards(conn, r, id, version)
			return
		case from != 0 && h.Type == wire.TypeGroupMessage:
			var m wire.GroupMessage
			decode := wire.DecodeGroupMessage
			if owned {
				decode = wire.DecodeGroupMessageOwned
			}
			if err := decode(body, &m); err != nil || m.From != from || m.To != t.self {
				t.log.Warn("groups: bad message from peer", "peer", from, "err", err)
				return
			}
			if t.faults.Load().CutIn[from] {
				t.Dropped.Add(1)
				continue
			}
			t.handler(&m)
		default:
			t.log.Warn("groups: unexpected frame from peer", "peer", from, "type", h.Type)
			return
		}
	}
}

// Close stops the transport and waits for its goroutines.
func (t *Transport) Close() {
	t.mu.Lock()
	select {
	case <-t.done:
		t.mu.Unlock()
		return
	default:
	}
	close(t.done)
	t.ln.Close()
	for c := range t.in {
		c.Close()
	}
	t.mu.Unlock()
	t.wg.Wait()
}
