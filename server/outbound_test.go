package server_test

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/internal/testutil"
	"github.com/berthmq/berth/server"
	"github.com/berthmq/berth/wire"
)

// TestOutboundCap: a consumer that takes all the credit it can and never
// reads its socket, on the plaintext and on the TLS listener, beside a
// consumer of the same queue that reads. Past Config.OutboundMax the
// broker stops delivering to the first, so the second gets nearly all
// the messages (without the cap each gets half), and once the first has
// been over the cap for Config.OutboundTimeout its connection is closed.
// The in-process form of the hostile suite's case, for the TLS writer's
// queue, which that suite does not reach.
func TestOutboundCap(t *testing.T) {
	certs := testutil.NewCerts(t, "app")
	for _, useTLS := range []bool{false, true} {
		name := "plaintext"
		if useTLS {
			name = "tls"
		}
		t.Run(name, func(t *testing.T) {
			s := startTLSServer(t, certs, false, func(c *server.Config) {
				c.OutboundMax = 256 << 10
				c.OutboundTimeout = 500 * time.Millisecond
				c.AdminAddr = "127.0.0.1:0"
			})
			ctx := ctxT(t)
			pub := dial(t, s)
			if err := pub.DeclareQueue(ctx, "q", client.QueueOptions{}); err != nil {
				t.Fatal(err)
			}
			d := net.Dialer{Timeout: 5 * time.Second, Control: func(_, _ string, rc syscall.RawConn) error {
				return rc.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 32<<10) })
			}}
			var nc net.Conn
			var err error
			if useTLS {
				nc, err = tls.DialWithDialer(&d, "tcp", s.TLSAddr(), certs.ClientTLS(false))
			} else {
				nc, err = d.Dial("tcp", s.ClientAddr())
			}
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			br := bufio.NewReader(nc)
			writeFrame := func(b []byte) error {
				_ = nc.SetWriteDeadline(time.Now().Add(time.Second))
				_, err := nc.Write(b)
				return err
			}
			readFrame := func() (wire.Header, error) {
				_ = nc.SetReadDeadline(time.Now().Add(5 * time.Second))
				hb, err := br.Peek(wire.HeaderSize)
				if err != nil {
					return wire.Header{}, err
				}
				h, err := wire.ReadHeader(hb, wire.FrameSizeMax)
				if err != nil {
					return h, err
				}
				_, err = br.Discard(wire.HeaderSize + int(h.Length))
				return h, err
			}
			if err := writeFrame(wire.AppendHello(nil, []wire.Version{wire.Current}, "slow", "none", nil, 0, 0)); err != nil {
				t.Fatal(err)
			}
			if h, err := readFrame(); err != nil || h.Type != wire.TypeWelcome {
				t.Fatalf("HELLO: %v %v", h.Type, err)
			}
			if err := writeFrame(wire.AppendSubscribe(nil, wire.Current, &wire.Subscribe{CommandID: 1, ConsumerID: 1, Queue: []byte("q"),
				Credit: 65535, AckMode: wire.AckNone})); err != nil {
				t.Fatal(err)
			}
			if h, err := readFrame(); err != nil || h.Type != wire.TypeComplete {
				t.Fatalf("SUBSCRIBE: %v %v", h.Type, err)
			}
			stop := make(chan struct{})
			var wg sync.WaitGroup
			wg.Add(1)
			go func() { // credit without end, never a read
				defer wg.Done()
				frame := wire.AppendCredit(nil, wire.Current, 1, 65535)
				for {
					select {
					case <-stop:
						return
					case <-time.After(10 * time.Millisecond):
					}
					if err := writeFrame(frame); err != nil && !errors.Is(err, net.ErrClosed) && !errors.Is(err, syscall.EPIPE) &&
						!errors.Is(err, syscall.ECONNRESET) {
						continue
					}
				}
			}()
			defer func() { close(stop); wg.Wait() }()

			good := dial(t, s)
			sub, err := good.Subscribe(ctx, "q", client.SubscribeOptions{Credit: 1000, AutoCredit: true, AckMode: client.AckNone})
			if err != nil {
				t.Fatal(err)
			}
			var got atomic.Int64
			go func() {
				for {
					if _, err := sub.Next(ctx); err != nil {
						return
					}
					got.Add(1)
				}
			}()
			// The non-reading consumer may be handed the cap, what the
			// broker's socket buffer takes (up to tcp_wmem's maximum) and
			// its own 32 KiB; without the cap it gets half of n, so n is
			// made well over twice that.
			bound := 256<<10 + testutil.TCPSendBufferMax() + 1<<20
			n := int(2*bound/1024) + 4000
			payload := make([]byte, 1024)
			for i := 0; i < n; i++ {
				if err := pub.PublishAsync(ctx, "", "q", payload, client.PublishOptions{}, nil); err != nil {
					t.Fatal(err)
				}
			}
			if err := pub.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
				prev := got.Load()
				time.Sleep(100 * time.Millisecond)
				if prev == got.Load() && prev > int64(n/2) {
					break
				}
			}
			toSlow := n - int(got.Load())
			t.Logf("%s: the consumer that does not read was handed %d of %d messages of 1 KiB", name, toSlow, n)
			if toSlow*1024 > bound {
				t.Fatalf("the consumer that does not read was handed %d of %d messages", toSlow, n)
			}
			// Over the cap for half a second: closed (reading before then would
			// drain it and resume it). Reading drains what the kernel
			// holds, then ends.
			checkFor(t, 10*time.Second, func() error {
				if v := scrape(t, s.AdminAddr())["berth_outbound_timeouts_total"]; v < 1 {
					return fmt.Errorf("berth_outbound_timeouts_total %v", v)
				}
				return nil
			})
			_ = nc.SetReadDeadline(time.Now().Add(10 * time.Second))
			if _, err := io.Copy(io.Discard, nc); err != nil && !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("the connection that did not read was not closed: %v", err)
			}
		})
	}
}
