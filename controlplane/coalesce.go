package controlplane

import (
	"fmt"
	"net"
	"runtime"
	"sync"
	"time"
)

// coalescer batches frames written to one connection by many goroutines
// into few writes. Whoever appends while nobody is writing becomes the
// writer and writes everything queued, including frames appended while it
// writes; the others return at once. Under load this turns one syscall per
// frame into one per burst, with no extra goroutine and no timer.
type coalescer struct {
	c        net.Conn
	mu       sync.Mutex
	pending  []byte // frames not yet written; guarded by mu
	spare    []byte // the buffer last written, reused; guarded by mu
	writing  bool   // a writer is active; guarded by mu
	err      error  // first write error; guarded by mu
	onFailed func(error)
}

// coalesceBufMax caps the spare buffer kept between bursts.
const coalesceBufMax = 1 << 20

// write queues frame (appended by fill) and writes it, alone or with others.
// An error wrapping errNotSent means the frame was never queued.
func (w *coalescer) write(fill func([]byte) []byte) error {
	w.mu.Lock()
	if w.err != nil {
		err := w.err
		w.mu.Unlock()
		return fmt.Errorf("%w: %v", errNotSent, err)
	}
	w.pending = fill(w.pending)
	if w.writing {
		w.mu.Unlock()
		return nil
	}
	w.writing = true
	w.mu.Unlock()
	// Let goroutines that are about to write run first, so that their
	// frames join this write instead of each costing a syscall.
	runtime.Gosched()
	w.mu.Lock()
	for {
		buf := w.pending
		if len(buf) == 0 {
			w.writing = false
			w.mu.Unlock()
			return nil
		}
		w.pending = w.spare[:0]
		w.mu.Unlock()
		w.c.SetWriteDeadline(time.Now().Add(writeTimeout))
		_, err := w.c.Write(buf)
		w.mu.Lock()
		if cap(buf) <= coalesceBufMax {
			w.spare = buf[:0]
		} else {
			w.spare = nil
		}
		if err != nil {
			w.err = err
			w.writing = false
			w.pending = nil
			w.mu.Unlock()
			if w.onFailed != nil {
				w.onFailed(err)
			}
			return err
		}
	}
}
