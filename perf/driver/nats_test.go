package driver

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/berthmq/berth/internal/testutil"
)

// natsServerPath finds nats-server: on PATH (Debian's nats-server
// package), or where `make nats-server` installs it.
func natsServerPath() string {
	if p, err := exec.LookPath("nats-server"); err == nil {
		return p
	}
	if home, err := os.UserHomeDir(); err == nil {
		p := filepath.Join(home, ".cache", "berth-perf", "bin", "nats-server")
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p
		}
	}
	return ""
}

// startNATS runs a nats-server with JetStream on a loopback port, or
// skips the test when none is installed.
func startNATS(t *testing.T) string {
	t.Helper()
	bin := natsServerPath()
	if bin == "" {
		t.Skip("nats-server is not installed (Debian: apt-get install nats-server; or make nats-server): NATS driver test skipped")
	}
	addr := testutil.FreeAddr(t)
	host, port, _ := strings.Cut(addr, ":")
	dir := t.TempDir()
	logPath := filepath.Join(dir, "nats.log")
	p := testutil.Start(t, exec.Command(bin, "-a", host, "-p", port, "-js", "-sd", filepath.Join(dir, "js"), "-n", "berth-driver-test"), logPath)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("nats-server log:\n%s", p.LogTail())
		}
	})
	p.WaitPort(t, addr, 20*time.Second)
	return addr
}

func natsJS(t *testing.T, addr string) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect("nats://" + addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

func TestNATSDriverRun(t *testing.T) {
	addr := startNATS(t)
	js := natsJS(t, addr)
	d, err := New("nats", Options{Addrs: []string{addr}, Window: 32})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	exercise(t, d, []string{"nq-0", "nq-1"}, 50, func(q string) bool {
		_, err := js.Stream(context.Background(), q)
		return errors.Is(err, jetstream.ErrStreamNotFound)
	})
	err = d.Setup(context.Background(), []string{"nq-x"}, ConsumerConfig{Credit: 1, Ack: AckNone}, SetupOptions{})
	if !errors.Is(err, ErrNATSAckNone) {
		t.Fatalf("ack none: %v", err)
	}
}

// Streams that were there are never deleted: one with messages is
// refused without Reuse; one that is empty, or reused, is kept, and the
// bench consumer added to it is taken away again.
func TestNATSDriverHarm(t *testing.T) {
	addr := startNATS(t)
	js := natsJS(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, name := range []string{"theirs", "empty"} {
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := js.Publish(ctx, "theirs", []byte("their message")); err != nil {
		t.Fatal(err)
	}
	msgs := func(name string) uint64 {
		t.Helper()
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatalf("stream %s: %v", name, err)
		}
		return s.CachedInfo().State.Msgs
	}
	benchConsumer := func(name string) bool {
		_, err := js.Consumer(ctx, name, natsConsumerName)
		return err == nil
	}
	cc := ConsumerConfig{Credit: 8, Ack: AckExplicit, PerQueue: 1}

	d, _ := New("nats", Options{Addrs: []string{addr}})
	err := d.Setup(ctx, []string{"theirs"}, cc, SetupOptions{})
	if !errors.Is(err, ErrQueueInUse) || !strings.Contains(err.Error(), "holds 1 messages") {
		t.Fatalf("setup on a stream with a message: %v", err)
	}
	if err := d.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	if msgs("theirs") != 1 || benchConsumer("theirs") {
		t.Fatal("the refused stream was changed")
	}

	for _, tc := range []struct {
		stream string
		reuse  bool
	}{{"empty", false}, {"theirs", true}} {
		d, _ := New("nats", Options{Addrs: []string{addr}})
		if err := d.Setup(ctx, []string{tc.stream}, cc, SetupOptions{Reuse: tc.reuse}); err != nil {
			t.Fatalf("%s: %v", tc.stream, err)
		}
		if len(d.Created()) != 0 || !benchConsumer(tc.stream) {
			t.Fatalf("%s: created %v, bench consumer %t", tc.stream, d.Created(), benchConsumer(tc.stream))
		}
		if err := d.Cleanup(ctx); err != nil {
			t.Fatal(err)
		}
		if benchConsumer(tc.stream) {
			t.Fatalf("%s: the bench consumer is still there", tc.stream)
		}
		msgs(tc.stream) // fails the test if the stream is gone
	}
	if msgs("theirs") != 1 {
		t.Fatal("their message is gone")
	}
}
