package controlplane

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"net"
	"testing"
	"time"

	"github.com/berthmq/berth/controlplane/ctlapi"
	"github.com/berthmq/berth/controlplane/ctlclient"
	"github.com/berthmq/berth/wire"
)

// TestServiceRejectsGarbage feeds random and truncated bodies to every
// operation: each must get an answer, never a panic.
func TestServiceRejectsGarbage(t *testing.T) {
	n, err := StartSingle(t.TempDir(), "127.0.0.1:0", quietLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer n.Stop()
	r := rand.New(rand.NewSource(7))
	valid := [][]byte{
		ctlapi.EncodeEvent(nil, &ctlapi.DeclareQueue{Name: "q"}),
		{byte(ctlapi.ReadConsistent), ctlapi.QueryGroups, 0, 0, 0, 0, 0, 0, 0, 10},
		{0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
	}
	for i := 0; i < 3000; i++ {
		var body []byte
		if i%3 == 0 {
			v := valid[r.Intn(len(valid))]
			body = append([]byte(nil), v[:r.Intn(len(v)+1)]...)
		} else {
			body = make([]byte, r.Intn(40))
			r.Read(body)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		n.handle(ctx, uint8(r.Intn(8)), body)
		cancel()
	}
	// A bad read mode is refused with a clear error.
	if status, _, out := n.handle(context.Background(), ctlapi.OpRead, []byte{9, ctlapi.QueryWiring}); status != ctlapi.StatusBadRequest {
		t.Fatalf("bad mode: status %d %s", status, out)
	}
	// Garbage on the socket closes that connection only.
	c, err := net.Dial("tcp", n.Addr())
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("GET / HTTP/1.1\r\n\r\n"))
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("garbage connection not closed: %v", err)
	}
	c.Close()
	// An oversized request header is refused before allocation.
	c, _ = net.Dial("tcp", n.Addr())
	c.Write(wire.AppendHeader(nil, wire.Header{Version: wire.Current, Type: wire.TypeCtlRequest, Length: ctlapi.RequestFrameMax + 1}))
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("oversized request not refused: %v", err)
	}
	c.Close()
	// The node still serves.
	cl := ctlclient.NewClient([]string{n.Addr()})
	defer cl.Close()
	if err := cl.DeclareQueue(ctxT(t, 5*time.Second), "still-alive", ctlapi.QueueOptions{}); err != nil {
		t.Fatal(err)
	}
}

func TestClientFollowsRedirects(t *testing.T) {
	c := newTestCluster(t, 3, nil)
	leader := c.leader()
	var follower *Node
	for _, n := range c.nodes {
		if n != leader {
			follower = n
		}
	}
	// The client only knows a follower; it must find the leader.
	cl := ctlclient.NewClient([]string{follower.Addr()})
	defer cl.Close()
	if err := cl.DeclareExchange(ctxT(t, 10*time.Second), "x", "fanout", false); err != nil {
		t.Fatal(err)
	}
	if cl.Leader() != leader.Addr() {
		t.Fatalf("client learned leader %q, want %q", cl.Leader(), leader.Addr())
	}
	// Direct calls on a follower say who leads.
	_, err := follower.Propose(ctxT(t, time.Second), &ctlapi.DeclareQueue{Name: "q"})
	var nl *ctlapi.NotLeaderError
	if !errors.As(err, &nl) || nl.Leader != leader.Addr() {
		t.Fatalf("follower propose: %v", err)
	}
	if err := follower.Read(ctxT(t, time.Second), ctlapi.ReadUnsafe, func(*State) {}); !errors.As(err, &nl) {
		t.Fatalf("follower unsafe read: %v", err)
	}
	if _, err := cl.GetSyncStateSet(ctxT(t, 5*time.Second), 0); err == nil {
		t.Fatal("group 0 exists before the cluster config")
	}
}

// TestPipelinedReadsOverSocket writes many reads to one connection in one
// burst, more than one batch and more than the connection's inflight bound,
// mixing modes and a malformed read: every request gets its own answer,
// matched by id, and each consistent read sees the write made before it.
func TestPipelinedReadsOverSocket(t *testing.T) {
	n, err := StartSingle(t.TempDir(), "127.0.0.1:0", quietLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer n.Stop()
	cl := ctlclient.NewClient([]string{n.Addr()})
	defer cl.Close()
	if err := cl.SetAttribute(ctxT(t, 5*time.Second), "k", "v1"); err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", n.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const requests = connInflightMax + connReadBatchMax + 100
	const malformed = 777
	var burst []byte
	for i := uint64(1); i <= requests; i++ {
		mode := []ctlapi.ReadMode{ctlapi.ReadConsistent, ctlapi.ReadFollower, ctlapi.ReadUnsafe}[i%3]
		body := wire.AppendStr([]byte{uint8(mode), ctlapi.QueryAttribute}, "k")
		if i == malformed {
			body = body[:len(body)-1]
		}
		burst = wire.AppendCtlRequest(burst, wire.CtlRequest{ID: i, Op: ctlapi.OpRead, Body: body})
	}
	c.SetDeadline(time.Now().Add(20 * time.Second))
	go c.Write(burst) // the server answers while the burst still arrives
	seen := map[uint64]bool{}
	var hdr [wire.HeaderSize]byte
	for len(seen) < requests {
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			t.Fatalf("after %d answers: %v", len(seen), err)
		}
		h, err := wire.ReadHeader(hdr[:], peerFrameMax)
		if err != nil {
			t.Fatal(err)
		}
		body := make([]byte, h.Length)
		if _, err := io.ReadFull(c, body); err != nil {
			t.Fatal(err)
		}
		resp, err := wire.DecodeCtlResponse(body)
		if err != nil {
			t.Fatal(err)
		}
		if resp.ID == 0 || resp.ID > requests || seen[resp.ID] {
			t.Fatalf("answer with unexpected id %d", resp.ID)
		}
		seen[resp.ID] = true
		if resp.ID == malformed {
			if resp.Status != ctlapi.StatusBadRequest {
				t.Fatalf("malformed read: status %d", resp.Status)
			}
			continue
		}
		if resp.Status != ctlapi.StatusOK {
			t.Fatalf("read %d: status %d %s", resp.ID, resp.Status, resp.Body)
		}
		r := wire.NewReader(resp.Body)
		ok, v := r.Bool(), ctlapi.ReadString(r)
		if err := r.Done(); err != nil || !ok || v != "v1" {
			t.Fatalf("read %d: %q %v %v", resp.ID, v, ok, err)
		}
	}
}

// TestReadIndexSealsBeforeAnswering: a batch that readers may join must be
// closed to them before its index is taken, on the ReadIndex path and on
// the lease path alike, or a late joiner could miss a write.
func TestReadIndexSealsBeforeAnswering(t *testing.T) {
	for _, lease := range []bool{false, true} {
		c := newTestCluster(t, 3, func(cfg *Config) { cfg.LeaseRead = lease })
		l := c.leader()
		for i := 0; i < 20; i++ {
			var seal readSeal
			if _, err := l.readIndex(ctxT(t, 5*time.Second), false, &seal); err != nil {
				t.Fatal(err)
			}
			seal.mu.Lock()
			sealed := seal.sealed
			seal.mu.Unlock()
			if !sealed {
				t.Fatalf("lease=%v: read %d answered from an index taken while readers could still join", lease, i)
			}
		}
		c.stopAll()
	}
}

// TestStoppedWriteIsAmbiguous: a write cut short by the node stopping may
// already be in the log, so it must not be answered as safe to retry.
func TestStoppedWriteIsAmbiguous(t *testing.T) {
	n, err := StartSingle(t.TempDir(), "127.0.0.1:0", quietLogger())
	if err != nil {
		t.Fatal(err)
	}
	cl := n.LocalClient()
	if err := cl.SetAttribute(ctxT(t, 5*time.Second), "k", "v"); err != nil {
		t.Fatal(err)
	}
	n.Stop()
	status, _, out := n.handle(ctxT(t, 5*time.Second), ctlapi.OpPropose, ctlapi.EncodeEvent(nil, &ctlapi.SetAttribute{Key: "k", Value: "w"}))
	if status != ctlapi.StatusAmbiguous && status != ctlapi.StatusNotLeader {
		t.Fatalf("write on a stopped node: status %d %s, want ambiguous", status, out)
	}
	// Reads stay safe to retry.
	status, _, _ = n.handle(ctxT(t, 5*time.Second), ctlapi.OpRead, []byte{byte(ctlapi.ReadConsistent), ctlapi.QueryNextBrokerID})
	if status == ctlapi.StatusOK || status == ctlapi.StatusAmbiguous {
		t.Fatalf("read on a stopped node: status %d", status)
	}
}

// rawConn sends controller requests as they are, past every check the
// client makes, and reads their replies in order.
type rawConn struct {
	c      net.Conn
	r      *bufio.Reader
	nextID uint64
}

func dialRaw(t *testing.T, addr string) *rawConn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &rawConn{c: c, r: bufio.NewReader(c)}
}

// do sends one request and returns its reply.
func (rc *rawConn) do(ctx context.Context, op uint8, body []byte) (wire.CtlResponse, error) {
	if d, ok := ctx.Deadline(); ok {
		rc.c.SetDeadline(d)
	}
	rc.nextID++
	if _, err := rc.c.Write(wire.AppendCtlRequest(nil, wire.CtlRequest{ID: rc.nextID, Op: op, Body: body})); err != nil {
		return wire.CtlResponse{}, err
	}
	var hdr [wire.HeaderSize]byte
	if _, err := io.ReadFull(rc.r, hdr[:]); err != nil {
		return wire.CtlResponse{}, err
	}
	h, err := wire.ReadHeader(hdr[:], wire.FrameSizeMax)
	if err != nil {
		return wire.CtlResponse{}, err
	}
	frame := make([]byte, h.Length)
	if _, err := io.ReadFull(rc.r, frame); err != nil {
		return wire.CtlResponse{}, err
	}
	resp, err := wire.DecodeCtlResponse(frame)
	if err != nil {
		return wire.CtlResponse{}, err
	}
	if h.Type != wire.TypeCtlResponse || resp.ID != rc.nextID {
		return wire.CtlResponse{}, fmt.Errorf("reply of type %v with id %d to request %d", h.Type, resp.ID, rc.nextID)
	}
	return resp, nil
}
