package server

import (
	"encoding/binary"
	"runtime"

	"github.com/panjf2000/gnet/v2"

	"github.com/berthmq/berth/wire"
)

// Shutdown takes no new work. Close sets s.draining, then waits until no
// loop is inside OnTraffic for a connection that has not seen it
// (quiesce). From then on OnTraffic hands every frame to refuse: a HELLO
// gets CLOSE(shutdown), and every command gets an ERROR(shutdown) saying
// it was not taken, so its outcome is known. What the shards took before
// finishes (Broker.Stop), its completions go out, and each connection then
// gets CLOSE(shutdown).
const notTakenText = "not taken: the server is shutting down"

// quiesce waits until every connection's loop has either left OnTraffic
// or will see s.draining when it next enters. OnTraffic marks cs.busy
// before it reads s.draining, and Close sets s.draining before it reads
// cs.busy, so one of them sees the other's store.
func (s *Server) quiesce() {
	s.conns.Lock()
	list := make([]*connState, 0, len(s.conns.set))
	for cs := range s.conns.set {
		list = append(list, cs)
	}
	s.conns.Unlock()
	for _, cs := range list {
		for cs.busy.Load() {
			runtime.Gosched()
		}
	}
}

// refuse answers every whole frame in buf, the inbound bytes of a
// connection while the server shuts down, and returns how many it took.
func (h *handler) refuse(cs *connState, buf []byte) (consumed int, action gnet.Action) {
	action = gnet.None
	maxFrame := h.s.cfg.FrameSizeMax
	if cs.frameMax != 0 {
		maxFrame = cs.frameMax
	}
	if cs.ss != nil && !cs.ss.PushFanRest() {
		// Parts of this fan-out are in queues already: the rest goes too,
		// if the rings take it; otherwise the message stays partly
		// routed and its outcome unknown to the client.
		cs.ss.DropFanRest()
	}
	for action == gnet.None && !cs.closing.Load() {
		hd, body, n, err := wire.Next(buf[consumed:], maxFrame)
		if err != nil || n == 0 {
			break
		}
		consumed += n
		skip := 0 // items of a stalled frame that went out already
		if cs.ss != nil {
			skip, cs.ss.Resume = cs.ss.Resume, 0
		}
		switch hd.Type {
		case wire.TypeHello:
			cs.flushRanges()
			cs.out = wire.AppendClose(cs.out, cs.versionOr(), wire.CodeShutdown, "server shutting down")
			cs.closing.Store(true)
			action = gnet.Close
		case wire.TypeClose:
			cs.flushRanges()
			cs.out = wire.AppendClose(cs.out, cs.versionOr(), wire.CodeOK, "bye")
			cs.closing.Store(true)
			action = gnet.Close
		case wire.TypeHeartbeat, wire.TypeCredit:
		case wire.TypePublish:
			var p wire.Publish
			if wire.DecodePublishSession(body, hd.Flags, cs.version, &p) != nil {
				action = cs.protocolError(wire.CodeMalformed, "PUBLISH: malformed")
				break
			}
			var m wire.PublishMessage
			for i := 0; p.Next(&m); i++ {
				if i >= skip {
					cs.fail(p.FirstID+uint64(i), wire.CodeShutdown, notTakenText)
				}
			}
		default:
			// Every other command's body starts with its command id.
			if len(body) >= 8 && cs.sess != nil && skip == 0 {
				cs.fail(binary.BigEndian.Uint64(body), wire.CodeShutdown, notTakenText)
			}
		}
	}
	h.writeOut(cs)
	return consumed, action
}
