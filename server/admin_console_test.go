package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/controlplane/ctlapi"
	"github.com/berthmq/berth/controlplane/ctlclient"
	"github.com/berthmq/berth/server"
)

var httpClient = &http.Client{Timeout: 10 * time.Second}

// adminCall sends a request to the admin HTTP and returns the status and
// body. A POST carries the console's action header unless noGuard.
func adminCall(t *testing.T, method, url, contentType, body string, guard bool) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if guard {
		req.Header.Set(server.ActionHeader, "test")
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// action posts a console action and checks its status.
func action(t *testing.T, admin, path string, body any, want int) map[string]any {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	code, text := adminCall(t, http.MethodPost, "http://"+admin+path, "application/json", string(b), true)
	if code != want {
		t.Fatalf("POST %s %s: %d, want %d: %s", path, b, code, want, text)
	}
	var out map[string]any
	if err := json.Unmarshal([]byte(text), &out); err != nil {
		t.Fatalf("POST %s: answer is not JSON: %v\n%s", path, err, text)
	}
	if want >= 400 && out["error"] == "" {
		t.Fatalf("POST %s: %d without a message: %s", path, code, text)
	}
	return out
}

type statsAnswer struct {
	TimeMs int64 `json:"time_ms"`
	Queues []struct {
		Name                  string
		Durable               bool
		Ready, Unacked, Depth int
		Consumers             int
		Bytes                 uint64
		Published, Delivered  uint64
		Accepted              uint64
		DeadLettered, Expired uint64 `json:"-"`
	}
	Totals struct {
		Queues, Ready, Unacked, Depth int
		Published, Delivered          uint64
		Accepted                      uint64
	}
}

func queueStats(t *testing.T, admin string) statsAnswer {
	t.Helper()
	code, text := adminCall(t, http.MethodGet, "http://"+admin+"/v1/queues/stats", "", "", false)
	if code != http.StatusOK {
		t.Fatalf("/v1/queues/stats: %d %s", code, text)
	}
	var st statsAnswer
	if err := json.Unmarshal([]byte(text), &st); err != nil {
		t.Fatalf("/v1/queues/stats: %v\n%s", err, text)
	}
	return st
}

func controllerQueues(t *testing.T, s *server.Server) map[string]ctlapi.QueueOptions {
	t.Helper()
	c := ctlclient.NewClient([]string{s.ControllerAddr()})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	w, err := c.GetWiring(ctx, ctlapi.ReadConsistent)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]ctlapi.QueueOptions{}
	for _, q := range w.Queues {
		out[q.Name] = q.Options
	}
	return out
}

// TestConsoleActions declares, purges and deletes queues over the admin
// HTTP, and checks the broker and the controller see what the client
// protocol's commands would have left: a durable declare is in the
// controller's wiring, a transient one is not, a delete takes it out.
func TestConsoleActions(t *testing.T) {
	s := startServer(t, func(c *server.Config) {
		c.AdminAddr = "127.0.0.1:0"
		c.ControllerAddr = "127.0.0.1:0"
	})
	admin := s.AdminAddr()
	ctx := ctxT(t)

	out := action(t, admin, "/v1/queues/declare", map[string]any{"name": "ledger", "durable": true, "max_length": 10, "message_ttl_ms": 1500}, http.StatusOK)
	if out["declared"] != true {
		t.Fatalf("declare answered %v", out)
	}
	action(t, admin, "/v1/queues/declare", map[string]any{"name": "scratch"}, http.StatusOK)
	// Declaring again alike is not an error; with other options it is.
	action(t, admin, "/v1/queues/declare", map[string]any{"name": "ledger", "durable": true, "max_length": 10, "message_ttl_ms": 1500}, http.StatusOK)
	out = action(t, admin, "/v1/queues/declare", map[string]any{"name": "ledger", "durable": true}, http.StatusConflict)
	if out["code"] != "precondition-failed" {
		t.Fatalf("redeclare with other options: %v", out)
	}
	out = action(t, admin, "/v1/queues/declare", map[string]any{"name": "dlq", "dead_letter_exchange": "nowhere"}, http.StatusNotFound)
	if !strings.Contains(fmt.Sprint(out["error"]), "nowhere") {
		t.Fatalf("declare with a missing dead-letter exchange: %v", out)
	}

	wq := controllerQueues(t, s)
	if o, ok := wq["ledger"]; !ok || !o.Durable || o.MaxLength != 10 || o.MessageTTLMs != 1500 {
		t.Fatalf("controller holds ledger as %+v (present %t), want durable, max-length 10, ttl 1500 ms", o, ok)
	}
	if _, ok := wq["scratch"]; ok {
		t.Fatal("a transient queue declared over HTTP is in the controller")
	}

	// The declared queue takes traffic like any other.
	c := dial(t, s)
	for i := range 7 {
		if err := c.Publish(ctx, "", "ledger", []byte(fmt.Sprint("entry ", i)), client.PublishOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	st := queueStats(t, admin)
	var found bool
	for _, q := range st.Queues {
		if q.Name == "ledger" {
			found = true
			if q.Depth != 7 || q.Ready != 7 || q.Published != 7 || !q.Durable || q.Bytes == 0 {
				t.Fatalf("ledger in /v1/queues/stats: %+v, want depth 7 ready 7 published 7 durable, some bytes", q)
			}
		}
	}
	if !found || st.Totals.Queues != 2 || st.Totals.Published != 7 || st.TimeMs == 0 {
		t.Fatalf("/v1/queues/stats: %+v", st)
	}

	// A subscribed consumer holds 2 unacked: purge drops the ready ones only.
	sub, err := c.Subscribe(ctx, "ledger", client.SubscribeOptions{Credit: 2})
	if err != nil {
		t.Fatal(err)
	}
	next(t, sub, 5*time.Second)
	next(t, sub, 5*time.Second)
	out = action(t, admin, "/v1/queues/purge", map[string]any{"name": "ledger"}, http.StatusOK)
	if out["purged"] != float64(5) {
		t.Fatalf("purge answered %v, want 5 purged", out)
	}
	for _, q := range queueStats(t, admin).Queues {
		if q.Name == "ledger" && (q.Ready != 0 || q.Unacked != 2 || q.Consumers != 1) {
			t.Fatalf("after purge: %+v, want ready 0, unacked 2, 1 consumer", q)
		}
	}
	out = action(t, admin, "/v1/queues/delete", map[string]any{"name": "ledger", "if_unused": true}, http.StatusConflict)
	if out["code"] != "precondition-failed" {
		t.Fatalf("delete if-unused of a queue with a consumer: %v", out)
	}
	out = action(t, admin, "/v1/queues/delete", map[string]any{"name": "ledger"}, http.StatusOK)
	if out["dropped"] != float64(2) {
		t.Fatalf("delete answered %v, want 2 dropped", out)
	}
	if _, ok := controllerQueues(t, s)["ledger"]; ok {
		t.Fatal("a queue deleted over HTTP is still in the controller")
	}
	for _, q := range s.Broker().Queues() {
		if q.Name == "ledger" {
			t.Fatal("the broker still lists the deleted queue")
		}
	}
	out = action(t, admin, "/v1/queues/purge", map[string]any{"name": "ledger"}, http.StatusNotFound)
	if out["code"] != "not-found" {
		t.Fatalf("purge of a deleted queue: %v", out)
	}
	action(t, admin, "/v1/queues/delete", map[string]any{"name": "ledger"}, http.StatusNotFound)
}

// TestConsoleActionsRefuseBadRequests: mutations take POST only, with the
// guard header and a JSON body of known fields; everything else gets a
// 4xx that says why, and changes nothing.
func TestConsoleActionsRefuseBadRequests(t *testing.T) {
	s := startServer(t, func(c *server.Config) { c.AdminAddr = "127.0.0.1:0" })
	admin := "http://" + s.AdminAddr()
	const js = "application/json"
	cases := []struct {
		name                string
		method, path, ctype string
		body                string
		guard               bool
		want                int
		says                string
	}{
		{"GET purge", http.MethodGet, "/v1/queues/purge?name=q", "", "", true, 405, "POST"},
		{"GET delete", http.MethodGet, "/v1/queues/delete", "", "", true, 405, "POST"},
		{"PUT declare", http.MethodPut, "/v1/queues/declare", js, `{"name":"q"}`, true, 405, "POST"},
		{"no guard header", http.MethodPost, "/v1/queues/declare", js, `{"name":"q"}`, false, 403, server.ActionHeader},
		{"form body", http.MethodPost, "/v1/queues/declare", "application/x-www-form-urlencoded", "name=q", true, 415, "JSON"},
		{"no content type", http.MethodPost, "/v1/queues/purge", "", `{"name":"q"}`, true, 415, "JSON"},
		{"broken JSON", http.MethodPost, "/v1/queues/declare", js, `{"name":`, true, 400, "bad JSON"},
		{"unknown field", http.MethodPost, "/v1/queues/declare", js, `{"name":"q","exclusive":true}`, true, 400, "exclusive"},
		{"wrong type", http.MethodPost, "/v1/queues/declare", js, `{"name":"q","max_length":-1}`, true, 400, "max_length"},
		{"two objects", http.MethodPost, "/v1/queues/purge", js, `{"name":"q"}{"name":"r"}`, true, 400, "one object"},
		{"empty name", http.MethodPost, "/v1/queues/declare", js, `{"name":""}`, true, 400, "name"},
		{"long name", http.MethodPost, "/v1/queues/declare", js, `{"name":"` + strings.Repeat("n", 256) + `"}`, true, 400, "255"},
		{"bad overflow", http.MethodPost, "/v1/queues/declare", js, `{"name":"q","overflow":"spill"}`, true, 400, "overflow"},
		{"huge body", http.MethodPost, "/v1/queues/declare", js, `{"name":"` + strings.Repeat("n", 70<<10) + `"}`, true, 413, "larger"},
		{"POST stats", http.MethodPost, "/v1/queues/stats", js, `{}`, true, 405, "GET"},
		{"POST connections", http.MethodPost, "/v1/connections", js, `{}`, true, 405, "GET"},
		{"POST console", http.MethodPost, "/ui/", js, `{}`, true, 405, "GET"},
	}
	for _, tc := range cases {
		code, body := adminCall(t, tc.method, admin+tc.path, tc.ctype, tc.body, tc.guard)
		if code != tc.want || !strings.Contains(body, tc.says) {
			t.Errorf("%s: %d %q, want %d saying %q", tc.name, code, strings.TrimSpace(body), tc.want, tc.says)
		}
	}
	if qs := s.Broker().Queues(); len(qs) != 0 {
		t.Fatalf("refused requests left queues behind: %+v", qs)
	}
}

// TestConsoleConnectionsAndFiles: /v1/connections lists each client with
// its consumers (read on its event loop), and /ui/ serves the embedded
// page with its security headers.
func TestConsoleConnectionsAndFiles(t *testing.T) {
	s := startServer(t, func(c *server.Config) { c.AdminAddr = "127.0.0.1:0" })
	admin := "http://" + s.AdminAddr()
	ctx := ctxT(t)
	dial(t, s) // a connection with no consumer
	busy := dial(t, s)
	for _, q := range []string{"a", "b"} {
		if err := busy.DeclareQueue(ctx, q, client.QueueOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := busy.Subscribe(ctx, q, client.SubscribeOptions{Credit: 1}); err != nil {
			t.Fatal(err)
		}
	}
	var conns struct {
		Connections []struct {
			Addr      string
			Session   uint64
			Protocol  string
			Consumers *int
		}
		Total        int
		BytesTracked bool `json:"bytes_tracked"`
	}
	code, body := adminCall(t, http.MethodGet, admin+"/v1/connections", "", "", false)
	if code != http.StatusOK {
		t.Fatalf("/v1/connections: %d %s", code, body)
	}
	if err := json.Unmarshal([]byte(body), &conns); err != nil {
		t.Fatal(err)
	}
	if conns.Total != 2 || len(conns.Connections) != 2 || conns.BytesTracked {
		t.Fatalf("/v1/connections: %s", body)
	}
	consumers := map[int]int{}
	sessions := map[uint64]bool{}
	for _, c := range conns.Connections {
		if c.Consumers == nil || c.Session == 0 || c.Protocol == "" || !strings.HasPrefix(c.Addr, "127.0.0.1:") {
			t.Fatalf("connection row incomplete: %s", body)
		}
		consumers[*c.Consumers]++
		sessions[c.Session] = true
	}
	if consumers[0] != 1 || consumers[2] != 1 || len(sessions) != 2 {
		t.Fatalf("want one connection with no consumer and one with 2, distinct sessions: %s", body)
	}

	resp, err := httpClient.Get(admin + "/ui/")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") ||
		!strings.Contains(resp.Header.Get("Content-Security-Policy"), "default-src 'none'") ||
		!bytes.Contains(page, []byte(`<script src="app.js"`)) {
		t.Fatalf("/ui/: %s %v\n%.200s", resp.Status, resp.Header, page)
	}
	for path, want := range map[string]int{"/ui/app.js": 200, "/ui/style.css": 200, "/ui/favicon.svg": 200, "/ui/nothing.js": 404} {
		code, _ := adminCall(t, http.MethodGet, admin+path, "", "", false)
		if code != want {
			t.Errorf("GET %s: %d, want %d", path, code, want)
		}
	}
	code, body = adminCall(t, http.MethodGet, admin+"/v1/info", "", "", false)
	if code != 200 || !strings.Contains(body, `"uptime_seconds"`) || !strings.Contains(body, `"go": "go`) {
		t.Fatalf("/v1/info: %d %s", code, body)
	}
}
