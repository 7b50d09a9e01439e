package wiring

import (
	"math/bits"
	"slices"

	"github.com/berthmq/berth/shards"
)

// queueTable is the routing's table of queues by name: a persistent hash
// array mapped trie like pmap, specialised for *shards.Queue so that it
// stores no key and no hash. The key is the queue's Name, which the queue
// holds anyway; a hash is computed again only when a change pushes a
// queue one level down. A node keeps its queues and its subtrees in two
// arrays (the layout of a compressed HAMT, "CHAMP"): 8 bytes a queue plus
// its share of the nodes, against pmap's 40-byte entries. At 1,000,000
// queues that is about 30 bytes a queue instead of 67
// (TestQueueTableBytes).
//
// As with pmap, a change copies only the nodes on the path to its key,
// and the arrays a copy does not change are shared with the original, so
// a published snapshot keeps seeing its table unchanged. Reads never
// write: any number of goroutines may read one table while another builds
// its successor. The zero value is empty.
type queueTable struct {
	root *qnode
	n    int
}

// qnode is one level of the trie. Above the last level, bit i of datamap
// says that slot i (the hash's 5 bits at this level) holds a queue, in
// queues in slot order, and bit i of nodemap that it holds a subtree, in
// children; no slot has both. A node at the last level (hashes equal over
// all 60 bits) keeps its queues unordered with both maps 0. Once a table
// holds a node, nothing changes it or its arrays.
type qnode struct {
	datamap  uint32
	nodemap  uint32
	queues   []*shards.Queue
	children []*qnode
}

// Len returns the number of queues.
func (t queueTable) Len() int { return t.n }

// Get returns the queue named name.
func (t queueTable) Get(name string) (*shards.Queue, bool) {
	return t.lookup(hashString(name), name)
}

// GetBytes returns the queue named name without allocating.
func (t queueTable) GetBytes(name []byte) (*shards.Queue, bool) {
	n := t.root
	h := hashBytes(name)
	for level := 0; n != nil; level++ {
		if level == hashLevels {
			for _, q := range n.queues {
				if q.Name == string(name) {
					return q, true
				}
			}
			return nil, false
		}
		bit := uint32(1) << (h >> (level * hashBitsPerLevel) & 31)
		if n.datamap&bit != 0 {
			if q := n.queues[bits.OnesCount32(n.datamap&(bit-1))]; q.Name == string(name) {
				return q, true
			}
			return nil, false
		}
		if n.nodemap&bit == 0 {
			return nil, false
		}
		n = n.children[bits.OnesCount32(n.nodemap&(bit-1))]
	}
	return nil, false
}

func (t queueTable) lookup(h uint64, name string) (*shards.Queue, bool) {
	n := t.root
	for level := 0; n != nil; level++ {
		if level == hashLevels {
			for _, q := range n.queues {
				if q.Name == name {
					return q, true
				}
			}
			return nil, false
		}
		bit := uint32(1) << (h >> (level * hashBitsPerLevel) & 31)
		if n.datamap&bit != 0 {
			if q := n.queues[bits.OnesCount32(n.datamap&(bit-1))]; q.Name == name {
				return q, true
			}
			return nil, false
		}
		if n.nodemap&bit == 0 {
			return nil, false
		}
		n = n.children[bits.OnesCount32(n.nodemap&(bit-1))]
	}
	return nil, false
}

// Set returns a table with q under name, which must be q.Name (the table
// keys a queue by its name); t is unchanged.
func (t queueTable) Set(name string, q *shards.Queue) queueTable {
	if name != q.Name {
		panic("wiring: a queue's table key is its name")
	}
	root, added := qtableSet(t.root, 0, hashString(name), q, hashString)
	if added {
		t.n++
	}
	t.root = root
	return t
}

// qtableSet returns a copy of n with q set (a new node for n nil), and
// whether q's name is new. h is hash(q.Name); hash is also what finds the
// slot of a queue pushed down (hashString but in tests).
func qtableSet(n *qnode, level int, h uint64, q *shards.Queue, hash func(string) uint64) (*qnode, bool) {
	if level == hashLevels {
		if n == nil {
			return &qnode{queues: []*shards.Queue{q}}, true
		}
		for i, x := range n.queues {
			if x.Name == q.Name {
				c := &qnode{queues: slices.Clone(n.queues)}
				c.queues[i] = q
				return c, false
			}
		}
		return &qnode{queues: append(slices.Clip(n.queues), q)}, true
	}
	bit := uint32(1) << (h >> (level * hashBitsPerLevel) & 31)
	if n == nil {
		return &qnode{datamap: bit, queues: []*shards.Queue{q}}, true
	}
	di := bits.OnesCount32(n.datamap & (bit - 1))
	ni := bits.OnesCount32(n.nodemap & (bit - 1))
	switch {
	case n.datamap&bit != 0:
		old := n.queues[di]
		if old.Name == q.Name {
			c := &qnode{datamap: n.datamap, nodemap: n.nodemap, queues: slices.Clone(n.queues), children: n.children}
			c.queues[di] = q
			return c, false
		}
		// Two queues in one slot: both go one level down.
		child, _ := qtableSet(nil, level+1, hash(old.Name), old, hash)
		child, _ = qtableSet(child, level+1, h, q, hash)
		return &qnode{
			datamap:  n.datamap &^ bit,
			nodemap:  n.nodemap | bit,
			queues:   deleteAt(n.queues, di),
			children: insertAt(n.children, ni, child),
		}, true
	case n.nodemap&bit != 0:
		child, added := qtableSet(n.children[ni], level+1, h, q, hash)
		c := &qnode{datamap: n.datamap, nodemap: n.nodemap, queues: n.queues, children: slices.Clone(n.children)}
		c.children[ni] = child
		return c, added
	default:
		return &qnode{datamap: n.datamap | bit, nodemap: n.nodemap, queues: insertAt(n.queues, di, q), children: n.children}, true
	}
}

// Delete returns a table without the queue named name; t is unchanged.
func (t queueTable) Delete(name string) queueTable {
	root, removed := qtableDelete(t.root, 0, hashString(name), name)
	if removed {
		t.n--
		t.root = root
	}
	return t
}

// qtableDelete returns a copy of n without name (nil when it becomes
// empty), and whether name was there. A subtree left with one queue and
// no subtree is pulled up into its parent's slot, so the trie stays as
// shallow as its names need and has one shape per set of names.
func qtableDelete(n *qnode, level int, h uint64, name string) (*qnode, bool) {
	if n == nil {
		return nil, false
	}
	if level == hashLevels {
		i := slices.IndexFunc(n.queues, func(q *shards.Queue) bool { return q.Name == name })
		if i < 0 {
			return n, false
		}
		if len(n.queues) == 1 {
			return nil, true
		}
		return &qnode{queues: deleteAt(n.queues, i)}, true
	}
	bit := uint32(1) << (h >> (level * hashBitsPerLevel) & 31)
	di := bits.OnesCount32(n.datamap & (bit - 1))
	ni := bits.OnesCount32(n.nodemap & (bit - 1))
	switch {
	case n.datamap&bit != 0:
		if n.queues[di].Name != name {
			return n, false
		}
		if n.datamap == bit && n.nodemap == 0 {
			return nil, true
		}
		return &qnode{datamap: n.datamap &^ bit, nodemap: n.nodemap, queues: deleteAt(n.queues, di), children: n.children}, true
	case n.nodemap&bit != 0:
		child, removed := qtableDelete(n.children[ni], level+1, h, name)
		if !removed {
			return n, false
		}
		switch {
		case child == nil:
			if n.nodemap == bit && n.datamap == 0 {
				return nil, true
			}
			return &qnode{datamap: n.datamap, nodemap: n.nodemap &^ bit, queues: n.queues, children: deleteAt(n.children, ni)}, true
		case child.nodemap == 0 && len(child.queues) == 1:
			// The subtree holds one queue: it moves up into this slot.
			return &qnode{
				datamap:  n.datamap | bit,
				nodemap:  n.nodemap &^ bit,
				queues:   insertAt(n.queues, di, child.queues[0]),
				children: deleteAt(n.children, ni),
			}, true
		default:
			c := &qnode{datamap: n.datamap, nodemap: n.nodemap, queues: n.queues, children: slices.Clone(n.children)}
			c.children[ni] = child
			return c, true
		}
	}
	return n, false
}

// insertAt returns a new array of s with v inserted at i; s is unchanged.
func insertAt[T any](s []T, i int, v T) []T {
	c := make([]T, len(s)+1)
	copy(c, s[:i])
	c[i] = v
	copy(c[i+1:], s[i:])
	return c
}

// deleteAt returns a new array of s without element i (nil when empty);
// s is unchanged.
func deleteAt[T any](s []T, i int) []T {
	if len(s) == 1 {
		return nil
	}
	c := make([]T, 0, len(s)-1)
	return append(append(c, s[:i]...), s[i+1:]...)
}

// All calls f for every queue and its name, in no particular order, until
// f returns false.
func (t queueTable) All(f func(name string, q *shards.Queue) bool) {
	if t.root != nil {
		qtableWalk(t.root, f)
	}
}

func qtableWalk(n *qnode, f func(string, *shards.Queue) bool) bool {
	for _, q := range n.queues {
		if !f(q.Name, q) {
			return false
		}
	}
	for _, c := range n.children {
		if !qtableWalk(c, f) {
			return false
		}
	}
	return true
}

// hashedQueue is a queue and the hash of its name, while a table is built.
type hashedQueue struct {
	h uint64
	q *shards.Queue
}

// buildQueueTable returns a table of qs, built bottom-up in O(n x levels)
// with two allocations at most per node: inserting them one by one would
// copy a path of nodes per queue and leave that much garbage. Of two
// queues with one name the last stays.
func buildQueueTable(qs []*shards.Queue) queueTable {
	entries := make([]hashedQueue, len(qs))
	for i, q := range qs {
		entries[i] = hashedQueue{hashString(q.Name), q}
	}
	root, n := buildQnode(entries, make([]hashedQueue, len(entries)), 0)
	return queueTable{root: root, n: n}
}

// buildQnode builds the node at level for entries, whose hashes agree on
// every level above; scratch, as long as entries, is where it sorts them
// (see buildNode). It returns the node (nil for none) and the number of
// distinct names under it.
func buildQnode(entries, scratch []hashedQueue, level int) (*qnode, int) {
	if len(entries) == 0 {
		return nil, 0
	}
	if level == hashLevels {
		c := &qnode{}
		for _, e := range entries {
			i := slices.IndexFunc(c.queues, func(q *shards.Queue) bool { return q.Name == e.q.Name })
			if i >= 0 {
				c.queues[i] = e.q
			} else {
				c.queues = append(c.queues, e.q)
			}
		}
		c.queues = slices.Clip(c.queues)
		return c, len(c.queues)
	}
	slot := func(e *hashedQueue) int { return int(e.h >> (level * hashBitsPerLevel) & 31) }
	// A stable counting sort by slot, so that of a name listed twice the
	// last stays last.
	var start [33]int
	for i := range entries {
		start[slot(&entries[i])+1]++
	}
	for i := 1; i < len(start); i++ {
		start[i] += start[i-1]
	}
	sorted := scratch
	for i := range entries {
		s := slot(&entries[i])
		sorted[start[s]] = entries[i]
		start[s]++
	}
	entries, scratch = sorted, entries
	c := &qnode{}
	var nq, nc int
	for i := 0; i < len(entries); {
		j := i + 1
		for j < len(entries) && slot(&entries[j]) == slot(&entries[i]) {
			j++
		}
		if j-i == 1 || allSameName(entries[i:j]) {
			nq++
		} else {
			nc++
		}
		i = j
	}
	if nq > 0 {
		c.queues = make([]*shards.Queue, 0, nq)
	}
	if nc > 0 {
		c.children = make([]*qnode, 0, nc)
	}
	total := 0
	for i := 0; i < len(entries); {
		j := i + 1
		for j < len(entries) && slot(&entries[j]) == slot(&entries[i]) {
			j++
		}
		bit := uint32(1) << slot(&entries[i])
		run := entries[i:j]
		if len(run) == 1 || allSameName(run) {
			c.datamap |= bit
			c.queues = append(c.queues, run[len(run)-1].q)
			total++
		} else {
			// The names differ, so the subtree holds two queues at least
			// and is not pulled up.
			child, n := buildQnode(run, scratch[i:j], level+1)
			c.nodemap |= bit
			c.children = append(c.children, child)
			total += n
		}
		i = j
	}
	return c, total
}

func allSameName(run []hashedQueue) bool {
	for _, e := range run[1:] {
		if e.q.Name != run[0].q.Name {
			return false
		}
	}
	return true
}
