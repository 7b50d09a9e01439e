package clustertest

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/internal/testutil"
)

// TestReplicatedQueueMemoryBudget: three brokers with a 16 MiB memory
// budget each, and a publisher of 1 KiB persistent messages to a
// replicated queue that nobody consumes. A replicated message's body is
// its event in the group log, so paging it out would free nothing: the
// master must keep counting it and throttle the publisher at its limit,
// rather than page (uncount) the bodies and grow without bound. Then a
// consumer drains every completed message and the throttle lifts.
func TestReplicatedQueueMemoryBudget(t *testing.T) {
	const groups, payloadSize, publishMax = 3, 1024, 200_000
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	c := startReplicatedWith(t, ctx, groups, 3, 0, "-memory-limit", "16MiB")
	const queue = "budget"
	_, _, mnode, conn := c.declare(queue, groups)
	type memStatus struct {
		Memory struct {
			LimitBytes      int64 `json:"limit_bytes"`
			UsedBytes       int64 `json:"used_bytes"`
			PagedMessages   int64 `json:"paged_messages"`
			ThrottledShards []int `json:"throttled_shards"`
		} `json:"memory"`
	}
	status := func() memStatus {
		var st memStatus
		if err := c.getJSON(mnode, "/v1/status", &st); err != nil {
			t.Fatal(err)
		}
		return st
	}

	var sent, completed, failed atomic.Int64
	stop := make(chan struct{})
	pubDone := make(chan error, 1)
	go func() {
		payload := make([]byte, payloadSize)
		for sent.Load() < publishMax {
			select {
			case <-stop:
				pubDone <- nil
				return
			default:
			}
			err := conn.PublishAsync(ctx, "", queue, payload, client.PublishOptions{Persistent: true}, func(err error) {
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
		pubDone <- nil
	}()
	var at memStatus
	testutil.WaitFor(t, 90*time.Second, func() error {
		at = status()
		if len(at.Memory.ThrottledShards) == 0 {
			if sent.Load() >= publishMax {
				t.Fatalf("%d publishes of %d bytes sent to a replicated queue under a %d-byte budget and the master never throttled (%d paged)",
					sent.Load(), payloadSize, at.Memory.LimitBytes, at.Memory.PagedMessages)
			}
			return fmt.Errorf("not throttled yet: %d completed, %d bytes counted", completed.Load(), at.Memory.UsedBytes)
		}
		return nil
	})
	// The publisher may be waiting for window room its held-back
	// publishes take: it stops once the consumer below makes room.
	close(stop)
	if at.Memory.PagedMessages != 0 {
		t.Fatalf("the master paged out %d replicated messages", at.Memory.PagedMessages)
	}
	if done := completed.Load(); done*payloadSize > 2*at.Memory.LimitBytes {
		t.Fatalf("%d publishes of %d bytes completed before the %d-byte budget throttled", done, payloadSize, at.Memory.LimitBytes)
	}
	t.Logf("throttled after %d completed publishes, %d bytes counted of %d", completed.Load(), at.Memory.UsedBytes, at.Memory.LimitBytes)

	// Drain: every publish sent completes once the consumer makes room,
	// and the throttle lifts.
	sub := dial(t, ctx, mnode.client)
	con, err := sub.Subscribe(ctx, queue, client.SubscribeOptions{Credit: 1000, AutoCredit: true})
	if err != nil {
		t.Fatal(err)
	}
	var got atomic.Int64
	cctx, cstop := context.WithCancel(ctx)
	defer cstop()
	consumed := make(chan error, 1)
	go func() {
		consumed <- con.Consume(cctx, func(*client.Delivery) error { got.Add(1); return nil })
	}()
	pubErr := make(chan error, 1)
	testutil.WaitFor(t, 60*time.Second, func() error {
		select {
		case err := <-pubDone:
			pubErr <- err
			if err != nil {
				t.Fatal(err)
			}
		default:
			if len(pubErr) == 0 {
				return fmt.Errorf("the publisher has not stopped: %d sent, %d completed", sent.Load(), completed.Load())
			}
		}
		if c, s := completed.Load(), sent.Load(); c < s || got.Load() < s {
			return fmt.Errorf("%d of %d publishes completed, %d consumed", c, s, got.Load())
		}
		if st := status(); len(st.Memory.ThrottledShards) != 0 {
			return fmt.Errorf("still throttled with %d bytes counted", st.Memory.UsedBytes)
		}
		return nil
	})
	cstop()
	if err := <-consumed; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	if failed.Load() != 0 {
		t.Fatalf("%d publishes failed", failed.Load())
	}
	if got.Load() != sent.Load() {
		t.Fatalf("consumed %d of %d", got.Load(), sent.Load())
	}
}
