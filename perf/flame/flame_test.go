package flame

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

const traces = `File: berthd
Type: cpu
Duration: 5s, Total samples = 120ms (2.4%)
-----------+-------------------------------------------------------
      60ms   runtime.memmove
             shards.NewBody
             server.(*handler).publish
-----------+-------------------------------------------------------
      40ms   syscall.Syscall
             server.(*handler).publish
-----------+-------------------------------------------------------
    1.5ms   ring.(*MPSC[go.shape.struct { Op int; Sess *x }]).TryPush
             shards.(*Shard).TryPush (inline)
             server.(*handler).publish
-----------+-------------------------------------------------------
      20ms   runtime.futex
`

func TestParseAndBuild(t *testing.T) {
	tr, err := ParseTraces(strings.NewReader(traces))
	if err != nil {
		t.Fatal(err)
	}
	if len(tr) != 4 {
		t.Fatalf("%d traces, want 4", len(tr))
	}
	if tr[0].Weight != 60*time.Millisecond || strings.Join(tr[0].Stack, ";") != "runtime.memmove;shards.NewBody;server.(*handler).publish" {
		t.Fatalf("trace 0 = %+v", tr[0])
	}
	if tr[2].Stack[0] != "ring.(*MPSC[...]).TryPush" {
		t.Fatalf("generic shape not shortened: %q", tr[2].Stack[0])
	}
	p := Build(tr, time.Millisecond)
	if p.Head.FunctionName != "" || len(p.Head.Children) != 2 {
		t.Fatalf("root %q with %d children, want unnamed with publish and futex", p.Head.FunctionName, len(p.Head.Children))
	}
	pub := p.Head.Children[0]
	if pub.FunctionName != "server.(*handler).publish" || len(pub.Children) != 3 {
		t.Fatalf("publish node %+v", pub)
	}
	var total int64
	var walk func(n *Node)
	ids := map[int]bool{}
	walk = func(n *Node) {
		if ids[n.ID] {
			t.Fatalf("duplicate id %d", n.ID)
		}
		ids[n.ID] = true
		total += n.HitCount
		for _, c := range n.Children {
			walk(c)
		}
	}
	walk(p.Head)
	if total != 60+40+2+20 { // 1.5ms rounds to 2
		t.Fatalf("hit counts add to %d", total)
	}
	var buf bytes.Buffer
	if err := p.Write(&buf); err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(buf.Bytes(), &m); err != nil {
		t.Fatal(err)
	}
	if _, ok := m["head"].(map[string]any)["children"]; !ok {
		t.Fatal("head has no children key")
	}
}

func TestParseRejects(t *testing.T) {
	for _, bad := range []string{
		"",
		"File: x\nType: cpu\n",
		"-----------+---\n   xyz   f\n",
		"-----------+---\n   -5ms   f\n",
		"-----------+---\n   5ms\n",
	} {
		if _, err := ParseTraces(strings.NewReader(bad)); err == nil {
			t.Errorf("accepted %q", bad)
		}
	}
}
