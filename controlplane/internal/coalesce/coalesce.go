// Package coalesce batches the frames many goroutines write to one
// connection into few writes. The controller's service and its client both
// write this way.
package coalesce

import (
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync"
	"time"
)

// ErrNotSent marks a frame, or a request, that never left this process, so
// retrying it cannot apply it twice.
var ErrNotSent = errors.New("controlplane: request not sent")

const (
	// bufMax caps the spare buffer kept between bursts.
	bufMax = 1 << 20
	// writeTimeout bounds one write to the connection.
	writeTimeout = 5 * time.Second
)

// Writer batches frames written to one connection by many goroutines into
// few writes. Whoever appends while nobody is writing becomes the writer and
// writes everything queued, including frames appended while it writes; the
// others return at once. Under load this turns one syscall per frame into
// one per burst, with no extra goroutine and no timer. Safe for concurrent
// use.
type Writer struct {
	c        net.Conn
	mu       sync.Mutex
	pending  []byte // frames not yet written; guarded by mu
	spare    []byte // the buffer last written, reused; guarded by mu
	writing  bool   // a writer is active; guarded by mu
	err      error  // first write error; guarded by mu
	onFailed func(error)
}

// New returns a writer to c. onFailed, if set, is called once, with the
// error, when a write fails; every later Send then fails with ErrNotSent.
func New(c net.Conn, onFailed func(error)) *Writer {
	return &Writer{c: c, onFailed: onFailed}
}

// Send queues the frames fill appends to its argument and writes them,
// alone or with others. An error wrapping ErrNotSent means they were never
// queued.
func (w *Writer) Send(fill func([]byte) []byte) error {
	w.mu.Lock()
	if w.err != nil {
		err := w.err
		w.mu.Unlock()
		return fmt.Errorf("%w: %v", ErrNotSent, err)
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
		if cap(buf) <= bufMax {
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
