package ctlclient

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/berthmq/berth/controlplane/ctlapi"
	"github.com/berthmq/berth/controlplane/internal/golden"
	"github.com/berthmq/berth/wire"
)

// recordingServer answers every controller request with a bad-request
// status, so the client neither retries nor redirects, and records what
// arrived: the operation byte, then the body.
type recordingServer struct {
	ln   net.Listener
	mu   sync.Mutex
	reqs [][]byte
}

func newRecordingServer(t *testing.T) *recordingServer {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rs := &recordingServer{ln: ln}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go rs.serve(c)
		}
	}()
	return rs
}

func (rs *recordingServer) serve(c net.Conn) {
	defer c.Close()
	r := bufio.NewReader(c)
	var hdr [wire.HeaderSize]byte
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return
		}
		h, err := wire.ReadHeader(hdr[:], wire.FrameSizeMax)
		if err != nil {
			return
		}
		body := make([]byte, h.Length)
		if _, err := io.ReadFull(r, body); err != nil {
			return
		}
		req, err := wire.DecodeCtlRequest(body)
		if err != nil {
			return
		}
		rs.mu.Lock()
		rs.reqs = append(rs.reqs, append([]byte{req.Op}, req.Body...))
		rs.mu.Unlock()
		if _, err := c.Write(wire.AppendCtlResponse(nil, wire.CtlResponse{ID: req.ID, Status: 4, Body: []byte("recorded")})); err != nil {
			return
		}
	}
}

// last returns the one request recorded since the previous call.
func (rs *recordingServer) last(t *testing.T, name string) []byte {
	t.Helper()
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if len(rs.reqs) != 1 {
		t.Fatalf("%s: %d requests recorded, want 1", name, len(rs.reqs))
	}
	r := rs.reqs[0]
	rs.reqs = nil
	return r
}

// TestGoldenRequests pins the requests the client sends, which controllers
// of other builds decode: the operation byte, then the body.
func TestGoldenRequests(t *testing.T) {
	rs := newRecordingServer(t)
	cl := NewClient([]string{rs.ln.Addr().String()})
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	calls := []struct {
		name string
		call func() error
	}{
		{"propose", func() error {
			return cl.DeclareQueue(ctx, "q", ctlapi.QueueOptions{Durable: true, MessageTTLMs: 5, Overflow: wire.OverflowDropHead, DeadLetterExchange: "dlx"})
		}},
		{"heartbeat", func() error {
			return cl.Heartbeat(ctx, 7, []ctlapi.GroupLogEnd{{Group: 1, LogEnd: ctlapi.LogEnd{Epoch: 2, Index: 3}}, {Group: 4, LogEnd: ctlapi.LogEnd{Epoch: 5, Index: 1 << 40}}})
		}},
		{"elect-master", func() error { _, err := cl.ElectMaster(ctx, []uint32{3, 1, 2}, 7); return err }},
		{"elect-primary", func() error { _, err := cl.ElectPrimary(ctx, 8); return err }},
		{"wait-change", func() error { _, err := cl.WaitChange(ctx, 1<<33+9); return err }},
		{"members", func() error { _, _, err := cl.MemberList(ctx); return err }},
		{"change-members", func() error {
			return cl.ChangeMembership(ctx, map[uint64]string{5: "10.0.0.5:7402", 4: "10.0.0.4:7402"}, []uint64{2, 1})
		}},
		{"read/attribute", func() error { _, _, err := cl.GetAttribute(ctx, ctlapi.ReadConsistent, "key"); return err }},
		{"read/wiring", func() error { _, err := cl.GetWiring(ctx, ctlapi.ReadFollower); return err }},
		{"read/groups", func() error { _, _, err := cl.GetGroups(ctx, ctlapi.ReadUnsafe, 3, 1000); return err }},
		{"read/replica-info", func() error { _, err := cl.GetReplicaInfo(ctx, ctlapi.ReadConsistent, 6); return err }},
		{"read/sync-state-set", func() error { _, err := cl.GetSyncStateSet(ctx, 6); return err }},
		{"read/brokers", func() error { _, err := cl.GetBrokers(ctx, ctlapi.ReadConsistent); return err }},
		{"read/next-broker-id", func() error { _, err := cl.GetNextBrokerID(ctx, ctlapi.ReadConsistent); return err }},
		{"read/cluster-info", func() error { _, err := cl.GetClusterInfo(ctx, ctlapi.ReadConsistent); return err }},
		{"read/primary", func() error { _, err := cl.GetPrimaryInfo(ctx, ctlapi.ReadFollower); return err }},
	}
	var got []golden.Entry
	for _, c := range calls {
		if err := c.call(); !errors.Is(err, ctlapi.ErrBadRequest) {
			t.Fatalf("%s: %v, want the recording server's bad request", c.name, err)
		}
		got = append(got, golden.Entry{Name: c.name, Bytes: rs.last(t, c.name)})
	}
	golden.Check(t, "requests.golden", got)
}
