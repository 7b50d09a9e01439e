package wiring

import (
	"math/rand"
	"strconv"
	"testing"
	"time"
)

// TestPmapAgainstMap runs random sets and deletes on a pmap and a Go map
// and compares them after each step, keeping old versions and checking
// that later changes leave them as they were. Every other batch of 2,000
// steps sets within one pmapEdit (SetIn), which changes the batch's own
// nodes in place; the versions kept at the ends of batches must not
// change.
func TestPmapAgainstMap(t *testing.T) {
	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewSource(seed))
	var m pmap[int]
	ref := map[string]int{}
	type version struct {
		m   pmap[int]
		ref map[string]int
	}
	var old []version
	var ed *pmapEdit
	for step := range 20000 {
		if step%2000 == 0 {
			ed = nil
			if step%4000 == 2000 {
				ed = &pmapEdit{}
			}
		}
		key := strconv.Itoa(rng.Intn(3000))
		if rng.Intn(3) == 0 {
			m = m.Delete(key)
			delete(ref, key)
		} else {
			m = m.SetIn(ed, key, step)
			ref[key] = step
		}
		if m.Len() != len(ref) {
			t.Fatalf("seed %d step %d: Len %d, want %d", seed, step, m.Len(), len(ref))
		}
		probe := strconv.Itoa(rng.Intn(3000))
		got, ok := m.GetBytes([]byte(probe))
		want, wantOK := ref[probe]
		if ok != wantOK || got != want {
			t.Fatalf("seed %d step %d: GetBytes(%s) = %d %v, want %d %v", seed, step, probe, got, ok, want, wantOK)
		}
		if step%2000 == 1999 {
			c := make(map[string]int, len(ref))
			for k, v := range ref {
				c[k] = v
			}
			old = append(old, version{m, c})
		}
	}
	old = append(old, version{m, ref})
	for i, v := range old {
		seen := 0
		v.m.All(func(k string, val int) bool {
			seen++
			if want, ok := v.ref[k]; !ok || want != val {
				t.Fatalf("seed %d version %d: %s = %d, want %d %v", seed, i, k, val, want, ok)
			}
			return true
		})
		if seen != len(v.ref) || v.m.Len() != len(v.ref) {
			t.Fatalf("seed %d version %d: %d keys (Len %d), want %d", seed, i, seen, v.m.Len(), len(v.ref))
		}
	}
}

// TestPmapCollisions drives the trie with a hash of few distinct values,
// so keys share every level and end in collision lists, the path a real
// 64-bit hash almost never takes.
func TestPmapCollisions(t *testing.T) {
	weak := func(k string) uint64 { return uint64(len(k)%3) << 55 } // equal below bit 55
	var root *hnode[string]
	ref := map[string]string{}
	keys := []string{"a", "bb", "ccc", "d", "ee", "fff", "g", "hh"}
	for round := range 3 {
		for i, k := range keys {
			if (i+round)%3 == 0 {
				var removed bool
				root, removed = del(root, 0, weak(k), k)
				_, had := ref[k]
				if removed != had {
					t.Fatalf("round %d: delete %s removed=%v, had=%v", round, k, removed, had)
				}
				delete(ref, k)
			} else {
				root, _ = set(root, 0, weak(k), k, k+strconv.Itoa(round), nil)
				ref[k] = k + strconv.Itoa(round)
			}
			m := pmap[string]{root: root}
			for _, p := range keys {
				got, ok := m.lookup(weak(p), p)
				if want, wantOK := ref[p]; ok != wantOK || got != want {
					t.Fatalf("round %d after %s: %s = %q %v, want %q %v", round, k, p, got, ok, want, wantOK)
				}
			}
		}
	}
	for _, k := range keys {
		root, _ = del(root, 0, weak(k), k)
	}
	if root != nil {
		t.Fatalf("empty trie keeps nodes: %+v", root)
	}
}

// TestBuildPmap builds a pmap from keys with repeats (the last value wins)
// and checks it against a Go map, then changes it and checks again.
func TestBuildPmap(t *testing.T) {
	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewSource(seed))
	for _, n := range []int{0, 1, 2, 33, 5000} {
		keys := make([]string, n)
		vals := make([]int, n)
		ref := map[string]int{}
		for i := range keys {
			keys[i] = strconv.Itoa(rng.Intn(n + 1))
			vals[i] = i
			ref[keys[i]] = i
		}
		m := buildPmap(keys, vals)
		check := func(when string) {
			t.Helper()
			if m.Len() != len(ref) {
				t.Fatalf("seed %d n %d %s: Len %d, want %d", seed, n, when, m.Len(), len(ref))
			}
			for i := range n + 2 {
				k := strconv.Itoa(i)
				got, ok := m.GetBytes([]byte(k))
				if want, wantOK := ref[k]; ok != wantOK || got != want {
					t.Fatalf("seed %d n %d %s: %s = %d %v, want %d %v", seed, n, when, k, got, ok, want, wantOK)
				}
			}
		}
		check("built")
		for i := range n / 2 {
			k := strconv.Itoa(i)
			if i%2 == 0 {
				m = m.Delete(k)
				delete(ref, k)
			} else {
				m = m.Set(k, -i)
				ref[k] = -i
			}
		}
		check("changed")
	}
}
