package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
)

// adminBodyMax bounds what berthctl reads from one admin HTTP reply; a
// queue list this large is far past what a table is useful for.
const adminBodyMax = 64 << 20

// queueInfo mirrors the broker's /v1/queues entries.
type queueInfo struct {
	Name      string `json:"name"`
	Shard     int    `json:"shard"`
	Ready     int    `json:"ready"`
	Unacked   int    `json:"unacked"`
	Delayed   int    `json:"delayed"`
	Consumers int    `json:"consumers"`
	Durable   bool   `json:"durable"`
	Enqueued  uint64 `json:"enqueued"`
	Delivered uint64 `json:"delivered"`
	Acked     uint64 `json:"acked"`
	// Group and Master: a replicated queue's group and that group's
	// master broker id; absent for a queue on this broker alone.
	Group  *uint32 `json:"group,omitempty"`
	Master uint32  `json:"master,omitempty"`
	Owner  uint32  `json:"owner,omitempty"`
}

// ownerCell is a queue's OWNER cell: the broker that hands its messages
// out ("-" for a queue on one broker, "?" if not known).
func (q *queueInfo) ownerCell() string {
	switch {
	case q.Group == nil:
		return "-"
	case q.Owner == 0:
		return "?"
	}
	return strconv.FormatUint(uint64(q.Owner), 10)
}

// groupCells are a queue's GROUP and MASTER cells: "-" for a queue on one
// broker, "?" for a master not known.
func (q *queueInfo) groupCells() (string, string) {
	if q.Group == nil {
		return "-", "-"
	}
	master := "?"
	if q.Master != 0 {
		master = strconv.FormatUint(uint64(q.Master), 10)
	}
	return strconv.FormatUint(uint64(*q.Group), 10), master
}

// adminGet fetches path from the broker's admin HTTP and returns the body.
func adminGet(ctx context.Context, e *env, path string) ([]byte, error) {
	url := e.adminBase(e.admin) + path
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("admin: bad address %q: %w", e.admin, err)
	}
	hc, err := e.adminRequest(req)
	if err != nil {
		return nil, fmt.Errorf("admin: %w", err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("admin: GET %s: %w", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, adminBodyMax+1))
	if err != nil {
		return nil, fmt.Errorf("admin: GET %s: reading reply: %w", url, err)
	}
	if len(body) > adminBodyMax {
		return nil, fmt.Errorf("admin: GET %s: reply exceeds %d bytes", url, adminBodyMax)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("admin: GET %s: %s: %s", url, resp.Status, strings.TrimSpace(string(body[:min(len(body), 200)])))
	}
	return body, nil
}

func fetchQueues(ctx context.Context, e *env) ([]queueInfo, error) {
	body, err := adminGet(ctx, e, "/v1/queues")
	if err != nil {
		return nil, err
	}
	var qs []queueInfo
	if err := json.Unmarshal(body, &qs); err != nil {
		return nil, fmt.Errorf("admin: /v1/queues is not a queue list: %w", err)
	}
	sort.Slice(qs, func(i, j int) bool { return qs[i].Name < qs[j].Name })
	return qs, nil
}

// fetchQueuePage fetches one page of /v1/queues: up to limit queues in
// name order whose names start with prefix and sort after after, and the
// after of the next page ("" at the end).
func fetchQueuePage(ctx context.Context, e *env, after, prefix string, limit int) ([]queueInfo, string, error) {
	v := url.Values{}
	v.Set("after", after)
	v.Set("prefix", prefix)
	if limit > 0 {
		v.Set("limit", strconv.Itoa(limit))
	}
	body, err := adminGet(ctx, e, "/v1/queues?"+v.Encode())
	if err != nil {
		return nil, "", err
	}
	var page struct {
		Queues    []queueInfo `json:"queues"`
		NextAfter string      `json:"next_after"`
	}
	if err := json.Unmarshal(body, &page); err != nil {
		return nil, "", fmt.Errorf("admin: /v1/queues is not a page of queues: %w", err)
	}
	return page.Queues, page.NextAfter, nil
}

func queuesCmd(fs *flag.FlagSet) func(context.Context, *env, []string) error {
	limit := fs.Int("limit", 0, "list at most this many queues, in name order (one page; the broker caps a page at 10000)")
	prefix := fs.String("prefix", "", "list only queues whose names start with this")
	after := fs.String("after", "", "list queues whose names sort after this (the next page)")
	return func(ctx context.Context, e *env, args []string) error {
		if len(args) != 0 {
			return usageErrorf("queues takes no arguments, got %q", args)
		}
		if *limit < 0 {
			return usageErrorf("--limit must not be negative")
		}
		var qs []queueInfo
		var err error
		if *limit == 0 && *prefix == "" && *after == "" {
			qs, err = fetchQueues(ctx, e)
		} else {
			var next string
			qs, next, err = fetchQueuePage(ctx, e, *after, *prefix, *limit)
			if err == nil && next != "" {
				fmt.Fprintf(e.stderr, "more queues follow: --after %s\n", next)
			}
		}
		if err != nil {
			return err
		}
		if e.json {
			if qs == nil {
				qs = []queueInfo{}
			}
			return writeJSON(e.stdout, qs)
		}
		tw := newTable(e.stdout)
		fmt.Fprintln(tw, "NAME\tSHARD\tGROUP\tMASTER\tOWNER\tREADY\tUNACKED\tDELAYED\tCONSUMERS\tDURABLE\tENQUEUED\tDELIVERED\tACKED")
		for _, q := range qs {
			group, master := q.groupCells()
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%t\t%d\t%d\t%d\n", displayName(q.Name), q.Shard, group, master, q.ownerCell(), q.Ready, q.Unacked, q.Delayed,
				q.Consumers, q.Durable, q.Enqueued, q.Delivered, q.Acked)
		}
		return tw.Flush()
	}
}

// brokerStatus is the part of /v1/status berthctl shows as text; --json
// passes the whole document through.
type brokerStatus struct {
	Server      string            `json:"server"`
	Clients     string            `json:"clients"`
	Connections int               `json:"connections"`
	Shards      int               `json:"shards"`
	Loops       int               `json:"loops"`
	Stats       map[string]uint64 `json:"stats"`
}

func fetchBrokerStatus(ctx context.Context, e *env) (json.RawMessage, brokerStatus, error) {
	var st brokerStatus
	body, err := adminGet(ctx, e, "/v1/status")
	if err != nil {
		return nil, st, err
	}
	if err := json.Unmarshal(body, &st); err != nil {
		return nil, st, fmt.Errorf("admin: /v1/status is not a status document: %w", err)
	}
	return json.RawMessage(body), st, nil
}

func printBrokerStatus(w io.Writer, prefix string, st brokerStatus) error {
	tw := newTable(w)
	fmt.Fprintf(tw, prefix+"server\t%s\n", st.Server)
	fmt.Fprintf(tw, prefix+"client address\t%s\n", st.Clients)
	fmt.Fprintf(tw, prefix+"connections\t%d\n", st.Connections)
	fmt.Fprintf(tw, prefix+"shards\t%d\n", st.Shards)
	fmt.Fprintf(tw, prefix+"loops\t%d\n", st.Loops)
	keys := make([]string, 0, len(st.Stats))
	for k := range st.Stats {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(tw, prefix+"%s\t%d\n", strings.ToLower(k), st.Stats[k])
	}
	return tw.Flush()
}

func newTable(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("output: %w", err)
	}
	return nil
}

// displayName shows the empty name (the default exchange) visibly.
func displayName(s string) string {
	if s == "" {
		return `""`
	}
	return s
}
