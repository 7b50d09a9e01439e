package shards

import "sync/atomic"

// startup records how far Broker.Start has come, for readiness checks
// that run while it is still at work.
type startup struct {
	wiringRestored  atomic.Bool  // the durable wiring is back (or there is none to restore)
	shardsRecovered atomic.Int32 // shards whose journal replay has finished
	recovered       atomic.Bool  // every shard's journal replay has finished
}

// WiringRestored reports whether Start has restored the durable wiring
// (from the wiring log or the local wiring file). A broker without a
// journal has nothing to restore: true once Start has run.
func (b *Broker) WiringRestored() bool { return b.startup.wiringRestored.Load() }

// Recovered reports whether Start has replayed every shard's journal. A
// broker without a journal reports true once Start has run. Start
// restores the wiring first, so Recovered implies WiringRestored.
func (b *Broker) Recovered() bool { return b.startup.recovered.Load() }

// ShardsRecovered is how many shards have finished replaying their
// journal so far.
func (b *Broker) ShardsRecovered() int { return int(b.startup.shardsRecovered.Load()) }
