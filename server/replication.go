package server

// The server's wiring of package replication: the replicator is built in
// Start once the shards run (initReplication), and is nil on a broker
// without replication groups; these wrappers answer for it then.

import (
	"github.com/berthmq/berth/replication"
	"github.com/berthmq/berth/replication/groups"
	"github.com/berthmq/berth/shards"
)

// initReplication connects the shards to the replication groups before
// the wiring is restored, so restored durable queues are replicated
// (replication.New).
func (s *Server) initReplication() error {
	r, err := replication.New(replication.Config{
		Broker: s.broker, Wiring: s.wiring, Lanes: s.lanes, Controller: s.brokerClient(),
		Manager: func() *groups.Manager { return s.groups.Load() },
		Self:    s.brokerID, DataDir: s.cfg.DataDir, Context: s.regCtx, ReadTimeout: wiringTimeout, Logger: s.log,
	})
	if err != nil {
		return err
	}
	s.replicator = r
	return nil
}

// placeQueue is the wiring's Config.Place: the replicator's Place once
// replication runs (initReplication sets s.replicator before the wiring
// restores its queues), else every queue is this broker's.
func (s *Server) placeQueue(name string, opts shards.QueueOptions) shards.Placement {
	if s.replicator == nil {
		return shards.Placement{}
	}
	return s.replicator.Place(name, opts)
}

// deleteAtMaster is replication.Replicator.DeleteAtMaster; done is false
// on a broker without replication groups.
func (s *Server) deleteAtMaster(name string, ifUnused, ifEmpty bool) (done bool, err error) {
	if s.replicator == nil {
		return false, nil
	}
	return s.replicator.DeleteAtMaster(name, ifUnused, ifEmpty)
}

// purgeAtMaster is deleteAtMaster for a purge.
func (s *Server) purgeAtMaster(name string) (done bool, err error) {
	if s.replicator == nil {
		return false, nil
	}
	return s.replicator.PurgeAtMaster(name)
}
