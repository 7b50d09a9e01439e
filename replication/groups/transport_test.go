package groups

import (
	"net"
	"testing"
	"time"

	"github.com/berthmq/berth/wire"
)

// TestTransportRefusesBadInput: garbage, a message before the hello, a
// message that claims another sender, and a truncated message each end
// their connection without reaching the handler, and the transport keeps
// serving a well-behaved peer.
func TestTransportRefusesBadInput(t *testing.T) {
	got := make(chan *wire.GroupMessage, 16)
	tr, err := Listen("127.0.0.1:0", 1, func(m *wire.GroupMessage) { got <- m }, quiet())
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	good := wire.GroupMessage{Group: 3, Kind: wire.GroupAppendResp, From: 2, To: 1, Epoch: 4, OK: true, Match: 9}
	msg := wire.AppendGroupMessage(nil, &good)
	spoofed := good
	spoofed.From = 3
	cases := map[string][]byte{
		"garbage":           []byte("GET / HTTP/1.1\r\n\r\n"),
		"no hello":          msg,
		"spoofed sender":    append(wire.AppendGroupHello(nil, 2, wire.Current), wire.AppendGroupMessage(nil, &spoofed)...),
		"truncated":         append(wire.AppendGroupHello(nil, 2, wire.Current), msg[:len(msg)-3]...),
		"hello of broker 0": wire.AppendGroupHello(nil, 0, wire.Current),
		"wrong type":        append(wire.AppendGroupHello(nil, 2, wire.Current), wire.AppendRaftHello(nil, 2, "x")...),
	}
	for name, data := range cases {
		conn, err := net.Dial("tcp", tr.Addr())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Write(data); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if name == "truncated" {
			conn.(*net.TCPConn).CloseWrite()
		}
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := conn.Read(make([]byte, 1)); err == nil {
			t.Fatalf("%s: the transport answered instead of closing", name)
		} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatalf("%s: the connection stayed open", name)
		}
		conn.Close()
		select {
		case m := <-got:
			t.Fatalf("%s reached the handler: %+v", name, m)
		default:
		}
	}
	// A well-behaved peer still gets through.
	peer, err := Listen("127.0.0.1:0", 2, func(*wire.GroupMessage) {}, quiet())
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	peer.SetPeer(1, tr.Addr())
	peer.Send(&good)
	select {
	case m := <-got:
		if m.Match != 9 || m.From != 2 {
			t.Fatalf("got %+v", m)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a good message did not arrive after the bad connections")
	}
}

// TestPeerQueueBoundedInBytes: frames for a peer that reads nothing queue
// up to peerQueueBytes, not peerQueueMax frames of any size; the rest are
// dropped (the protocol resends them). QueuedBytes reports them.
func TestPeerQueueBoundedInBytes(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	held := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held <- c // accepted, never read
		}
	}()
	tr, err := Listen("127.0.0.1:0", 1, func(*wire.GroupMessage) {}, quiet())
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	tr.SetPeer(2, ln.Addr().String())
	data := make([]byte, 256<<10)
	const frames = 400 // 100 MiB
	for range frames {
		tr.Send(&wire.GroupMessage{Kind: wire.GroupAppend, From: 1, To: 2, Epoch: 1, Entries: []wire.GroupEntry{{Epoch: 1, Index: 1, Data: data}}})
	}
	p := tr.peer(2)
	if q := p.bytes.Load(); q > peerQueueBytes {
		t.Errorf("%d bytes queued for a peer that reads nothing, bound %d", q, peerQueueBytes)
	}
	// What is queued is counted against the memory budget (through
	// Node.MemoryBytes), all peers together.
	if q := tr.QueuedBytes(); q < p.bytes.Load() || q > 2*p.bytes.Load() || q < peerQueueBytes/2 {
		t.Errorf("the transport reports %d bytes queued, the peer's queue holds %d", q, p.bytes.Load())
	}
	if d := tr.Dropped.Load(); d == 0 {
		t.Errorf("no frame dropped of %d (%d MiB) for a peer that reads nothing", frames, frames/4)
	}
	select {
	case c := <-held:
		c.Close()
	default:
	}
}
