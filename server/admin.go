package server

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

type metrics struct {
	reg               *prometheus.Registry
	connections       prometheus.Gauge
	protocolErrors    prometheus.Counter
	heartbeatTimeouts prometheus.Counter
	unroutable        prometheus.Counter
	ringFull          prometheus.Counter
}

func newMetrics(s *Server) *metrics {
	m := &metrics{reg: prometheus.NewRegistry()}
	m.connections = prometheus.NewGauge(prometheus.GaugeOpts{Name: "berth_connections", Help: "Open client connections."})
	m.protocolErrors = prometheus.NewCounter(prometheus.CounterOpts{Name: "berth_protocol_errors_total", Help: "Connections closed for a protocol error."})
	m.heartbeatTimeouts = prometheus.NewCounter(prometheus.CounterOpts{Name: "berth_heartbeat_timeouts_total", Help: "Connections closed for missed heartbeats."})
	m.unroutable = prometheus.NewCounter(prometheus.CounterOpts{Name: "berth_unroutable_total", Help: "Published messages that matched no queue."})
	m.ringFull = prometheus.NewCounter(prometheus.CounterOpts{Name: "berth_ring_full_total", Help: "Times an event loop found a shard ring full and backed off."})
	m.reg.MustRegister(m.connections, m.protocolErrors, m.heartbeatTimeouts, m.unroutable, m.ringFull,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	b := s.broker
	stat := func(name, help string, pick func() float64) {
		m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, pick))
	}
	stat("berth_messages_published_total", "Messages enqueued.", func() float64 { return float64(b.Stats().Published) })
	stat("berth_messages_delivered_total", "Messages delivered to consumers.", func() float64 { return float64(b.Stats().Delivered) })
	stat("berth_messages_accepted_total", "Messages accepted.", func() float64 { return float64(b.Stats().Accepted) })
	stat("berth_messages_dead_lettered_total", "Messages dead-lettered or discarded.", func() float64 { return float64(b.Stats().DeadLettered) })
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "berth_queues", Help: "Declared queues."},
		func() float64 { return float64(len(b.Queues())) }))
	return m
}

func (s *Server) startAdmin() error {
	ln, err := net.Listen("tcp", s.cfg.AdminAddr)
	if err != nil {
		return fmt.Errorf("server: admin listen on %s: %w", s.cfg.AdminAddr, err)
	}
	s.adminLn = ln
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "ready") })
	mux.Handle("/metrics", promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{}))
	handlePprof(mux)
	mux.HandleFunc("/v1/queues", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, s.broker.Queues())
	})
	mux.HandleFunc("/v1/status", func(w http.ResponseWriter, r *http.Request) {
		s.conns.Lock()
		n := len(s.conns.set)
		s.conns.Unlock()
		out := map[string]any{
			"server": s.cfg.ServerName, "clients": s.addr, "connections": n,
			"shards": s.cfg.Shards, "loops": s.cfg.Loops, "stats": s.broker.Stats(),
			"broker_id": s.BrokerID(), "broker_registered": s.BrokerRegistered(),
		}
		if s.ctl != nil {
			out["controller"] = s.controllerStatus()
		}
		writeJSON(w, out)
	})
	s.admin = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.admin.Serve(ln) }()
	return nil
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
