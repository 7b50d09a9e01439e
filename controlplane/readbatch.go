package controlplane

import (
	"context"
	"sync"

	"github.com/berthmq/berth/controlplane/ctlapi"
	"github.com/berthmq/berth/wire"
)

// Consistent and follower reads that arrive on one connection are served
// together: the connection's reader collects them while whole frames are
// buffered, then one goroutine takes a single ReadIndex for all of them,
// answers each from the state and writes every reply in one coalesced
// write. While that ReadIndex request still waits for the raft goroutine
// (behind the rounds in flight), later bursts join it instead of starting
// their own. A read costs a parse and an encode instead of a goroutine, a
// timer, a ReadIndex request and a write of its own.
//
// Linearizability holds per read: a read joins a request only while it is
// unsealed, and the raft goroutine seals it before it takes the request's
// index, so the index covers every write committed before any read of the
// batch began.

const (
	// connReadBatchMax bounds the reads sharing one ReadIndex and one write.
	connReadBatchMax = 256
	// replyBufMax caps a reply buffer kept for reuse.
	replyBufMax = 256 << 10
)

// batchedRead is one read waiting in a connection's batch.
type batchedRead struct {
	id  uint64
	q   readQuery
	err error // set if the request was malformed; answered without a read
}

// readBatcher collects one connection's reads; its reader goroutine owns it.
type readBatcher struct {
	n     *Node
	sc    *serverConn
	sem   chan struct{} // the connection's inflight slots, one per read held
	wg    *sync.WaitGroup
	reads [2][]batchedRead // by mode: consistent, follower
	open  [2]*connReads    // by mode: the last batch started, maybe still open to joiners
}

// connReads is a batch of one connection's reads sharing a ReadIndex.
type connReads struct {
	seal  readSeal
	reads []batchedRead // guarded by seal.mu until sealed; then the server's
}

func readBatchSlot(follower bool) int {
	if follower {
		return 1
	}
	return 0
}

// add queues a read whose inflight slot the caller holds.
func (rb *readBatcher) add(r batchedRead) {
	i := readBatchSlot(r.q.mode == ctlapi.ReadFollower)
	rb.reads[i] = append(rb.reads[i], r)
	if len(rb.reads[i]) >= connReadBatchMax {
		rb.flushSlot(i)
	}
}

// flush starts serving every queued read. The reader calls it before it
// may block, so no read waits on the arrival of another.
func (rb *readBatcher) flush() {
	for i := range rb.reads {
		rb.flushSlot(i)
	}
}

func (rb *readBatcher) flushSlot(i int) {
	reads := rb.reads[i]
	if len(reads) == 0 {
		return
	}
	if o := rb.open[i]; o != nil {
		o.seal.mu.Lock()
		if !o.seal.sealed && len(o.reads)+len(reads) <= connReadBatchMax {
			o.reads = append(o.reads, reads...)
			o.seal.mu.Unlock()
			rb.reads[i] = reads[:0]
			return
		}
		o.seal.mu.Unlock()
	}
	rb.reads[i] = nil
	cr := &connReads{reads: reads}
	rb.open[i] = cr
	rb.wg.Add(1)
	go func() {
		defer rb.wg.Done()
		served := rb.n.serveReads(rb.sc, i == 1, cr)
		for range served {
			<-rb.sem
		}
	}()
}

// replyPool holds the buffers batched replies are encoded into.
var replyPool = sync.Pool{New: func() any { b := make([]byte, 0, 4096); return &b }}

// writeReplies writes a batch of encoded replies to sc at once and returns
// its buffer (bp, now holding out) to the pool. A failed write closes the
// connection (onFailed); the reader then stops and the client retries
// elsewhere.
func (sc *serverConn) writeReplies(bp *[]byte, out []byte) {
	sc.w.Send(func(b []byte) []byte { return append(b, out...) })
	if cap(out) <= replyBufMax {
		*bp = out[:0]
		replyPool.Put(bp)
	}
}

// serveReads answers reads that share one ReadIndex, writes the replies to
// sc at once and returns the reads it served.
func (n *Node) serveReads(sc *serverConn, follower bool, cr *connReads) []batchedRead {
	var err error
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	_, err = n.readIndex(ctx, follower, &cr.seal)
	cancel()
	// Close the batch to joiners whatever happened: on success the raft
	// goroutine has sealed it already; on failure the joiners share the
	// error and their clients retry.
	cr.seal.mu.Lock()
	cr.seal.sealed = true
	reads := cr.reads
	cr.seal.mu.Unlock()
	bp := replyPool.Get().(*[]byte)
	out := (*bp)[:0]
	var body []byte // reused for each answer; copied into out
	for _, r := range reads {
		resp := wire.CtlResponse{ID: r.id}
		switch {
		case r.err != nil:
			resp.Status, resp.Body = ctlapi.StatusBadRequest, []byte(r.err.Error())
		case err != nil:
			resp.Status, resp.Leader, resp.Body = errorStatus(err)
		default:
			n.mu.RLock()
			body = r.q.appendAnswer(body[:0], n.state)
			n.mu.RUnlock()
			resp.Body = body
		}
		out = wire.AppendCtlResponse(out, resp)
	}
	sc.writeReplies(bp, out)
	return reads
}
