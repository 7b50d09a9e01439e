package wiring

import (
	"fmt"
	"math/rand"
	"strconv"
	"testing"
	"time"

	"github.com/berthmq/berth/shards"
)

// qtableModel drives a queueTable through its internal functions with a
// chosen hash, so that a test can make names collide on as many levels as
// it likes.
type qtableModel struct {
	t    queueTable
	hash func(string) uint64
}

func (m *qtableModel) set(q *shards.Queue) {
	root, added := qtableSet(m.t.root, 0, m.hash(q.Name), q, m.hash)
	m.t.root = root
	if added {
		m.t.n++
	}
}

func (m *qtableModel) del(name string) {
	root, removed := qtableDelete(m.t.root, 0, m.hash(name), name)
	if removed {
		m.t.root, m.t.n = root, m.t.n-1
	}
}

func (m *qtableModel) get(name string) (*shards.Queue, bool) { return m.t.lookup(m.hash(name), name) }

// TestQueueTableAgainstMap runs random sets (new queues and replacements
// of a name's queue) and deletes on a queueTable and a Go map, comparing
// lookups, Len and All after the steps, keeping old versions and checking
// that later changes leave them as they were. It runs with the real hash,
// with one that keeps only 7 bits (names collide over the first levels
// and whole subtrees shrink back into their parents' slots) and with one
// that is constant (every name in the last level's collision node). After
// each run a table built at once from the survivors must answer the same
// and have the same shape as the one built step by step.
func TestQueueTableAgainstMap(t *testing.T) {
	hashes := map[string]func(string) uint64{
		"real":     hashString,
		"7 bits":   func(s string) uint64 { return hashString(s) & 0x7f },
		"constant": func(string) uint64 { return 42 << 55 },
	}
	for name, hash := range hashes {
		t.Run(name, func(t *testing.T) {
			seed := time.Now().UnixNano()
			rng := rand.New(rand.NewSource(seed))
			m := qtableModel{hash: hash}
			ref := map[string]*shards.Queue{}
			type version struct {
				t   queueTable
				ref map[string]*shards.Queue
			}
			var old []version
			keys := 3000
			if name == "constant" {
				keys = 60 // a collision node is scanned: keep it short
			}
			for step := range 20000 {
				key := "q" + strconv.Itoa(rng.Intn(keys))
				if rng.Intn(3) == 0 {
					m.del(key)
					delete(ref, key)
				} else {
					q := &shards.Queue{Name: key}
					m.set(q)
					ref[key] = q
				}
				if m.t.Len() != len(ref) {
					t.Fatalf("seed %d step %d: Len %d, want %d", seed, step, m.t.Len(), len(ref))
				}
				probe := "q" + strconv.Itoa(rng.Intn(keys))
				if got, ok := m.get(probe); got != ref[probe] || ok != (ref[probe] != nil) {
					t.Fatalf("seed %d step %d: get(%s) = %p %v, want %p", seed, step, probe, got, ok, ref[probe])
				}
				if step%2000 == 1999 {
					c := make(map[string]*shards.Queue, len(ref))
					for k, v := range ref {
						c[k] = v
					}
					old = append(old, version{m.t, c})
				}
			}
			old = append(old, version{m.t, ref})
			for i, v := range old {
				checkQueueTable(t, fmt.Sprintf("seed %d version %d", seed, i), v.t, v.ref, hash)
			}
			var qs []*shards.Queue
			for _, q := range ref {
				qs = append(qs, q)
			}
			entries := make([]hashedQueue, len(qs))
			for i, q := range qs {
				entries[i] = hashedQueue{hash(q.Name), q}
			}
			root, n := buildQnode(entries, make([]hashedQueue, len(entries)), 0)
			built := queueTable{root: root, n: n}
			checkQueueTable(t, fmt.Sprintf("seed %d built", seed), built, ref, hash)
			if a, b := qtableShape(m.t.root), qtableShape(built.root); a != b {
				t.Fatalf("seed %d: built step by step the trie is %s, built at once %s", seed, a, b)
			}
		})
	}
}

// checkQueueTable compares tbl with ref: Len, a lookup of every name (and
// of names it does not hold), and All.
func checkQueueTable(t *testing.T, what string, tbl queueTable, ref map[string]*shards.Queue, hash func(string) uint64) {
	t.Helper()
	if tbl.Len() != len(ref) {
		t.Fatalf("%s: Len %d, want %d", what, tbl.Len(), len(ref))
	}
	for k, q := range ref {
		if got, ok := tbl.lookup(hash(k), k); !ok || got != q {
			t.Fatalf("%s: %s is %p, want %p", what, k, got, q)
		}
	}
	if _, ok := tbl.lookup(hash("absent"), "absent"); ok {
		t.Fatalf("%s: finds a name never set", what)
	}
	seen := 0
	tbl.All(func(name string, q *shards.Queue) bool {
		if ref[name] != q || q.Name != name {
			t.Fatalf("%s: All yields %s -> %p, want %p", what, name, q, ref[name])
		}
		seen++
		return true
	})
	if seen != len(ref) {
		t.Fatalf("%s: All yields %d queues, want %d", what, seen, len(ref))
	}
}

// qtableShape describes the trie's nodes: per level, how many nodes and
// queues, and it checks each node's maps against its arrays.
func qtableShape(n *qnode) string {
	type count struct{ nodes, queues int }
	var levels []count
	var walk func(n *qnode, level int)
	walk = func(n *qnode, level int) {
		if n == nil {
			return
		}
		for len(levels) <= level {
			levels = append(levels, count{})
		}
		levels[level].nodes++
		levels[level].queues += len(n.queues)
		if level < hashLevels && (bitsSet(n.datamap) != len(n.queues) || bitsSet(n.nodemap) != len(n.children) || n.datamap&n.nodemap != 0) {
			panic("a node's maps disagree with its arrays")
		}
		if level > 0 && len(n.children) == 0 && len(n.queues) < 2 {
			panic("a subtree of fewer than two queues was not pulled up")
		}
		for _, c := range n.children {
			walk(c, level+1)
		}
	}
	walk(n, 0)
	return fmt.Sprint(levels)
}

func bitsSet(x uint32) int {
	n := 0
	for ; x != 0; x &= x - 1 {
		n++
	}
	return n
}

// TestQueueTableGetBytes checks the []byte lookup the publish path uses,
// and that it allocates nothing.
func TestQueueTableGetBytes(t *testing.T) {
	var tbl queueTable
	for i := range 5000 {
		q := &shards.Queue{Name: "queue-" + strconv.Itoa(i)}
		tbl = tbl.Set(q.Name, q)
	}
	key := []byte("queue-4321")
	if q, ok := tbl.GetBytes(key); !ok || q.Name != "queue-4321" {
		t.Fatalf("GetBytes(queue-4321) = %v %v", q, ok)
	}
	if _, ok := tbl.GetBytes([]byte("queue-5000")); ok {
		t.Fatal("GetBytes finds a name never set")
	}
	if n := testing.AllocsPerRun(100, func() { tbl.GetBytes(key) }); n != 0 {
		t.Fatalf("GetBytes allocates %v times", n)
	}
}

// BenchmarkQueueLookup looks queues up by a []byte name, as a publish to
// the default exchange does, in a queueTable and, for comparison, in the
// pmap it replaced.
func BenchmarkQueueLookup(b *testing.B) {
	for _, n := range []int{1_000, 100_000, 1_000_000} {
		qs := make([]*shards.Queue, n)
		keys := make([]string, n)
		names := make([][]byte, n)
		for i := range qs {
			qs[i] = &shards.Queue{Name: fmt.Sprintf("device-%07d", i)}
			keys[i] = qs[i].Name
			names[i] = []byte(qs[i].Name)
		}
		tbl := buildQueueTable(qs)
		pm := buildPmap(keys, qs)
		b.Run(fmt.Sprintf("table=queueTable/queues=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				if q, _ := tbl.GetBytes(names[i%n]); q == nil {
					b.Fatal("missing")
				}
			}
		})
		b.Run(fmt.Sprintf("table=pmap/queues=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				if q, _ := pm.GetBytes(names[i%n]); q == nil {
					b.Fatal("missing")
				}
			}
		})
	}
}
