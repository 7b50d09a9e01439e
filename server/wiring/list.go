package wiring

import (
	"slices"
	"strings"

	"github.com/berthmq/berth/shards"
)

// QueuePageMax bounds one page of QueuePage.
const QueuePageMax = 10000

// QueuePage returns, in name order, up to limit queues (at most
// QueuePageMax) whose names start with prefix and sort after after, and
// whether more follow. It reads one snapshot without locks.
//
// The queue map is a hash trie, not ordered: a page scans every queue
// and keeps the first limit+1 names it has seen, so a page costs
// O(queues x log limit) time but only O(limit) memory, and listing a
// million queues never builds one response of them all.
func (w *Wiring) QueuePage(after, prefix string, limit int) (page []*shards.Queue, more bool) {
	limit = min(max(limit, 1), QueuePageMax)
	keep := limit + 1
	byName := func(a, b *shards.Queue) int { return strings.Compare(a.Name, b.Name) }
	var cand []*shards.Queue
	bound, trimmed := "", false // once trimmed, no name past bound can be on the page
	w.Routing().queues.All(func(name string, q *shards.Queue) bool {
		if name <= after || !strings.HasPrefix(name, prefix) || (trimmed && name > bound) {
			return true
		}
		cand = append(cand, q)
		if len(cand) >= 2*keep {
			slices.SortFunc(cand, byName)
			clear(cand[keep:])
			cand = cand[:keep]
			bound, trimmed = cand[keep-1].Name, true
		}
		return true
	})
	slices.SortFunc(cand, byName)
	if len(cand) > limit {
		return cand[:limit], true
	}
	return cand, false
}

// A queueSet's form: a slice up to queueSetSliceMax queues, a pmap by
// name past it, and a slice again at queueSetSliceMin (not at the same
// size, so that a bind and an unbind in turn at the edge do not convert
// the set each time). A route copies a slice out at about 0.1 ns a queue
// and a pmap at 1.5-7 (BenchmarkQueueSetAppend), while removing a queue
// from a slice copies it: at 1,024 queues that copy is 8 KiB, and a
// route to that many queues costs the shards far more than 2-7 us.
// Variables so that tests cross them with fewer queues.
var (
	queueSetSliceMax = 1024
	queueSetSliceMin = 512
)

// queueSet is a list of distinct queues that a route takes whole: a
// fanout exchange's queues, a direct key's, a topic trie node's. It is
// persistent like the tables that hold it: with and without return a new
// set and leave s as a published snapshot sees it.
//
// While small it is a slice, which a route copies at once and a bind
// extends in place past the published length (change.go). A large one is
// a pmap by queue name (the names in one set are distinct: a snapshot
// holds one queue of a name), so that removing a queue copies a path of
// the trie, O(log n), where removing it from a slice of n copied the
// slice.
type queueSet struct {
	small []*shards.Queue
	big   *pmap[*shards.Queue] // nil while small
}

func (s queueSet) len() int {
	if s.big != nil {
		return s.big.Len()
	}
	return len(s.small)
}

func (s queueSet) contains(q *shards.Queue) bool {
	if s.big != nil {
		x, _ := s.big.Get(q.Name)
		return x == q
	}
	return slices.Contains(s.small, q)
}

// appendTo appends the set's queues to dst. It does not allocate beyond
// growing dst.
func (s queueSet) appendTo(dst []*shards.Queue) []*shards.Queue {
	if s.big != nil {
		if s.big.root != nil {
			dst = appendQueues(s.big.root, dst)
		}
		return dst
	}
	return append(dst, s.small...)
}

func appendQueues(n *hnode[*shards.Queue], dst []*shards.Queue) []*shards.Queue {
	for i := range n.entries {
		if e := &n.entries[i]; e.child != nil {
			dst = appendQueues(e.child, dst)
		} else {
			dst = append(dst, e.val)
		}
	}
	return dst
}

// with returns the set with q, which must not be in it, within the batch
// ed (nil: none; pmapEdit).
func (s queueSet) with(ed *pmapEdit, q *shards.Queue) queueSet {
	if s.big == nil {
		if len(s.small) < queueSetSliceMax {
			// In place past the published length when the array has room.
			return queueSet{small: append(s.small, q)}
		}
		keys := make([]string, 0, len(s.small)+1)
		for _, x := range s.small {
			keys = append(keys, x.Name)
		}
		m := buildPmap(append(keys, q.Name), append(slices.Clone(s.small), q))
		return queueSet{big: &m}
	}
	m := s.big.SetIn(ed, q.Name, q)
	return queueSet{big: &m}
}

// without returns the set without q, which must be in it.
func (s queueSet) without(q *shards.Queue) queueSet {
	if s.big == nil {
		i := slices.Index(s.small, q)
		if i < 0 {
			panic("wiring: removing a queue that is not in the list")
		}
		// A fresh array: s's is shared with published snapshots.
		return queueSet{small: slices.Delete(slices.Clone(s.small), i, i+1)}
	}
	if !s.contains(q) {
		panic("wiring: removing a queue that is not in the list")
	}
	m := s.big.Delete(q.Name)
	if m.Len() > queueSetSliceMin {
		return queueSet{big: &m}
	}
	small := make([]*shards.Queue, 0, m.Len())
	if m.root != nil {
		small = appendQueues(m.root, small)
	}
	return queueSet{small: small}
}
