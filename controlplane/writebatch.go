package controlplane

import (
	"context"
	"errors"
	"sync"

	"github.com/berthmq/berth/controlplane/ctlapi"
	"github.com/berthmq/berth/wire"
)

// Write events that arrive on one connection are proposed together, the
// way reads are (readbatch.go): the connection's reader collects the
// proposals that arrive while whole frames are buffered, then one goroutine
// queues all of them under one lock, waits for the group and writes every
// reply in one write. Each event keeps its own result; they usually share
// one log entry. A write costs a decode and an encode instead of a
// goroutine, a timer, a channel and a write of its own, and the raft
// goroutine packs more events into each entry.

// connWriteBatchMax bounds the writes proposed together and answered by one
// write.
const connWriteBatchMax = 256

// batchedWrite is one write waiting in a connection's batch.
type batchedWrite struct {
	id   uint64
	data []byte // the event, encoded; nil if err is set
	err  error  // the request was malformed; answered without a proposal
}

// writeBatcher collects one connection's writes; its reader goroutine owns
// it.
type writeBatcher struct {
	n      *Node
	sc     *serverConn
	sem    chan struct{} // the connection's inflight slots, one per write held
	wg     *sync.WaitGroup
	writes []batchedWrite
}

// add decodes and queues a propose request whose inflight slot the caller
// holds.
func (wb *writeBatcher) add(id uint64, body []byte) {
	w := batchedWrite{id: id}
	if ev, err := ctlapi.DecodeEvent(body); err != nil {
		w.err = err
	} else if err := ctlapi.ValidateEvent(ev); err != nil {
		w.err = err
	} else {
		w.data = ctlapi.EncodeEvent(nil, ev)
	}
	wb.writes = append(wb.writes, w)
	if len(wb.writes) >= connWriteBatchMax {
		wb.flush()
	}
}

// flush starts proposing every queued write. The reader calls it before it
// may block, so no write waits on the arrival of another.
func (wb *writeBatcher) flush() {
	writes := wb.writes
	if len(writes) == 0 {
		return
	}
	wb.writes = nil
	wb.wg.Add(1)
	go func() {
		defer wb.wg.Done()
		wb.n.serveWrites(wb.sc, writes)
		for range writes {
			<-wb.sem
		}
	}()
}

// serveWrites proposes writes as one group and writes all replies to sc at
// once.
func (n *Node) serveWrites(sc *serverConn, writes []batchedWrite) {
	datas := make([][]byte, 0, len(writes))
	for _, w := range writes {
		if w.err == nil {
			datas = append(datas, w.data)
		}
	}
	var results []proposeResult
	var err error
	if len(datas) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
		results, err = n.proposeMany(ctx, datas)
		cancel()
	}
	bp := replyPool.Get().(*[]byte)
	out := (*bp)[:0]
	var body []byte // reused for each result; copied into out
	k := 0
	for _, w := range writes {
		resp := wire.CtlResponse{ID: w.id}
		switch {
		case w.err != nil:
			resp.Status, resp.Body = ctlapi.StatusBadRequest, []byte(w.err.Error())
		default:
			werr := err
			if werr == nil {
				werr = results[k].err
			}
			k++
			if werr != nil {
				resp.Status, resp.Leader, resp.Body = proposeErrorStatus(werr)
				break
			}
			body = ctlapi.AppendResult(body[:0], results[k-1].res)
			resp.Body = body
		}
		out = wire.AppendCtlResponse(out, resp)
	}
	sc.writeReplies(bp, out)
}

// proposeErrorStatus maps a failed write's error to its reply. A write
// interrupted by a stopping node may have entered the log: a client that
// retried it elsewhere could apply it twice (a porcupine run caught a put
// applied again after later puts), so it is ambiguous.
func proposeErrorStatus(err error) (uint8, string, []byte) {
	if errors.Is(err, ctlapi.ErrStopped) {
		return ctlapi.StatusAmbiguous, "", []byte(err.Error())
	}
	return errorStatus(err)
}
