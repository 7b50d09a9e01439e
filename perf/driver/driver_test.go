package driver

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeOps is a broker of queues in memory, recording what was done.
type fakeOps struct {
	queues  map[string]queueState
	log     []string
	failFor string // create fails for this queue
}

func (f *fakeOps) inspect(_ context.Context, q string) (queueState, error) {
	return f.queues[q], nil
}

func (f *fakeOps) create(_ context.Context, q string, _ ConsumerConfig) error {
	if q == f.failFor {
		return errors.New("no room")
	}
	f.queues[q] = queueState{exists: true}
	f.log = append(f.log, "create "+q)
	return nil
}

func (f *fakeOps) adopt(_ context.Context, q string, _ ConsumerConfig) (bool, error) {
	f.log = append(f.log, "adopt "+q)
	return q == "added", nil
}

func (f *fakeOps) remove(_ context.Context, q string) error {
	delete(f.queues, q)
	f.log = append(f.log, "remove "+q)
	return nil
}

func (f *fakeOps) unadopt(_ context.Context, q string) error {
	f.log = append(f.log, "unadopt "+q)
	return nil
}

// The rules of Driver.Setup and Cleanup, on a broker in memory.
func TestSetupRules(t *testing.T) {
	ctx := context.Background()
	full := queueState{exists: true, messages: 3}
	used := queueState{exists: true, consumers: 1}
	blind := queueState{exists: true, messages: -1, unknown: "no admin"}
	empty := queueState{exists: true}
	for _, tc := range []struct {
		name    string
		have    map[string]queueState
		queues  []string
		reuse   bool
		failFor string
		wantErr string // "" for none
		wantLog []string
	}{
		{"fresh", nil, []string{"a", "b"}, false, "", "",
			[]string{"create a", "create b", "remove b", "remove a"}},
		{"full refused", map[string]queueState{"b": full}, []string{"a", "b", "c"}, false, "", "b exists and it holds 3 messages",
			[]string{"create a", "remove a"}},
		{"consumers refused", map[string]queueState{"a": used}, []string{"a"}, false, "", "a exists and it has 1 consumers", nil},
		{"unknown refused", map[string]queueState{"a": blind}, []string{"a"}, false, "", "cannot tell whether it holds messages: no admin", nil},
		{"reused", map[string]queueState{"a": full, "b": used, "c": blind}, []string{"a", "b", "c", "d"}, true, "", "",
			[]string{"adopt a", "adopt b", "adopt c", "create d", "remove d"}},
		{"empty used", map[string]queueState{"a": empty, "added": empty}, []string{"a", "added"}, false, "", "",
			[]string{"adopt a", "adopt added", "unadopt added"}},
		{"create fails", nil, []string{"a", "b"}, false, "b", "no room",
			[]string{"create a", "remove a"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeOps{queues: map[string]queueState{}, failFor: tc.failFor}
			for q, st := range tc.have {
				f.queues[q] = st
			}
			var own owned
			err := setupQueues(ctx, f, &own, tc.queues, ConsumerConfig{}, SetupOptions{Reuse: tc.reuse})
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("setup: %v, want %q", err, tc.wantErr)
			}
			if strings.Contains(tc.wantErr, "exists") && !errors.Is(err, ErrQueueInUse) {
				t.Fatalf("refusal %v is not ErrQueueInUse", err)
			}
			if err := cleanupQueues(ctx, f, &own); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(f.log, tc.wantLog) {
				t.Fatalf("did %q, want %q", f.log, tc.wantLog)
			}
			for q, st := range tc.have {
				if _, ok := f.queues[q]; !ok {
					t.Fatalf("queue %s (%+v) it found was deleted", q, st)
				}
			}
			if len(own.created()) != 0 || !own.empty() {
				t.Fatalf("after cleanup it still owns %v", own.steps)
			}
		})
	}
}

// exercise runs a driver through one small workload on fresh queues: it
// declares them, publishes n messages to each and consumes them, and
// deletes them in Cleanup. gone reports whether a queue no longer exists.
func exercise(t *testing.T, d Driver, queues []string, n int, gone func(string) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cc := ConsumerConfig{Credit: 16, Ack: AckExplicit, PerQueue: 1}
	if err := d.Setup(ctx, queues, cc, SetupOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := d.Created(); !slices.Equal(got, queues) {
		t.Fatalf("created %v, want %v", got, queues)
	}
	var received atomic.Int64
	var consumers []Consumer
	for i, q := range queues {
		c, err := d.NewConsumer(ctx, i, q, cc, func(p []byte) {
			if strings.HasPrefix(string(p), "m") {
				received.Add(1)
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		consumers = append(consumers, c)
	}
	p, err := d.NewProducer(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var failed atomic.Int64
	for _, q := range queues {
		for i := range n {
			wg.Add(1)
			err := p.Publish(ctx, q, fmt.Appendf(nil, "m%d", i), func(err error) {
				if err != nil {
					failed.Add(1)
				}
				wg.Done()
			})
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	wg.Wait()
	if failed.Load() != 0 {
		t.Fatalf("%d publishes failed", failed.Load())
	}
	want := int64(n * len(queues))
	// Past JetStream's default ack wait (30 s): a message its server
	// handed to a pull request the client had already let go of comes
	// back only then (TestNATSDriverRun once got 93 of 100 within 20 s
	// under the race detector).
	deadline := time.Now().Add(40 * time.Second)
	for received.Load() < want && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := received.Load(); got != want {
		t.Fatalf("received %d of %d messages", got, want)
	}
	for _, c := range consumers {
		c.Close()
	}
	p.Close()
	if err := d.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	for _, q := range queues {
		if !gone(q) {
			t.Fatalf("Cleanup left %s", q)
		}
	}
	if len(d.Created()) != 0 {
		t.Fatalf("still created after Cleanup: %v", d.Created())
	}
}
