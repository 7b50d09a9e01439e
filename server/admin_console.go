package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"sort"
	"time"

	"github.com/berthmq/berth/internal/version"
	"github.com/berthmq/berth/server/console"
	"github.com/berthmq/berth/server/wiring"
	"github.com/berthmq/berth/shards"
	"github.com/berthmq/berth/wire"
)

// The web console and the admin JSON it needs beyond /v1/status and
// /v1/queues:
//
//	GET  /ui/                the console (embedded files, server/console)
//	GET  /v1/info            version, Go version, process start and uptime
//	GET  /v1/queues/stats    every queue's gauges and counters, and the shards' totals
//	GET  /v1/connections     client connections: address, session, consumers
//	POST /v1/queues/declare  {"name": ..., "durable": ..., limits}
//	POST /v1/queues/purge    {"name": ...}
//	POST /v1/queues/delete   {"name": ..., "if_unused": ..., "if_empty": ...}
//
// The POSTs call the wiring methods the client protocol's management
// commands call (mgmt.go), with the same arguments, so durable queues go
// through the controller the same way. They take a JSON body and require
// the header ActionHeader: a page of another origin cannot send that
// header without a CORS preflight, which the admin HTTP never grants, so
// a browser will not send a cross-site mutation on an operator's behalf.

// ActionHeader must be present (any non-empty value) on the console's
// POST actions.
const ActionHeader = "X-Berth-Action"

// actionBodyMax bounds an action's JSON body.
const actionBodyMax = 64 << 10

// processStarted is when this process loaded the server package: the
// uptime /v1/info reports.
var processStarted = time.Now()

// mountConsole adds the console and its endpoints to the admin mux. A
// controller-only node serves the console and /v1/info; the queue and
// connection endpoints exist on brokers only.
func (s *Server) mountConsole(mux *http.ServeMux) {
	mux.Handle("/ui/", http.StripPrefix("/ui", console.Handler()))
	mux.HandleFunc("/v1/info", s.serveInfo)
	if s.cfg.Role == RoleController {
		return
	}
	mux.HandleFunc("/v1/queues/stats", s.serveQueueStats)
	mux.HandleFunc("/v1/connections", s.serveConnections)
	mux.HandleFunc("/v1/queues/declare", s.serveDeclareQueue)
	mux.HandleFunc("/v1/queues/purge", s.servePurgeQueue)
	mux.HandleFunc("/v1/queues/delete", s.serveDeleteQueue)
}

// apiError writes {"error": msg} with status; code, if set, is the wire
// error code's name.
func apiError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	out := map[string]string{"error": msg}
	if code != "" {
		out["code"] = code
	}
	_ = json.NewEncoder(w).Encode(out)
}

// getOnly answers 405 to anything but GET and HEAD.
func getOnly(w http.ResponseWriter, r *http.Request) bool {
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		return true
	}
	w.Header().Set("Allow", "GET, HEAD")
	apiError(w, http.StatusMethodNotAllowed, "", r.Method+" "+r.URL.Path+": only GET is allowed here")
	return false
}

// readyBroker returns the broker and its wiring once the wiring is
// restored and every shard has recovered, or answers 503.
func (s *Server) readyBroker(w http.ResponseWriter) (*shards.Broker, *wiring.Wiring) {
	b, wr := s.boot.broker.Load(), s.boot.wiring.Load()
	if b == nil || wr == nil || !wr.Restored() || !b.Recovered() {
		apiError(w, http.StatusServiceUnavailable, "", "starting: the queues are not recovered yet")
		return nil, nil
	}
	if s.draining.Load() {
		apiError(w, http.StatusServiceUnavailable, "", "shutting down")
		return nil, nil
	}
	return b, wr
}

// buildInfo is what the binary knows of its own build (internal/version:
// stamped at build time, or read from the Go build information).
type buildInfo struct {
	Version   string `json:"version"`
	Revision  string `json:"revision,omitempty"`
	GoVersion string `json:"go"`
	Platform  string `json:"platform"`
}

func readBuildInfo() buildInfo {
	v := version.Get()
	return buildInfo{Version: v.Version, Revision: v.Commit, GoVersion: v.GoVersion, Platform: v.Platform}
}

// serveInfo is /v1/info.
func (s *Server) serveInfo(w http.ResponseWriter, r *http.Request) {
	if !getOnly(w, r) {
		return
	}
	writeJSON(w, map[string]any{
		"server":         s.cfg.ServerName,
		"role":           s.cfg.Role,
		"build":          readBuildInfo(),
		"started":        processStarted.UTC().Format(time.RFC3339),
		"uptime_seconds": int64(time.Since(processStarted).Seconds()),
	})
}

// groupMaster is group g's master as this broker's node knows it, 0 if
// not known.
func (s *Server) groupMaster(g uint32) uint32 {
	m := s.groups.Load()
	if m == nil {
		return 0
	}
	n := m.Node()
	if n == nil {
		return 0
	}
	st, err := n.Status(g)
	if err != nil {
		return 0
	}
	return st.Master
}

// queueStats is one row of /v1/queues/stats.
type queueStats struct {
	Name         string `json:"name"`
	Shard        int    `json:"shard"`
	Durable      bool   `json:"durable"`
	Ready        int    `json:"ready"`
	Unacked      int    `json:"unacked"`
	Delayed      int    `json:"delayed"`
	Depth        int    `json:"depth"`
	Consumers    int    `json:"consumers"`
	Bytes        uint64 `json:"bytes"`
	Published    uint64 `json:"published"`
	Delivered    uint64 `json:"delivered"`
	Accepted     uint64 `json:"accepted"`
	DeadLettered uint64 `json:"dead_lettered"`
	Expired      uint64 `json:"expired"`
	// Owner is the broker that hands a replicated queue's messages out
	// (its group's master unless an own event moved it; shards/own.go);
	// absent for a queue on this broker alone or an unknown master.
	Owner uint32 `json:"owner,omitempty"`
}

// serveQueueStats is /v1/queues/stats: one shards.Broker.Metrics round
// (every shard asked once, all at once, as a /metrics scrape does). The
// counters count from the broker's start; the console turns them into
// rates. time_ms is the server's clock when it answered.
func (s *Server) serveQueueStats(w http.ResponseWriter, r *http.Request) {
	if !getOnly(w, r) {
		return
	}
	b, wr := s.readyBroker(w)
	if b == nil {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), scrapeTimeout)
	defer cancel()
	ms, err := b.Metrics(ctx)
	if err != nil {
		apiError(w, http.StatusServiceUnavailable, "", "shards did not answer: "+err.Error())
		return
	}
	routing := wr.Routing()
	var totals shards.ShardStats
	var ready, unacked int
	var bytes uint64
	queues := []queueStats{}
	for i := range ms {
		m := &ms[i]
		totals.Published += m.Stats.Published
		totals.Delivered += m.Stats.Delivered
		totals.Accepted += m.Stats.Accepted
		totals.DeadLettered += m.Stats.DeadLettered
		for _, q := range m.Queues {
			row := queueStats{
				Name: q.Name, Shard: m.Shard, Ready: q.Ready, Unacked: q.Unacked, Delayed: q.Delayed, Depth: q.Ready + q.Unacked,
				Consumers: q.Consumers, Bytes: q.Bytes, Published: q.Published, Delivered: q.Delivered,
				Accepted: q.Accepted, DeadLettered: q.DeadLettered, Expired: q.Expired,
			}
			if rq := routing.Queue([]byte(q.Name)); rq != nil {
				row.Durable = rq.Options.Durable
			}
			if q.Replicated {
				row.Owner = q.Owner
				if row.Owner == 0 {
					row.Owner = s.groupMaster(q.Group)
				}
			}
			ready += q.Ready
			unacked += q.Unacked
			bytes += q.Bytes
			queues = append(queues, row)
		}
	}
	sort.Slice(queues, func(i, j int) bool { return queues[i].Name < queues[j].Name })
	writeJSON(w, map[string]any{
		"time_ms": time.Now().UnixMilli(),
		"queues":  queues,
		"totals": map[string]any{
			"queues": len(queues), "ready": ready, "unacked": unacked, "depth": ready + unacked, "bytes": bytes,
			"published": totals.Published, "delivered": totals.Delivered, "accepted": totals.Accepted,
			"dead_lettered": totals.DeadLettered,
		},
	})
}

// connInfo is one row of /v1/connections. Bytes in and out are not
// counted per connection, so they are not here.
type connInfo struct {
	Addr        string `json:"addr"`
	Session     uint64 `json:"session,omitempty"`
	Protocol    string `json:"protocol,omitempty"`
	Consumers   *int   `json:"consumers"` // nil: the event loop did not answer in time
	IdleMs      int64  `json:"idle_ms"`
	HeartbeatMs int64  `json:"heartbeat_ms,omitempty"`
}

// connLoopWait bounds how long /v1/connections waits for the event loops.
const connLoopWait = 2 * time.Second

// connListMax bounds the connections one /v1/connections lists (and so
// the loop callbacks it costs); total says how many there are.
const connListMax = 1000

// serveConnections is /v1/connections. A connection's consumers and
// session belong to its event loop, so they are read there: each
// connection gets an empty asynchronous write whose callback the loop
// runs, once per connection and request, never on the publish path.
// What other goroutines may read (the remote address, fixed before
// OnOpen; the atomics) is read under the connection set's lock, so no
// connection is released meanwhile.
func (s *Server) serveConnections(w http.ResponseWriter, r *http.Request) {
	if !getOnly(w, r) {
		return
	}
	if b, _ := s.readyBroker(w); b == nil {
		return
	}
	type loopAnswer struct {
		i         int
		session   uint64
		consumers int
	}
	now := time.Now().UnixNano()
	s.conns.Lock()
	list := make([]*connState, 0, min(len(s.conns.set), connListMax))
	total := len(s.conns.set)
	for cs := range s.conns.set {
		if len(list) == connListMax {
			break
		}
		list = append(list, cs)
	}
	answers := make(chan loopAnswer, len(list)) // room for every answer: a loop never blocks on it
	rows := make([]connInfo, len(list))
	asked := 0
	for i, cs := range list {
		row := &rows[i]
		if a := cs.t.RemoteAddr(); a != nil {
			row.Addr = a.String()
		}
		row.IdleMs = (now - cs.lastRecv.Load()) / int64(time.Millisecond)
		if v := cs.helloVer.Load(); v != 0 {
			row.Protocol = wire.Version(v).String()
			row.HeartbeatMs = cs.hbNs.Load() / int64(time.Millisecond)
		}
		err := cs.t.runOwned(func() {
			a := loopAnswer{i: i}
			if cs.sess != nil {
				a.session = cs.sess.ID
				a.consumers, _, _ = cs.ss.Counts()
			}
			answers <- a
		})
		if err == nil {
			asked++
		}
	}
	s.conns.Unlock()
	timeout := time.NewTimer(connLoopWait)
	defer timeout.Stop()
wait:
	for ; asked > 0; asked-- {
		select {
		case a := <-answers:
			n := a.consumers
			rows[a.i].Consumers, rows[a.i].Session = &n, a.session
		case <-timeout.C:
			break wait
		case <-r.Context().Done():
			return
		}
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].Addr < rows[j].Addr })
	writeJSON(w, map[string]any{"connections": rows, "total": total, "bytes_tracked": false})
}

// readAction checks a console action's method, guard header and content
// type, and decodes its JSON body into v (unknown fields are refused).
// On failure it has answered with a 4xx.
func readAction(w http.ResponseWriter, r *http.Request, v any) bool {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		apiError(w, http.StatusMethodNotAllowed, "", r.Method+" "+r.URL.Path+": actions take POST")
		return false
	}
	if r.Header.Get(ActionHeader) == "" {
		apiError(w, http.StatusForbidden, "", "missing header "+ActionHeader+" (any value): it guards actions against cross-site requests")
		return false
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		apiError(w, http.StatusUnsupportedMediaType, "", "the body must be JSON (Content-Type: application/json)")
		return false
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, actionBodyMax))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			apiError(w, http.StatusRequestEntityTooLarge, "", fmt.Sprintf("body larger than %d bytes", actionBodyMax))
			return false
		}
		apiError(w, http.StatusBadRequest, "", "bad JSON body: "+err.Error())
		return false
	}
	if _, err := dec.Token(); err != io.EOF {
		apiError(w, http.StatusBadRequest, "", "bad JSON body: one object expected, found more")
		return false
	}
	return true
}

// checkQueueName applies the wire protocol's limits to a name from HTTP.
func checkQueueName(w http.ResponseWriter, name string) bool {
	switch {
	case name == "":
		apiError(w, http.StatusBadRequest, wire.CodeInvalid.String(), "a queue needs a name")
	case len(name) > wire.NameLenMax:
		apiError(w, http.StatusBadRequest, wire.CodeInvalid.String(), fmt.Sprintf("queue name longer than %d bytes", wire.NameLenMax))
	default:
		return true
	}
	return false
}

// brokerError answers with the status that fits err's wire code.
func brokerError(w http.ResponseWriter, err error) {
	code := shards.CodeOf(err)
	status := http.StatusInternalServerError
	switch code {
	case wire.CodeNotFound:
		status = http.StatusNotFound
	case wire.CodePreconditionFailed:
		status = http.StatusConflict
	case wire.CodeNotAllowed:
		status = http.StatusForbidden
	case wire.CodeInvalid:
		status = http.StatusBadRequest
	case wire.CodeResourceLimit:
		status = http.StatusTooManyRequests
	case wire.CodeStore, wire.CodeShutdown:
		status = http.StatusServiceUnavailable
	}
	msg := err.Error()
	if e, ok := err.(*shards.Error); ok {
		msg = e.Text
	}
	apiError(w, status, code.String(), msg)
}

// declareRequest is the body of /v1/queues/declare: DECLARE_QUEUE's
// fields, as berthctl declare-queue offers them. Exclusive queues belong
// to a client session, so HTTP cannot declare them.
type declareRequest struct {
	Name               string `json:"name"`
	Durable            bool   `json:"durable"`
	AutoDelete         bool   `json:"auto_delete"`
	MaxLength          uint64 `json:"max_length"`
	MaxLengthBytes     uint64 `json:"max_length_bytes"`
	MessageTTLMs       uint64 `json:"message_ttl_ms"`
	MaxDeliveries      uint32 `json:"max_deliveries"`
	Overflow           string `json:"overflow"` // "reject-publish" (default) or "drop-head"
	DeadLetterExchange string `json:"dead_letter_exchange"`
	DeadLetterKey      string `json:"dead_letter_key"`
}

// serveDeclareQueue is POST /v1/queues/declare. Like DECLARE_QUEUE
// (mgmt.go), it calls Broker.DeclareQueue, not passive, with the options
// the wire command carries; an existing queue with the same options is
// not an error.
func (s *Server) serveDeclareQueue(w http.ResponseWriter, r *http.Request) {
	var req declareRequest
	if !readAction(w, r, &req) || !checkQueueName(w, req.Name) {
		return
	}
	var overflow uint8
	switch req.Overflow {
	case "", "reject-publish":
		overflow = wire.OverflowRejectPublish
	case "drop-head":
		overflow = wire.OverflowDropHead
	default:
		apiError(w, http.StatusBadRequest, wire.CodeInvalid.String(), fmt.Sprintf("overflow must be reject-publish or drop-head, got %q", req.Overflow))
		return
	}
	opts := wire.QueueOptions{
		Durable:            req.Durable,
		AutoDelete:         req.AutoDelete,
		MaxDeliveries:      req.MaxDeliveries,
		MessageTTLMs:       req.MessageTTLMs,
		MaxLength:          req.MaxLength,
		MaxLengthBytes:     req.MaxLengthBytes,
		Overflow:           overflow,
		DeadLetterExchange: req.DeadLetterExchange,
		DeadLetterKey:      req.DeadLetterKey,
	}
	if err := opts.Check(); err != nil {
		apiError(w, http.StatusBadRequest, wire.CodeInvalid.String(), err.Error())
		return
	}
	_, wr := s.readyBroker(w)
	if wr == nil {
		return
	}
	if _, err := wr.DeclareQueue(req.Name, opts, false, nil); err != nil {
		brokerError(w, err)
		return
	}
	s.log.Info("admin: queue declared", "queue", req.Name, "durable", req.Durable, "from", r.RemoteAddr)
	writeJSON(w, map[string]any{"queue": req.Name, "declared": true, "durable": req.Durable})
}

type purgeRequest struct {
	Name string `json:"name"`
}

// servePurgeQueue is POST /v1/queues/purge: Broker.Purge, as PURGE. It
// drops the ready messages; delivered, unsettled ones stay.
func (s *Server) servePurgeQueue(w http.ResponseWriter, r *http.Request) {
	var req purgeRequest
	if !readAction(w, r, &req) || !checkQueueName(w, req.Name) {
		return
	}
	_, wr := s.readyBroker(w)
	if wr == nil {
		return
	}
	if done, err := s.purgeAtMaster(req.Name); done {
		// A replicated queue mastered by another broker: purged there
		// (how many messages it dropped is not known here).
		if err != nil {
			brokerError(w, err)
			return
		}
		s.log.Info("admin: replicated queue purged at its group's master", "queue", req.Name, "from", r.RemoteAddr)
		writeJSON(w, map[string]any{"queue": req.Name, "purged": nil})
		return
	}
	n, err := wr.Purge(req.Name)
	if err != nil {
		brokerError(w, err)
		return
	}
	s.log.Info("admin: queue purged", "queue", req.Name, "messages", n, "from", r.RemoteAddr)
	writeJSON(w, map[string]any{"queue": req.Name, "purged": n})
}

type deleteRequest struct {
	Name     string `json:"name"`
	IfUnused bool   `json:"if_unused"`
	IfEmpty  bool   `json:"if_empty"`
}

// serveDeleteQueue is POST /v1/queues/delete: Broker.DeleteQueue, as
// DELETE of a queue.
func (s *Server) serveDeleteQueue(w http.ResponseWriter, r *http.Request) {
	var req deleteRequest
	if !readAction(w, r, &req) || !checkQueueName(w, req.Name) {
		return
	}
	_, wr := s.readyBroker(w)
	if wr == nil {
		return
	}
	if done, err := s.deleteAtMaster(req.Name, req.IfUnused, req.IfEmpty); done {
		// A replicated queue mastered by another broker: deleted there
		// (how many messages it dropped is not known here).
		if err != nil {
			brokerError(w, err)
			return
		}
		s.log.Info("admin: replicated queue deleted at its group's master", "queue", req.Name, "from", r.RemoteAddr)
		writeJSON(w, map[string]any{"queue": req.Name, "deleted": true})
		return
	}
	n, err := wr.DeleteQueue(req.Name, req.IfUnused, req.IfEmpty)
	if err != nil {
		brokerError(w, err)
		return
	}
	s.log.Info("admin: queue deleted", "queue", req.Name, "messages", n, "from", r.RemoteAddr)
	writeJSON(w, map[string]any{"queue": req.Name, "deleted": true, "dropped": n})
}
