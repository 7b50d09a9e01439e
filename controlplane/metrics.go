package controlplane

import (
	"math/bits"
	"sync/atomic"
)

// EntryBatchBuckets is the size of Metrics.EntryBatchHistogram: bucket i
// counts log entries that carried [2^i, 2^(i+1)) proposals; the last
// bucket, from 2^13 = readyProposalsMax, takes the rest.
const EntryBatchBuckets = 14

// entryBatches counts how many proposals the leader packed into each log
// entry. Only the raft goroutine writes it (drainProposals); the atomics
// let a scrape read it from any goroutine.
type entryBatches struct {
	hist      [EntryBatchBuckets]atomic.Uint64
	proposals atomic.Uint64
}

func (e *entryBatches) observe(n int) {
	b := min(max(bits.Len(uint(n))-1, 0), EntryBatchBuckets-1)
	e.hist[b].Add(1)
	e.proposals.Add(uint64(n))
}

// Metrics are a member's numbers for monitoring.
type Metrics struct {
	ID, Leader, Term, Applied uint64
	IsLeader                  bool
	// EntryBatchHistogram[i] counts the log entries this member proposed
	// as leader that carried [2^i, 2^(i+1)) proposals (events);
	// Proposals is the number of proposals they carried in all.
	EntryBatchHistogram [EntryBatchBuckets]uint64
	Proposals           uint64
}

// Metrics returns the member's numbers. Safe from any goroutine and
// cheap: it reads atomics and the applied index, nothing on disk.
func (n *Node) Metrics() Metrics {
	m := Metrics{ID: n.self, Leader: n.lead.Load(), Term: n.term.Load(), Applied: n.Applied(), IsLeader: n.isLdr.Load()}
	for i := range m.EntryBatchHistogram {
		m.EntryBatchHistogram[i] = n.batches.hist[i].Load()
	}
	m.Proposals = n.batches.proposals.Load()
	return m
}
