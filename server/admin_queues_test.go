package server_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"testing"

	"github.com/berthmq/berth/server"
)

// TestAdminQueuesPaginated declares queues through the console's action
// and lists them through /v1/queues in pages: with no parameters the
// answer is the whole list as before; with limit and prefix the pages,
// followed by next_after, hold every matching queue once, in order; a bad
// limit is refused.
func TestAdminQueuesPaginated(t *testing.T) {
	s := startServer(t, func(c *server.Config) {
		c.AdminAddr = "127.0.0.1:0"
		c.ControllerAddr = "127.0.0.1:0"
	})
	admin := s.AdminAddr()
	var want []string
	for i := range 25 {
		name := fmt.Sprintf("page-%02d", (i*7)%25)
		action(t, admin, "/v1/queues/declare", map[string]any{"name": name}, http.StatusOK)
		want = append(want, name)
	}
	action(t, admin, "/v1/queues/declare", map[string]any{"name": "other"}, http.StatusOK)
	slices.Sort(want)

	code, body := adminCall(t, http.MethodGet, "http://"+admin+"/v1/queues", "", "", false)
	var all []map[string]any
	if code != http.StatusOK || json.Unmarshal([]byte(body), &all) != nil || len(all) != 26 {
		t.Fatalf("unpaginated /v1/queues: %d, %d queues: %.200s", code, len(all), body)
	}

	var got []string
	after := ""
	for pages := 0; ; pages++ {
		if pages > 10 {
			t.Fatal("too many pages")
		}
		code, body := adminCall(t, http.MethodGet, "http://"+admin+"/v1/queues?limit=10&prefix=page-&after="+after, "", "", false)
		var page struct {
			Queues []struct {
				Name string `json:"name"`
			} `json:"queues"`
			NextAfter string `json:"next_after"`
		}
		if code != http.StatusOK || json.Unmarshal([]byte(body), &page) != nil || len(page.Queues) > 10 {
			t.Fatalf("page after %q: %d %.200s", after, code, body)
		}
		for _, q := range page.Queues {
			got = append(got, q.Name)
		}
		if page.NextAfter == "" {
			break
		}
		after = page.NextAfter
	}
	if !slices.Equal(got, want) {
		t.Fatalf("pages hold %v, want %v", got, want)
	}
	if code, _ := adminCall(t, http.MethodGet, "http://"+admin+"/v1/queues?limit=0", "", "", false); code != http.StatusBadRequest {
		t.Fatalf("limit=0 answered %d, want 400", code)
	}
}
