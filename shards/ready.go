package shards

import "sync/atomic"

// startup records how far Start and Recover have come, for readiness
// checks that run while they are still at work.
type startup struct {
	shardsRecovered atomic.Int32 // shards whose journal replay has finished
	recovered       atomic.Bool  // every shard's journal replay has finished
}

// Recovered reports whether Recover has replayed every shard's journal. A
// broker without a journal reports true once Start has run.
func (b *Broker) Recovered() bool { return b.startup.recovered.Load() }

// ShardsRecovered is how many shards have finished replaying their
// journal so far.
func (b *Broker) ShardsRecovered() int { return int(b.startup.shardsRecovered.Load()) }
