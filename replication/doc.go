// Package replication is the broker's side of the cluster data plane: the
// shards' Replicator (replicate.go), which carries the events of
// replicated queues through their groups' logs and applies what commits;
// the forwarding of publishes, deletions and purges to a group's master
// and their serving there (forward.go); the lists of durable queues kept
// out of the groups (localqueues.go); and the lanes that carry peer
// traffic to the shards (lanes.go). The groups themselves run in
// replication/groups, their state machine in replication/group and the
// events' codec in replication/event.
//
// The broker (package server) drives it in this order:
//
//  1. Once the shards run, it starts the lanes (NewLanes); they serve the
//     forwards and the proxied consumers' commands until its context
//     ends, then Wait.
//  2. Before the wiring restores its queues, it builds the Replicator
//     (New), which makes itself the shards' Replicator and reads the
//     cluster's group count. From then on the wiring places each new queue
//     with Place.
//  3. After the restore it calls RestoreDone, which writes down the local
//     queues the restore found.
//  4. It starts the groups' manager with the callbacks SetCallbacks fills
//     in; Config.Manager returns that manager from then on.
//  5. After the shards and the groups stop, it calls Close.
//
// Its methods are safe from any goroutine unless they say otherwise; the
// shards.Replicator ones follow that interface's rules (on the shard
// goroutine, never blocking).
package replication
