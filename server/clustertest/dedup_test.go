package clustertest

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/internal/testutil"
	"github.com/berthmq/berth/wire"
)

// producerPublish sends one persistent message to queue at addr as
// producer's publish number seq, on a connection of its own, and returns
// the broker's answer: nil for a COMPLETE, an error for an ERROR. It is
// what a client's resend after a broken connection looks like.
func producerPublish(t *testing.T, addr string, producer, seq uint64, queue, body string) error {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(20 * time.Second))
	b := wire.AppendHello(nil, []wire.Version{wire.Current}, "dedup-test", "none", nil, 0, 0)
	b, st := wire.AppendPublishStartProducer(b, wire.Current, seq, producer, "", 1)
	b = wire.AppendPublishMessage(b, wire.MsgPersistent, 0, queue, nil, []byte(body))
	wire.EndFrame(b, st, 0)
	if _, err := nc.Write(b); err != nil {
		t.Fatal(err)
	}
	var buf []byte
	chunk := make([]byte, 4096)
	for {
		for len(buf) > 0 {
			h, fb, n, err := wire.Next(buf, wire.FrameSizeMax)
			if err != nil {
				t.Fatalf("bad frame from %s: %v", addr, err)
			}
			if n == 0 {
				break
			}
			buf = buf[n:]
			switch h.Type {
			case wire.TypeComplete:
				return nil
			case wire.TypeError:
				var e wire.Error
				if err := wire.DecodeError(fb, &e); err != nil {
					t.Fatal(err)
				}
				return fmt.Errorf("%s: %s", e.Code, e.Text)
			}
		}
		n, err := nc.Read(chunk)
		if err != nil {
			t.Fatalf("reading the answer to publish %d of producer %d: %v", seq, producer, err)
		}
		buf = append(buf, chunk[:n]...)
	}
}

// TestRetryOfConsumedPublishStaysSkipped: a producer's resend of a
// message that was enqueued, consumed and accepted is skipped, and stays
// skipped when the group's log has been compacted past the first copy
// and a member applies the log again (a master that stepped down).
//
// Before the master checked its producer table at propose time, the
// resend went into the log as an entry that every member skipped when
// it applied it live. A member applying the compacted log again starts
// from an empty table, so it enqueued the resend: the old master then
// held a message no other member held, and would deliver it once it
// was master again.
func TestRetryOfConsumedPublishStaysSkipped(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := startReplicated(t, ctx, 1)
	const q = "dedup-compacted"
	const producer = 0xfeed
	g, master, mnode, conn := c.declare(q, 1)

	if err := producerPublish(t, mnode.client, producer, 1, q, "first"); err != nil {
		t.Fatalf("first publish: %v", err)
	}
	con, err := conn.Subscribe(ctx, q, client.SubscribeOptions{Credit: 1})
	if err != nil {
		t.Fatal(err)
	}
	d, err := con.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if string(d.Payload) != "first" {
		t.Fatalf("got %q, want first", d.Payload)
	}
	if err := d.Accept(ctx); err != nil {
		t.Fatal(err)
	}
	if err := con.Cancel(ctx); err != nil {
		t.Fatal(err)
	}
	c.waitReady(q, 0)
	// A message that stays: the log cannot be compacted past it.
	c.publishAll(conn, q, []string{"pin"})
	before := c.lastIndex(mnode, g)
	// Resent at the master, and at a follower, which forwards it.
	for _, at := range []*node{mnode, c.follower(mnode)} {
		if err := producerPublish(t, at.client, producer, 1, q, "first"); err != nil {
			t.Fatalf("resend at %s: %v", at.name, err)
		}
		c.waitReady(q, 1)
		if after := c.lastIndex(mnode, g); after != before {
			t.Errorf("the resend at %s of an applied publish went into the log (last index %d -> %d)", at.name, before, after)
		}
	}
	// The log is compacted past the first copy (a group tries every 50
	// ticks of 20 ms at the latest).
	testutil.WaitFor(t, 20*time.Second, func() error {
		var view struct {
			Groups []struct {
				Group uint32
				Base  uint64
			}
		}
		if err := c.getJSON(mnode, "/v1/groups", &view); err != nil {
			return err
		}
		for _, v := range view.Groups {
			if v.Group == g && v.Base > 0 {
				return nil
			}
		}
		return fmt.Errorf("group %d not compacted at %s yet", g, mnode.name)
	})

	// The master steps down and applies the compacted log again.
	c.stepDown(g, master, mnode)
	testutil.WaitFor(t, 20*time.Second, func() error {
		role, _, err := c.role(mnode, g)
		if err != nil {
			return err
		}
		if role != "follower" {
			return fmt.Errorf("%s is %q in group %d", mnode.name, role, g)
		}
		var view struct {
			Groups []struct {
				Group           uint32
				Commit, Applied uint64
			}
		}
		if err := c.getJSON(mnode, "/v1/groups", &view); err != nil {
			return err
		}
		for _, v := range view.Groups {
			if v.Group == g && v.Commit > 0 && v.Applied >= v.Commit {
				return nil
			}
		}
		return fmt.Errorf("%s has not applied group %d's log again yet", mnode.name, g)
	})
	// Every member holds "pin" only, for a while.
	for range 5 {
		c.waitReady(q, 1)
		time.Sleep(100 * time.Millisecond)
	}
	newMaster, nnode := c.waitServing(g)
	if newMaster == master {
		t.Fatalf("group %d still mastered by %d", g, master)
	}
	c.consumeAll(nnode, q, []string{"pin"})
}
