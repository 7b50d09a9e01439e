package memtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/internal/testutil"
)

// TestParkedPublisherStillConsumes: one connection publishes to a queue
// until its shard is over the memory budget (the broker then stops taking
// its publishes), and only then gives its consumer of that queue credit.
// The credit sits behind the parked publishes on the wire; it must still
// be handled, so the consumer drains the queue, the shard lets the
// publisher in again, and every publish completes. Before, the
// connection was not read at all while parked, and waited for itself.
//
// With an explicit-ack consumer, its settles are commands: they fit in
// the share of the client's window that publishes leave free, and are
// handled behind the parked publishes like the credit. Before that share
// was kept, the parked publishes held the whole window and the consumer
// could not settle what it took.
func TestParkedPublisherStillConsumes(t *testing.T) {
	for _, mode := range []client.AckMode{client.AckNone, client.AckExplicit} {
		t.Run(fmt.Sprintf("ack=%v", mode), func(t *testing.T) { testParkedPublisherStillConsumes(t, mode) })
	}
}

func testParkedPublisherStillConsumes(t *testing.T, mode client.AckMode) {
	const payloadSize = 1024
	dir := t.TempDir()
	addr, admin := testutil.FreeAddr(t), testutil.FreeAddr(t)
	proc := testutil.StartBerthd(t, filepath.Join(dir, "berthd.log"), "-listen", addr, "-admin", admin,
		"-data", filepath.Join(dir, "data"), "-controller", "", "-shards", "1", "-loops", "1",
		"-memory-limit", "16MiB", "-fsync", "never")
	testutil.WaitReady(t, admin, 60*time.Second)

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	conn, err := client.Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.DeclareQueue(ctx, "parked", client.QueueOptions{}); err != nil {
		t.Fatal(err)
	}
	sub, err := conn.Subscribe(ctx, "parked", client.SubscribeOptions{Credit: 0, AutoCredit: true, AckMode: mode})
	if err != nil {
		t.Fatal(err)
	}

	// Transient messages: kept in memory, then paged, until the index
	// entries fill the budget and the shard throttles.
	var sent, completed, failed atomic.Int64
	stopPub := make(chan struct{})
	pubDone := make(chan error, 1)
	go func() {
		payload := make([]byte, payloadSize)
		for {
			select {
			case <-stopPub:
				pubDone <- nil
				return
			default:
			}
			err := conn.PublishAsync(ctx, "", "parked", payload, client.PublishOptions{}, func(err error) {
				if err != nil {
					failed.Add(1)
				}
				completed.Add(1)
			})
			if err != nil {
				pubDone <- err
				return
			}
			sent.Add(1)
		}
	}()
	testutil.WaitFor(t, 2*time.Minute, func() error {
		if st := status(t, admin); len(st.ThrottledShards) == 0 {
			return fmt.Errorf("not throttled yet: %d completed", completed.Load())
		}
		return nil
	})
	close(stopPub)
	// The publisher stops at its share of the window of uncompleted
	// commands; the credit goes out behind them, and AutoCredit gives
	// more back as the messages arrive (with AckExplicit, as they are
	// settled).
	granted, err := sub.Credit(10_000)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("granted %d", granted)
	var got atomic.Int64
	cctx, stop := context.WithCancel(ctx)
	defer stop()
	consumed := make(chan error, 1)
	go func() {
		consumed <- sub.Consume(cctx, func(d *client.Delivery) error {
			got.Add(1)
			return nil
		})
	}()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("berthd log: %s", proc.LogTail())
			if resp, err := http.Get("http://" + admin + "/v1/queues"); err == nil {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				t.Logf("queues: %s", b)
			}
		}
	})
	testutil.WaitFor(t, 20*time.Second, func() error {
		if err := <-pubDoneOrNil(pubDone); err != nil {
			return err
		}
		select {
		case err := <-consumed:
			t.Fatalf("consume ended: %v", err)
		default:
		}
		if c, s := completed.Load(), sent.Load(); c < s || got.Load() < s {
			return fmt.Errorf("%d of %d publishes completed, %d delivered", c, s, got.Load())
		}
		return nil
	})
	stop()
	if err := <-consumed; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	if failed.Load() != 0 {
		t.Fatalf("%d publishes failed", failed.Load())
	}
	t.Logf("%d messages published and consumed on one connection through the throttle", sent.Load())
}

// pubDoneOrNil returns a channel that yields the publisher's result once
// it is known, and nil meanwhile (without taking it twice).
func pubDoneOrNil(ch chan error) chan error {
	out := make(chan error, 1)
	select {
	case err := <-ch:
		ch <- err
		out <- err
	default:
		out <- nil
	}
	return out
}
