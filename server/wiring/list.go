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
