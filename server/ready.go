package server

import (
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/berthmq/berth/controlplane"
	"github.com/berthmq/berth/server/wiring"
	"github.com/berthmq/berth/shards"
)

// Readiness.
//
// The admin HTTP starts first in Start, so /readyz, /metrics and
// /v1/status answer while the rest comes up, which may take long: a
// 3- or 5-member controller waits for a majority of its members, and
// journal recovery replays every segment. /readyz answers 503, naming
// each unmet condition on a line of its own, until all of these hold,
// and 200 "ready" after:
//
//   - controller (when this node runs a controller member): the member
//     knows a leader. This is checked live, so losing the leader turns a
//     ready node unready until a new one is elected.
//   - wiring (brokers): the durable wiring is restored, from the
//     controller or the local wiring file.
//   - journal (brokers): every shard has replayed its journal.
//   - clients (brokers): the client listener is bound.
//   - journal failed (brokers): no shard journal has failed on an I/O
//     error (it refuses persistent messages of its durable queues
//     since), and the group journal has not (the broker left its
//     replication groups, Node.fail). Checked live: a failure turns a
//     ready broker unready, until it is restarted with a writable disk.
//
// Start restores the wiring before it replays the journals, so an
// unrestored wiring always comes with an unfinished recovery.

// boot records what Start has brought up. The admin handlers read it, and
// only it, while Start runs: the plain fields it mirrors (ctl, broker,
// addr, brokerID) are written by Start without synchronisation.
type boot struct {
	ctl    atomic.Pointer[controlplane.Node] // set as soon as the member runs
	broker atomic.Pointer[shards.Broker]     // set before the broker starts
	wiring atomic.Pointer[wiring.Wiring]     // set before the broker starts
	// serving: the client listener is bound (s.addr is set).
	serving atomic.Bool
	// started: Start has returned this server; every field is set.
	started atomic.Bool
}

// unready lists the readiness conditions not met, as lines for /readyz;
// none means ready.
func (s *Server) unready() []string {
	var out []string
	if s.cfg.controllerEmbedded() {
		switch n := s.boot.ctl.Load(); {
		case n == nil:
			out = append(out, "controller: member not started")
		case n.Leader() == 0:
			msg := "controller: no leader known"
			if s.cfg.ControllerJoin && !slices.Contains(n.Members(), n.ID()) {
				// Only until the group has added it: a member started
				// with -controller-join keeps the flag for good, and
				// once added it lacks a leader for the reasons any
				// member does.
				msg += " (this member is joining: it learns the leader once the group adds it)"
			}
			out = append(out, msg)
		}
	}
	if s.cfg.controllerRemote() && !s.registered.Load() {
		out = append(out, "controller: this broker is not registered with the controller group at "+strings.Join(s.cfg.ControllerAddrs, ",")+" yet")
	}
	if s.cfg.Role == RoleController {
		return out
	}
	b := s.boot.broker.Load()
	if w := s.boot.wiring.Load(); w == nil || !w.Restored() {
		out = append(out, "wiring: not restored")
	}
	if b == nil || !b.Recovered() {
		done, total := 0, s.cfg.Shards
		if b != nil {
			done, total = b.ShardsRecovered(), len(b.Shards())
		}
		out = append(out, fmt.Sprintf("journal: recovery not finished (%d of %d shards recovered)", done, total))
	}
	if !s.boot.serving.Load() {
		out = append(out, "clients: listener not started")
	}
	if b != nil && b.Recovered() {
		for i, sh := range b.Shards() {
			if err := sh.JournalErr(); err != nil {
				out = append(out, fmt.Sprintf("journal: shard %d's journal failed (%v): its durable queues refuse persistent messages; restart the broker once %s is writable", i, err, s.cfg.DataDir))
			}
		}
	}
	if g := s.groups.Load(); g != nil {
		if err := g.Failed(); err != nil {
			out = append(out, fmt.Sprintf("groups: the group journal failed (%v): this broker left its replication groups and serves none of them; restart it once %s is writable", err, filepath.Join(s.cfg.DataDir, "groups")))
		}
	}
	return out
}

// Ready reports whether /readyz would answer 200.
func (s *Server) Ready() bool { return len(s.unready()) == 0 }

func (s *Server) serveReady(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	unmet := s.unready()
	if len(unmet) == 0 {
		fmt.Fprintln(w, "ready")
		return
	}
	w.WriteHeader(http.StatusServiceUnavailable)
	fmt.Fprintln(w, "not ready:")
	for _, u := range unmet {
		fmt.Fprintln(w, u)
	}
}
