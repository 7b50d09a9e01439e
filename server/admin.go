package server

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/berthmq/berth/replication/groups"
	"github.com/berthmq/berth/server/wiring"
	"github.com/berthmq/berth/shards"
)

// queuePageDefault is the page size of /v1/queues when after or prefix
// asks for a page without a limit.
const queuePageDefault = 1000

type metrics struct {
	reg               *prometheus.Registry
	connections       prometheus.Gauge
	protocolErrors    prometheus.Counter
	heartbeatTimeouts prometheus.Counter
	handshakeTimeouts prometheus.Counter
	outboundTimeouts  prometheus.Counter
	outboundStalls    prometheus.Counter
	unroutable        prometheus.Counter
	ringFull          prometheus.Counter
	// The wiring sync (wiringsync.go): passes that changed something
	// or not, failed passes, and each pass's duration.
	wiringSyncs        prometheus.Counter
	wiringSyncFailures prometheus.Counter
	wiringSyncSeconds  prometheus.Histogram
	shards             *shardCollector // nil on a controller-only node
}

// newMetrics builds the registry /metrics serves. A broker exports its
// connection counters, its shards and queues (one snapshot round trip per
// shard and scrape, shardCollector) and its controller member if it runs
// one; a controller-only node its member. Both export the Go runtime and
// process collectors and berth_ready. The counters the event loops bump
// exist on either role, registered only on a broker.
func newMetrics(s *Server) *metrics {
	m := &metrics{reg: prometheus.NewRegistry()}
	m.connections = prometheus.NewGauge(prometheus.GaugeOpts{Name: "berth_connections", Help: "Open client connections."})
	m.protocolErrors = prometheus.NewCounter(prometheus.CounterOpts{Name: "berth_protocol_errors_total", Help: "Connections closed for a protocol error."})
	m.heartbeatTimeouts = prometheus.NewCounter(prometheus.CounterOpts{Name: "berth_heartbeat_timeouts_total", Help: "Connections closed for missed heartbeats."})
	m.handshakeTimeouts = prometheus.NewCounter(prometheus.CounterOpts{Name: "berth_handshake_timeouts_total", Help: "Connections closed for not logging in within the handshake timeout."})
	m.outboundTimeouts = prometheus.NewCounter(prometheus.CounterOpts{Name: "berth_outbound_timeouts_total", Help: "Connections closed for staying over their cap of unwritten bytes for the outbound timeout."})
	m.outboundStalls = prometheus.NewCounter(prometheus.CounterOpts{Name: "berth_outbound_stalls_total", Help: "Times a connection went over its cap of unwritten bytes and deliveries to it were held back."})
	m.unroutable = prometheus.NewCounter(prometheus.CounterOpts{Name: "berth_unroutable_total", Help: "Published messages that matched no queue."})
	m.ringFull = prometheus.NewCounter(prometheus.CounterOpts{Name: "berth_ring_full_total", Help: "Times an event loop found a shard ring full and backed off."})
	m.wiringSyncs = prometheus.NewCounter(prometheus.CounterOpts{Name: "berth_wiring_sync_passes_total", Help: "Passes that read the controller's wiring and brought this broker's in step with it."})
	m.wiringSyncFailures = prometheus.NewCounter(prometheus.CounterOpts{Name: "berth_wiring_sync_failures_total", Help: "Wiring sync passes that failed (the read or a shard); retried with a growing pause."})
	m.wiringSyncSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "berth_wiring_sync_seconds", Help: "Duration of each wiring sync pass, the read of the controller's wiring included.",
		Buckets: prometheus.ExponentialBuckets(0.001, 4, 8)})
	m.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "berth_ready", Help: "1 when /readyz answers 200, else 0."}, func() float64 {
			if s.Ready() {
				return 1
			}
			return 0
		}))
	if s.cfg.Role != RoleController {
		m.reg.MustRegister(m.connections, m.protocolErrors, m.heartbeatTimeouts, m.handshakeTimeouts, m.outboundTimeouts, m.outboundStalls, m.unroutable, m.ringFull,
			m.wiringSyncs, m.wiringSyncFailures, m.wiringSyncSeconds)
		m.shards = newShardCollector(s)
		m.reg.MustRegister(m.shards)
		if s.cfg.PeerAddr != "" {
			m.reg.MustRegister(newGroupCollector(s))
		}
	}
	if s.cfg.controllerEmbedded() {
		m.reg.MustRegister(newControllerCollector(s))
	}
	return m
}

// startAdmin serves the admin HTTP of either role: /healthz, /readyz,
// /metrics, /debug/pprof/, /v1/status, and on a broker /v1/queues. Start
// runs it first, so that it answers while the rest comes up.
func (s *Server) startAdmin() error {
	tlsCfg, err := s.adminTLS()
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", s.cfg.AdminAddr)
	if err != nil {
		return fmt.Errorf("server: admin listen on %s: %w", s.cfg.AdminAddr, err)
	}
	s.adminLn = ln
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", s.serveReady)
	mux.Handle("/metrics", promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/metrics/queues", s.serveQueueMetrics)
	handlePprof(mux)
	mux.HandleFunc("/v1/status", s.serveStatus)
	s.mountConsole(mux) // /ui/ and its endpoints (admin_console.go)
	if s.cfg.Role != RoleController {
		mux.HandleFunc("/v1/queues", func(w http.ResponseWriter, r *http.Request) {
			b := s.boot.broker.Load()
			if b == nil || !b.Recovered() {
				http.Error(w, "starting: the queues are not recovered yet", http.StatusServiceUnavailable)
				return
			}
			q := r.URL.Query()
			if !q.Has("after") && !q.Has("limit") && !q.Has("prefix") {
				writeJSON(w, s.withMasters(b.Queues())) // every queue, unordered, as before pagination
				return
			}
			// A page: {"queues": [...] in name order, "next_after": the
			// name to pass as after for the next page, absent at the end}.
			limit := queuePageDefault
			if v := q.Get("limit"); v != "" {
				n, err := strconv.Atoi(v)
				if err != nil || n <= 0 || n > wiring.QueuePageMax {
					http.Error(w, fmt.Sprintf("limit: want 1 to %d, got %q", wiring.QueuePageMax, v), http.StatusBadRequest)
					return
				}
				limit = n
			}
			page, more := s.boot.wiring.Load().QueuePage(q.Get("after"), q.Get("prefix"), limit)
			out := struct {
				Queues    []shards.QueueInfo `json:"queues"`
				NextAfter string             `json:"next_after,omitempty"`
			}{Queues: s.withMasters(b.QueueInfos(page))}
			if more {
				out.NextAfter = page[len(page)-1].Name
			}
			writeJSON(w, out)
		})
	}
	if s.cfg.Role != RoleController {
		mux.HandleFunc("/v1/groups", s.serveGroups)
	}
	s.admin = &http.Server{Handler: s.guardAdmin(mux), ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelDebug)}
	if tlsCfg != nil {
		ln = tls.NewListener(ln, tlsCfg)
	}
	go func() { _ = s.admin.Serve(ln) }()
	return nil
}

// serveGroups is /v1/groups: this broker's view of each replication group
// it runs (role, epoch, master, log end, commit and applied index, a
// master's SyncStateSet, and the replica set the controller placed it
// on), which the controller does not hold: a follower's lag is its
// master's commit minus its own.
func (s *Server) serveGroups(w http.ResponseWriter, r *http.Request) {
	m := s.GroupsManager()
	if m == nil {
		http.Error(w, "this broker runs no replication groups (no -peer)", http.StatusNotFound)
		return
	}
	n, view := m.Node(), m.View()
	if n == nil {
		if err := m.Failed(); err != nil {
			http.Error(w, fmt.Sprintf("the group journal failed (%v): this broker serves none of its replication groups", err), http.StatusServiceUnavailable)
			return
		}
	}
	if n == nil && view == nil {
		http.Error(w, "starting: waiting for the cluster's group count and placement", http.StatusServiceUnavailable)
		return
	}
	// A broker whose node is nil once the view is read holds no group.
	type status struct {
		groups.Status
		Replicas []uint32 `json:"replicas"` // as the controller placed the group
	}
	out := []status{}
	if n != nil {
		for _, g := range n.Groups() {
			st, err := n.Status(g)
			if err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
			var replicas []uint32
			if view != nil && int(g) < len(view.Groups) {
				replicas = view.Groups[g].Replicas
			}
			out = append(out, status{st, replicas})
		}
	}
	writeJSON(w, map[string]any{"broker_id": s.BrokerID(), "groups": out})
}

// serveStatus is /v1/status. While Start runs it shows readiness and the
// controller member only.
func (s *Server) serveStatus(w http.ResponseWriter, r *http.Request) {
	unmet := s.unready()
	out := map[string]any{"server": s.cfg.ServerName, "role": s.cfg.Role, "ready": len(unmet) == 0}
	if len(unmet) > 0 {
		out["unready"] = unmet
	}
	if s.boot.ctl.Load() != nil {
		out["controller"] = s.controllerStatus()
	}
	if s.cfg.Role == RoleController || !s.boot.started.Load() {
		writeJSON(w, out)
		return
	}
	s.conns.Lock()
	n := len(s.conns.set)
	s.conns.Unlock()
	out["clients"], out["connections"] = s.addr, n
	out["shards"], out["loops"], out["stats"] = s.cfg.Shards, s.cfg.Loops, s.broker.Stats()
	out["broker_id"], out["broker_registered"] = s.BrokerID(), s.BrokerRegistered()
	out["memory"] = s.broker.Memory()
	writeJSON(w, out)
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// handlePprof serves the runtime profiles under /debug/pprof/.
func handlePprof(mux *http.ServeMux) {
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
}

// withMasters fills in the master of each replicated queue's group, as
// this broker's group node knows it (once per group).
func (s *Server) withMasters(qs []shards.QueueInfo) []shards.QueueInfo {
	m := s.groups.Load()
	if m == nil {
		return qs
	}
	n := m.Node()
	if n == nil {
		return qs
	}
	masters := map[uint32]uint32{}
	for i := range qs {
		g := qs[i].Group
		if g == nil {
			continue
		}
		master, ok := masters[*g]
		if !ok {
			if st, err := n.Status(*g); err == nil {
				master = st.Master
			}
			masters[*g] = master
		}
		qs[i].Master = master
		if qs[i].Owner == 0 {
			qs[i].Owner = master // no own event moved it: its master owns it
		}
	}
	return qs
}
