package driver

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/berthmq/berth/internal/testutil"
)

// rabbitStart bounds a RabbitMQ node's boot; it takes some seconds.
const rabbitStart = 90 * time.Second

// rabbitServerPath finds the rabbitmq-server script that starts the node
// as the calling user. Debian's /usr/sbin/rabbitmq-server is a wrapper
// that switches to the rabbitmq user; the script it wraps is used instead.
func rabbitServerPath() string {
	if m, _ := filepath.Glob("/usr/lib/rabbitmq/lib/rabbitmq_server-*/sbin/rabbitmq-server"); len(m) > 0 {
		return m[len(m)-1]
	}
	if p, err := exec.LookPath("rabbitmq-server"); err == nil {
		if r, err := filepath.EvalSymlinks(p); err == nil && filepath.Base(r) != "rabbitmq-script-wrapper" {
			return p
		}
	}
	return ""
}

// startRabbit runs a private RabbitMQ node: its own epmd, data and log
// directories, every listener on loopback. The node's processes share a
// process group, which the cleanup stops.
func startRabbit(t *testing.T) string {
	t.Helper()
	bin := rabbitServerPath()
	if bin == "" {
		t.Skip("rabbitmq-server is not installed (Debian: apt-get install rabbitmq-server): AMQP driver test skipped")
	}
	epmd, err := exec.LookPath("epmd")
	if err != nil {
		t.Skip("epmd (Erlang) is not installed: AMQP driver test skipped")
	}
	dir := t.TempDir()
	addr, dist, epmdAddr := testutil.FreeAddr(t), testutil.FreeAddr(t), testutil.FreeAddr(t)
	port := addr[strings.LastIndex(addr, ":")+1:]
	distPort := dist[strings.LastIndex(dist, ":")+1:]
	epmdPort := epmdAddr[strings.LastIndex(epmdAddr, ":")+1:]

	ecmd := exec.Command(epmd, "-port", epmdPort, "-address", "127.0.0.1")
	ecmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	ep := testutil.Start(t, ecmd, filepath.Join(dir, "epmd.log"))
	ep.WaitPort(t, epmdAddr, 10*time.Second)

	plugins := filepath.Join(dir, "enabled_plugins")
	if err := os.WriteFile(plugins, []byte("[].\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin)
	cmd.Dir = dir
	cmd.Env = []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + dir,
		"LANG=C.UTF-8",
		"RABBITMQ_NODENAME=berthdriver@localhost",
		"RABBITMQ_NODE_IP_ADDRESS=127.0.0.1",
		"RABBITMQ_NODE_PORT=" + port,
		"RABBITMQ_DIST_PORT=" + distPort,
		"RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=-kernel inet_dist_use_interface {127,0,0,1}",
		"RABBITMQ_CONFIG_FILE=" + filepath.Join(dir, "rabbitmq"),
		"RABBITMQ_ENABLED_PLUGINS_FILE=" + plugins,
		"RABBITMQ_MNESIA_BASE=" + filepath.Join(dir, "mnesia"),
		"RABBITMQ_LOG_BASE=" + filepath.Join(dir, "log"),
		"RABBITMQ_LOGS=-",
		"RABBITMQ_PID_FILE=" + filepath.Join(dir, "rabbit.pid"),
		"ERL_EPMD_ADDRESS=127.0.0.1",
		"ERL_EPMD_PORT=" + epmdPort,
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	p := testutil.Start(t, cmd, filepath.Join(dir, "rabbit.log"))
	pgid := p.Pid()
	// Runs before testutil's own cleanup, which kills only the script.
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("rabbitmq-server log:\n%s", p.LogTail())
		}
		stopGroup(pgid, 15*time.Second)
	})
	p.WaitPort(t, addr, rabbitStart)
	return addr
}

// stopGroup sends SIGTERM to process group pgid, waits for it to be
// empty, and sends SIGKILL to what is left after within.
func stopGroup(pgid int, within time.Duration) {
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if err := syscall.Kill(-pgid, 0); errors.Is(err, syscall.ESRCH) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
}

// amqpQueue reports a queue's ready messages, or ok false if it does not
// exist.
func amqpQueue(t *testing.T, conn *amqp.Connection, q string) (messages int, ok bool) {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	info, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
	var aerr *amqp.Error
	if errors.As(err, &aerr) && aerr.Code == amqp.NotFound {
		return 0, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return info.Messages, true
}

// One node for both checks: it takes seconds to boot.
func TestAMQPDriver(t *testing.T) {
	addr := startRabbit(t)
	conn, err := amqp.Dial(amqpURL(addr))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	t.Run("run", func(t *testing.T) {
		d, err := New("amqp", Options{Addrs: []string{addr}, Window: 32})
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		exercise(t, d, []string{"aq-0", "aq-1"}, 50, func(q string) bool {
			_, ok := amqpQueue(t, conn, q)
			return !ok
		})
	})

	// Queues that were there are never deleted: one with messages is
	// refused without Reuse, an empty one or a reused one is kept.
	t.Run("harm", func(t *testing.T) {
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		if err := ch.Confirm(false); err != nil {
			t.Fatal(err)
		}
		for _, q := range []string{"theirs", "empty"} {
			if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
				t.Fatal(err)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", "theirs", false, false, amqp.Publishing{Body: []byte("their message")})
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := dc.WaitContext(ctx); !ok || err != nil {
			t.Fatalf("their message not confirmed: %t %v", ok, err)
		}
		ch.Close()
		cc := ConsumerConfig{Credit: 8, Ack: AckExplicit, PerQueue: 1}

		d, _ := New("amqp", Options{Addrs: []string{addr}})
		err = d.Setup(ctx, []string{"fresh", "theirs"}, cc, SetupOptions{})
		if !errors.Is(err, ErrQueueInUse) || !strings.Contains(err.Error(), "theirs exists and it holds 1 messages") {
			t.Fatalf("setup on a queue with a message: %v", err)
		}
		if err := d.Cleanup(ctx); err != nil {
			t.Fatal(err)
		}
		if _, ok := amqpQueue(t, conn, "fresh"); ok {
			t.Fatal("the refused run left the queue it declared")
		}
		if n, ok := amqpQueue(t, conn, "theirs"); !ok || n != 1 {
			t.Fatalf("their queue: exists %t, %d messages", ok, n)
		}

		for _, tc := range []struct {
			queue string
			reuse bool
		}{{"empty", false}, {"theirs", true}} {
			d, _ := New("amqp", Options{Addrs: []string{addr}})
			if err := d.Setup(ctx, []string{tc.queue}, cc, SetupOptions{Reuse: tc.reuse}); err != nil {
				t.Fatalf("%s: %v", tc.queue, err)
			}
			if len(d.Created()) != 0 {
				t.Fatalf("%s: created %v", tc.queue, d.Created())
			}
			if err := d.Cleanup(ctx); err != nil {
				t.Fatal(err)
			}
			if _, ok := amqpQueue(t, conn, tc.queue); !ok {
				t.Fatalf("%s was deleted", tc.queue)
			}
		}
	})
}
