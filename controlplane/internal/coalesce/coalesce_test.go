package coalesce

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestSendKeepsEachSendersOrder: frames from many goroutines all arrive,
// whole, and each goroutine's in the order it sent them.
func TestSendKeepsEachSendersOrder(t *testing.T) {
	const senders, frames = 8, 500
	client, server := net.Pipe()
	defer client.Close()
	defer server.Close()
	w := New(client, func(err error) { t.Errorf("write failed: %v", err) })
	server.SetReadDeadline(time.Now().Add(10 * time.Second)) // a lost frame fails, not hangs
	got := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(io.LimitReader(server, senders*frames*5))
		got <- b
	}()
	var wg sync.WaitGroup
	for s := 0; s < senders; s++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < frames; i++ {
				err := w.Send(func(b []byte) []byte { return binary.BigEndian.AppendUint32(append(b, byte(s)), uint32(i)) })
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b := <-got
	if len(b) != senders*frames*5 {
		t.Fatalf("read %d bytes, want %d", len(b), senders*frames*5)
	}
	var next [senders]uint32
	for ; len(b) > 0; b = b[5:] {
		s, i := b[0], binary.BigEndian.Uint32(b[1:])
		if int(s) >= senders || i != next[s] {
			t.Fatalf("sender %d: frame %d arrived when %d was due", s, i, next[s])
		}
		next[s]++
	}
}

// TestSendAfterFailure: a failed write is reported once to onFailed and to
// its sender; later frames are refused as never sent.
func TestSendAfterFailure(t *testing.T) {
	client, server := net.Pipe()
	server.Close()
	var failed atomic.Int32
	w := New(client, func(error) { failed.Add(1) })
	if err := w.Send(func(b []byte) []byte { return append(b, 1) }); err == nil || errors.Is(err, ErrNotSent) {
		t.Fatalf("write to a closed pipe: %v, want the write's error", err)
	}
	for i := 0; i < 3; i++ {
		if err := w.Send(func(b []byte) []byte { return append(b, 2) }); !errors.Is(err, ErrNotSent) {
			t.Fatalf("send after the failure: %v, want ErrNotSent", err)
		}
	}
	if n := failed.Load(); n != 1 {
		t.Fatalf("onFailed called %d times, want 1", n)
	}
}
