package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/internal/testutil"
	"github.com/berthmq/berth/wire"
)

func TestMain(m *testing.M) { testutil.Main(m) }

type broker struct {
	client, admin string
	conn          *client.Conn
}

// startBroker runs berthd as a process on loopback addresses and opens a
// session to it for the test's own checks.
func startBroker(t *testing.T) *broker {
	t.Helper()
	dir := t.TempDir()
	b := &broker{client: testutil.FreeAddr(t), admin: testutil.FreeAddr(t)}
	logPath := filepath.Join(dir, "berthd.log")
	p := testutil.StartBerthd(t, logPath, "-listen", b.client, "-admin", b.admin, "-data", filepath.Join(dir, "data"),
		"-controller", "127.0.0.1:0", "-shards", "2", "-loops", "1", "-fsync", "never", "-log-level", "warn")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("berthd log:\n%s", testutil.FileTail(logPath, 4000))
		}
	})
	p.WaitPort(t, b.client, 20*time.Second)
	testutil.WaitReady(t, b.admin, 20*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, b.client)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	b.conn = c
	return b
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

// declare makes queue q holding the given messages.
func (b *broker) declare(t *testing.T, q string, msgs ...string) {
	t.Helper()
	if err := b.conn.DeclareQueue(ctx(t), q, client.QueueOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		if err := b.conn.Publish(ctx(t), "", q, []byte(m), client.PublishOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

func (b *broker) exists(t *testing.T, q string) bool {
	t.Helper()
	err := b.conn.DeclareQueue(ctx(t), q, client.QueueOptions{Passive: true})
	if client.Code(err) == wire.CodeNotFound {
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	return true
}

// bodies takes every message of q, accepting them, and returns their
// bodies and delivery counts.
func (b *broker) bodies(t *testing.T, q string) ([]string, []uint32) {
	t.Helper()
	sub, err := b.conn.Subscribe(ctx(t), q, client.SubscribeOptions{Credit: 100})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Cancel(ctx(t))
	var bodies []string
	var counts []uint32
	for {
		c, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		d, err := sub.Next(c)
		cancel()
		if err != nil {
			return bodies, counts
		}
		bodies = append(bodies, string(d.Payload))
		counts = append(counts, d.DeliveryCount)
		if err := d.Accept(ctx(t)); err != nil {
			t.Fatal(err)
		}
		if len(bodies) > 100 {
			t.Fatalf("more than 100 messages on %s", q)
		}
	}
}

// bench runs berth-bench against b with a small bounded workload.
func (b *broker) bench(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	full := append([]string{"--addr", b.client, "--quiet", "--count", "200", "--size", "64", "--producers", "1"}, args...)
	var stdout, stderr bytes.Buffer
	code := run(full, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// An existing queue with messages is refused without --reuse, and left as
// it was: its message is still there, never delivered.
func TestRefusesQueueWithMessages(t *testing.T) {
	b := startBroker(t)
	b.declare(t, "theirs-0", "their message")
	code, _, errOut := b.bench(t, "--queue-prefix", "theirs", "--admin", b.admin)
	if code != 1 || !strings.Contains(errOut, "theirs-0 exists and it holds 1 messages") || !strings.Contains(errOut, "--reuse") {
		t.Fatalf("exit %d, stderr %q; want exit 1 naming the queue, its message and --reuse", code, errOut)
	}
	// Without --admin the depth is unknown: refused too.
	code, _, errOut = b.bench(t, "--queue-prefix", "theirs")
	if code != 1 || !strings.Contains(errOut, "cannot tell whether it holds messages") || !strings.Contains(errOut, "--admin") {
		t.Fatalf("without --admin: exit %d, stderr %q", code, errOut)
	}
	bodies, counts := b.bodies(t, "theirs-0")
	if len(bodies) != 1 || bodies[0] != "their message" || counts[0] != 0 {
		t.Fatalf("their queue now holds %q (delivery counts %v), want their one message, undelivered", bodies, counts)
	}
}

// A refusal after the run declared some of its queues deletes those, and
// only those.
func TestRefusalDeletesWhatItDeclared(t *testing.T) {
	b := startBroker(t)
	b.declare(t, "part-1", "their message")
	code, _, errOut := b.bench(t, "--queue-prefix", "part", "--queues", "3", "--consumers", "3", "--admin", b.admin)
	if code != 1 || !strings.Contains(errOut, "part-1 exists") {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	if b.exists(t, "part-0") || b.exists(t, "part-2") {
		t.Fatal("the queue the refused run declared is still there")
	}
	if !b.exists(t, "part-1") {
		t.Fatal("their queue is gone")
	}
}

// With --reuse the run uses a queue with messages and leaves it in place;
// an empty queue is used without --reuse and left in place too; only the
// queue the run declared is deleted.
func TestNeverDeletesWhatItDidNotDeclare(t *testing.T) {
	b := startBroker(t)
	b.declare(t, "reused-0", "their message")
	code, out, errOut := b.bench(t, "--queue-prefix", "reused", "--admin", b.admin, "--reuse")
	if code != 0 {
		t.Fatalf("--reuse: exit %d, stderr %q", code, errOut)
	}
	if !b.exists(t, "reused-0") {
		t.Fatal("--reuse run deleted the queue it was given")
	}
	if strings.Contains(out, "deleted the queues") {
		t.Fatalf("--reuse run says it deleted queues:\n%s", out)
	}

	b.declare(t, "mixed-1") // empty: usable without --reuse
	code, out, errOut = b.bench(t, "--queue-prefix", "mixed", "--queues", "2", "--consumers", "2", "--admin", b.admin)
	if code != 0 {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	if !b.exists(t, "mixed-1") {
		t.Fatal("the run deleted the empty queue it found")
	}
	if b.exists(t, "mixed-0") {
		t.Fatal("the run left the queue it declared")
	}
	if !strings.Contains(out, "deleted the queues it created: mixed-0\n") {
		t.Fatalf("the report does not say what was deleted:\n%s", out)
	}
}

// The queues a run declares are deleted when it ends, unless --keep; a
// --count alone is the whole run: no warm-up, no time limit, that many
// messages measured.
func TestCreatedQueuesDeletedUnlessKeep(t *testing.T) {
	b := startBroker(t)
	resPath := filepath.Join(t.TempDir(), "res.json")
	code, _, errOut := b.bench(t, "--queue-prefix", "fresh", "--queues", "2", "--consumers", "2", "--json", resPath)
	if code != 0 {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	if b.exists(t, "fresh-0") || b.exists(t, "fresh-1") {
		t.Fatal("the run left the queues it declared")
	}
	raw, err := os.ReadFile(resPath)
	if err != nil {
		t.Fatal(err)
	}
	var res struct {
		Published, Completed, Consumed int64
		Settings                       struct {
			DurationS float64 `json:"duration_s"`
			WarmupS   float64 `json:"warmup_s"`
			Count     int64   `json:"count"`
		} `json:"settings"`
	}
	if err := json.Unmarshal(raw, &res); err != nil {
		t.Fatal(err)
	}
	if res.Settings.DurationS != 0 || res.Settings.WarmupS != 0 || res.Settings.Count != 200 ||
		res.Published != 200 || res.Completed != 200 || res.Consumed != 200 {
		t.Fatalf("--count 200 alone ran %+v", res)
	}

	code, out, errOut := b.bench(t, "--queue-prefix", "kept", "--keep")
	if code != 0 {
		t.Fatalf("--keep: exit %d, stderr %q", code, errOut)
	}
	if !b.exists(t, "kept-0") || !strings.Contains(out, "kept the queues it created (--keep): kept-0") {
		t.Fatalf("--keep did not keep kept-0:\n%s", out)
	}
}

func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--count", "-5"},
		{"--queue-prefix", ""},
		{"--driver", "kafka"},
		{"stray"},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(append([]string{"--addr", "127.0.0.1:1"}, args...), &stdout, &stderr); code != 2 || stderr.Len() == 0 {
			t.Errorf("%v: exit %d, stderr %q; want 2 and a message", args, code, stderr.String())
		}
	}
}
