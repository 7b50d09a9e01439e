package clustertest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/internal/testutil"
	"github.com/berthmq/berth/wire"
)

// waitStopped waits until n's process is stopped (SIGSTOP took effect):
// nothing it had not read by then is read before SIGCONT.
func waitStopped(t *testing.T, n *node) {
	t.Helper()
	testutil.WaitFor(t, 10*time.Second, func() error {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", n.proc.Pid()))
		if err != nil {
			return err
		}
		// pid (comm) state ...: the state follows the last ')'.
		s := string(b)
		if i := strings.LastIndexByte(s, ')'); i >= 0 && strings.HasPrefix(s[i+1:], " T") {
			return nil
		}
		return fmt.Errorf("%s not stopped: %.60s", n.name, s)
	})
}

// TestOutcomeUnknownMasterFrozen: a broker forwards a publish, and
// passes a proxied consumer's accept, to the queue's master, which is
// frozen (SIGSTOP) with both in flight. The controller's broker timeout
// is long, so the group keeps that master, and the forwarding connection
// stalls (5 s): the broker fails the forward and ends the proxied
// consumer, whose accept it answers itself. Neither command's outcome is
// known (the master holds them unread, and may carry them out once
// thawed). A client of protocol 1.4 gets outcome-unknown for both: an
// *Error matching client.ErrOutcomeUnknown, with the broker's text. A
// client of 1.3 gets unavailable for both, with the same text, as 1.3
// brokers answered.
func TestOutcomeUnknownMasterFrozen(t *testing.T) {
	testutil.Long(t, "outcome-unknown across a frozen master")
	const groups = 3
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	c := startReplicatedWith(t, ctx, groups, 3, 0, "-controller-broker-timeout", "60s", "-consume-at-replicas=false")
	const queue = "outcome-frozen"
	_, _, mnode, mconn := c.declare(queue, groups)
	c.declareEverywhere(queue)
	c.publishAll(mconn, queue, names(0, 2))
	mconn.Close()
	fnode := c.follower(mnode)

	newer := dial(t, ctx, fnode.client)
	older, err := client.DialConfig(ctx, client.Config{MaxVersion: wire.VersionCancelled}, fnode.client)
	if err != nil {
		t.Fatal(err)
	}
	defer older.Close()
	type side struct {
		name string
		conn *client.Conn
		con  *client.Consumer
		held *client.Delivery
		want wire.ErrorCode
	}
	sides := []*side{{name: "1.4", conn: newer, want: wire.CodeOutcomeUnknown}, {name: "1.3", conn: older, want: wire.CodeUnavailable}}
	for _, s := range sides {
		// Through fnode: the publish is forwarded, the consumer proxied.
		testutil.WaitFor(t, 30*time.Second, func() error {
			pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
			defer pcancel()
			return s.conn.Publish(pctx, "", queue, []byte("warm-"+s.name), client.PublishOptions{Persistent: true})
		})
		s.con, err = subscribeWhenServing(t, ctx, s.conn, queue, client.SubscribeOptions{Credit: 1})
		if err != nil {
			t.Fatalf("%s: subscribe: %v", s.name, err)
		}
		nctx, ncancel := context.WithTimeout(ctx, 20*time.Second)
		s.held, err = s.con.Next(nctx)
		ncancel()
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
	}
	if v := older.Version(); v != wire.VersionCancelled {
		t.Fatalf("the old client's session is %v", v)
	}

	mnode.signal(syscall.SIGSTOP)
	defer mnode.signal(syscall.SIGCONT) // also if the test fails
	waitStopped(t, mnode)
	type outcome struct {
		s    *side
		what string
		err  error
	}
	results := make(chan outcome, 2*len(sides))
	for _, s := range sides {
		if err := s.conn.PublishAsync(ctx, "", queue, []byte("in-flight-"+s.name), client.PublishOptions{Persistent: true}, func(err error) {
			results <- outcome{s, "publish", err}
		}); err != nil {
			t.Fatal(err)
		}
		go func() { results <- outcome{s, "accept", s.held.Accept(ctx)} }()
	}
	for range 2 * len(sides) {
		var r outcome
		select {
		case r = <-results:
		case <-time.After(60 * time.Second):
			t.Fatal("commands to the frozen master still unanswered after 60 s")
		}
		var se *client.Error
		if !errors.As(r.err, &se) || se.Code != r.s.want || !strings.Contains(se.Text, "unknown") && !strings.Contains(se.Text, "may or may not") {
			t.Errorf("%s client's %s to a frozen master: %v; want %v, with a text saying the outcome is unknown", r.s.name, r.what, r.err, r.s.want)
			continue
		}
		if unknown := errors.Is(r.err, client.ErrOutcomeUnknown); unknown != (r.s.want == wire.CodeOutcomeUnknown) {
			t.Errorf("%s client's %s: %v matches ErrOutcomeUnknown: %v", r.s.name, r.what, r.err, unknown)
		}
		t.Logf("%s client's %s: %v", r.s.name, r.what, r.err)
	}
	for _, s := range sides {
		// The proxied consumer ended; the connection goes on.
		nctx, ncancel := context.WithTimeout(ctx, 20*time.Second)
		_, err := s.con.Next(nctx)
		ncancel()
		if !errors.Is(err, client.ErrConsumerEnded) || s.conn.Err() != nil {
			t.Errorf("%s: consumer after its master froze: %v (connection: %v); want ErrConsumerEnded", s.name, err, s.conn.Err())
		}
	}
}
