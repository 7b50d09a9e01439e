package controlplane

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/berthmq/berth/internal/peerauth"
	"github.com/berthmq/berth/wire"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

const (
	// sendQueueMax bounds the raft messages waiting for one peer. Raft
	// retransmits, so a message dropped at this bound only costs time.
	sendQueueMax = 4096
	// peerFrameMax bounds a frame between controllers.
	peerFrameMax = wire.FrameSizeMax
	// raftMessageMax bounds one raft message, a snapshot at most: the
	// decompressed state is bounded by snapshotBytesMax and compresses.
	raftMessageMax = snapshotBytesMax + 1<<20
	dialTimeout    = time.Second
	redialDelay    = 50 * time.Millisecond
	writeTimeout   = 5 * time.Second
)

// Faults cuts links between controllers in tests. A nil *Faults cuts nothing.
// Only raft traffic is cut; client requests still reach a cut controller,
// which is how a stale leader would meet clients in a real partition.
type Faults struct {
	mu        sync.Mutex
	cut       map[[2]uint64]bool
	noAppends map[uint64]bool
}

// NewFaults returns a fault injector with every link up.
func NewFaults() *Faults { return &Faults{cut: map[[2]uint64]bool{}, noAppends: map[uint64]bool{}} }

// BlockAppends drops log appends and snapshots sent to id while letting
// heartbeats and ReadIndex traffic through, so id falls behind while still
// following the leader: the case a follower read's lag check is for.
func (f *Faults) BlockAppends(id uint64, on bool) {
	f.mu.Lock()
	f.noAppends[id] = on
	f.mu.Unlock()
}

// Cut drops raft messages both ways between a and b.
func (f *Faults) Cut(a, b uint64) {
	f.mu.Lock()
	f.cut[[2]uint64{a, b}], f.cut[[2]uint64{b, a}] = true, true
	f.mu.Unlock()
}

// Isolate cuts id from every controller in peers.
func (f *Faults) Isolate(id uint64, peers []uint64) {
	for _, p := range peers {
		if p != id {
			f.Cut(id, p)
		}
	}
}

// Heal restores every link.
func (f *Faults) Heal() {
	f.mu.Lock()
	clear(f.cut)
	clear(f.noAppends)
	f.mu.Unlock()
}

func (f *Faults) blocked(from, to uint64, typ pb.MessageType) bool {
	if f == nil {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.noAppends[to] && (typ == pb.MsgApp || typ == pb.MsgSnap) {
		return true
	}
	return f.cut[[2]uint64{from, to}]
}

// report is sent back to the raft goroutine about a peer.
type report struct {
	to          uint64
	unreachable bool
	snapshot    bool
	snapFailed  bool
}

// transport sends raft messages to peers, one goroutine and one TCP
// connection per peer. Receiving happens in the node's listener.
type transport struct {
	self    uint64
	addr    string // this member's own address, announced in each connection's hello
	auth    *peerauth.Auth
	faults  *Faults
	logger  *slog.Logger
	reports chan report // read by the raft goroutine
	mu      sync.RWMutex
	peers   map[uint64]*peer // guarded by mu; membership changes edit it
	stop    chan struct{}
	wg      sync.WaitGroup
}

type peer struct {
	id   uint64
	addr string
	q    chan *pb.Message
	gone chan struct{} // closed when the peer leaves the membership
}

func newTransport(self uint64, addrs map[uint64]string, auth *peerauth.Auth, faults *Faults, logger *slog.Logger) *transport {
	t := &transport{self: self, addr: addrs[self], auth: auth, faults: faults, logger: logger, peers: map[uint64]*peer{},
		reports: make(chan report, sendQueueMax), stop: make(chan struct{})}
	for id, a := range addrs {
		t.addPeer(id, a)
	}
	return t
}

// learnPeer adds id at addr unless its address is known already: a hello
// never moves a known member (the configuration's address book does).
func (t *transport) learnPeer(id uint64, addr string) bool {
	t.mu.RLock()
	known := t.peers[id] != nil
	t.mu.RUnlock()
	if known || id == t.self || id == 0 || addr == "" {
		return false
	}
	t.addPeer(id, addr)
	return true
}

// addPeer starts sending to id at addr; an existing peer at another
// address is replaced.
func (t *transport) addPeer(id uint64, addr string) {
	if id == t.self {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if old := t.peers[id]; old != nil {
		if old.addr == addr {
			return
		}
		close(old.gone)
	}
	p := &peer{id: id, addr: addr, q: make(chan *pb.Message, sendQueueMax), gone: make(chan struct{})}
	t.peers[id] = p
	t.wg.Add(1)
	go t.run(p)
}

func (t *transport) removePeer(id uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if p := t.peers[id]; p != nil {
		close(p.gone)
		delete(t.peers, id)
	}
}

func (t *transport) report(r report) {
	select {
	case t.reports <- r:
	default: // raft recovers from a lost report by its own probing
	}
}

// send queues m for its peer. It never blocks: the raft goroutine calls it.
func (t *transport) send(m *pb.Message) {
	t.mu.RLock()
	p := t.peers[m.GetTo()]
	t.mu.RUnlock()
	if p == nil {
		return
	}
	select {
	case p.q <- m:
	default:
		t.report(report{to: p.id, unreachable: true})
		if m.GetType() == pb.MsgSnap {
			t.report(report{to: p.id, snapshot: true, snapFailed: true})
		}
	}
}

func (t *transport) close() {
	close(t.stop)
	t.wg.Wait()
}

func (t *transport) run(p *peer) {
	defer t.wg.Done()
	var conn net.Conn
	var w *bufio.Writer
	var buf []byte
	defer func() {
		if conn != nil {
			conn.Close()
		}
	}()
	for {
		var m *pb.Message
		select {
		case <-t.stop:
			return
		case <-p.gone:
			return
		case m = <-p.q:
		}
		for m != nil {
			isSnap := m.GetType() == pb.MsgSnap
			if t.faults.blocked(t.self, p.id, m.GetType()) {
				if isSnap {
					t.report(report{to: p.id, snapshot: true, snapFailed: true})
				}
			} else {
				if conn == nil {
					c, err := net.DialTimeout("tcp", p.addr, dialTimeout)
					if err == nil {
						raw := c
						if c, err = t.auth.Client(raw, p.addr); err != nil {
							raw.Close()
							if t.auth.AllowLog(true) {
								t.logger.Warn("controlplane: peer refused or failed the cluster handshake", "peer", p.id, "addr", p.addr, "err", err)
							}
						}
					}
					if err != nil {
						t.report(report{to: p.id, unreachable: true})
						if isSnap {
							t.report(report{to: p.id, snapshot: true, snapFailed: true})
						}
						drain(p.q)
						select {
						case <-t.stop:
							return
						case <-time.After(redialDelay):
						}
						break
					}
					conn, w = c, bufio.NewWriterSize(c, 64<<10)
					// Tell the peer who we are and where we listen, in case
					// it does not know (a member joining with a partial list).
					_, _ = w.Write(wire.AppendRaftHello(nil, t.self, t.addr))
				}
				raw, err := proto.MarshalOptions{}.MarshalAppend(buf[:0], m)
				if err == nil && len(raw) > raftMessageMax {
					t.logger.Error("controlplane: raft message too large", "to", p.id, "bytes", len(raw))
					err = io.ErrShortBuffer
				}
				if err == nil {
					buf = raw
					if len(raw) <= snapChunkBytes {
						var hdr [wire.HeaderSize]byte
						wire.PutHeader(hdr[:], wire.Header{Version: wire.Current, Type: wire.TypeRaftMessage, Length: uint32(len(raw))})
						conn.SetWriteDeadline(time.Now().Add(writeTimeout))
						if _, err = w.Write(hdr[:]); err == nil {
							_, err = w.Write(raw)
						}
					} else {
						err = writeChunks(conn, w, raw)
					}
					if err == nil && (len(p.q) == 0 || isSnap) {
						err = w.Flush()
					}
				}
				if err != nil {
					conn.Close()
					conn, w = nil, nil
					t.report(report{to: p.id, unreachable: true})
				}
				if isSnap {
					t.report(report{to: p.id, snapshot: true, snapFailed: err != nil})
				}
			}
			select {
			case m = <-p.q:
			default:
				m = nil
			}
		}
		if buf != nil && cap(buf) > 1<<20 {
			buf = nil // do not pin a snapshot-sized buffer
		}
	}
}

// snapChunkBytes is the largest raft message sent in one frame; a bigger
// one (a snapshot) goes in chunks of this size. A variable for tests.
var snapChunkBytes = 4 << 20

// writeChunks writes raw as TypeRaftChunk frames, each under its own write
// deadline, so a large snapshot is bounded per chunk rather than as a whole.
func writeChunks(conn net.Conn, w *bufio.Writer, raw []byte) error {
	var prefix [wire.HeaderSize + 16]byte
	for off := 0; off < len(raw); off += snapChunkBytes {
		part := raw[off:min(off+snapChunkBytes, len(raw))]
		hdr := wire.AppendRaftChunkHeader(prefix[:0], uint64(len(raw)), uint64(off), len(part))
		conn.SetWriteDeadline(time.Now().Add(writeTimeout))
		if _, err := w.Write(hdr); err != nil {
			return err
		}
		if _, err := w.Write(part); err != nil {
			return err
		}
	}
	return nil
}

// chunkAssembler rebuilds a raft message sent in TypeRaftChunk frames on
// one connection.
type chunkAssembler struct {
	buf   []byte // grows with the chunks received, not with the claimed total
	total uint64
}

// add takes one chunk; it returns the whole message once the last chunk is
// in, or an error if the chunk does not continue the message in progress.
func (a *chunkAssembler) add(body []byte) ([]byte, error) {
	total, off, part, err := wire.DecodeRaftChunk(body)
	if err != nil {
		return nil, err
	}
	if total > raftMessageMax {
		return nil, fmt.Errorf("controlplane: chunked raft message of %d bytes exceeds %d", total, raftMessageMax)
	}
	if off == 0 {
		a.buf, a.total = a.buf[:0], total
	} else if a.total != total || uint64(len(a.buf)) != off {
		return nil, fmt.Errorf("controlplane: raft chunk at %d of %d does not continue the message in progress", off, total)
	}
	a.buf = append(a.buf, part...)
	if uint64(len(a.buf)) < total {
		return nil, nil
	}
	msg := a.buf
	a.buf, a.total = nil, 0
	return msg, nil
}

func drain(q chan *pb.Message) {
	for {
		select {
		case <-q:
		default:
			return
		}
	}
}
