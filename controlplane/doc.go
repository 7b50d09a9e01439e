// Package controlplane is Berth's controller: a Raft group of 1, 3 or 5
// members (go.etcd.io/raft/v3 with PreVote and CheckQuorum) whose log, hard
// state and snapshots live in pebble, talking over TCP with the wire
// package's peer frames. It holds brokers, broker ids, replication groups
// (master, epoch, SyncStateSet), wiring, the cluster configuration and, in
// active-passive mode, the primary broker (primary.go).
//
// # Using it
//
// Single node (what berthd runs in-process):
//
//	n, err := controlplane.StartSingle(dir, "127.0.0.1:7402", logger)
//	defer n.Stop()
//	cl := n.LocalClient()               // a *ctlclient.Client; no TCP
//	err = cl.DeclareQueue(ctx, "q", ctlapi.QueueOptions{Durable: true})
//
// A cluster member: controlplane.Start(controlplane.Config{ID, Peers, Dir, ...}).
// Remote callers (brokers, berthctl) use ctlclient.NewClient(addrs), which
// finds the leader, follows redirects and retries what is safe to retry.
// Client.WaitChange long-polls for the applied index to move, so a broker
// re-reads wiring and groups only when something changed.
//
// # Packages
//
// What clients need lives apart, so that they link neither raft nor pebble:
//
//   - ctlapi: the events, the records clients read (brokers, groups,
//     wiring, results), the service protocol and the errors, with their
//     encodings (the wire package's codec). No I/O.
//   - ctlclient: the Client, over TCP or in-process.
//   - this package: the raft node, its storage, transport and service, and
//     the state machine (State), which applies ctlapi events.
//
// Imports point from here to ctlclient and ctlapi, never back.
//
// # Three request paths (seed 002)
//
//   - Write events (Propose) go through the log. Proposals from any number
//     of goroutines queue (bounded) for the raft goroutine, which packs all
//     waiting proposals into a few entries per Ready; each waiter is woken
//     with its own Result when its event applies. On the service, the
//     writes of one connection that arrive together are queued as one
//     group under one lock and answered with one reply write
//     (writebatch.go).
//   - Consistent reads take a ReadIndex (raft.ReadOnlySafe, a heartbeat
//     round) or, with Config.LeaseRead, are served from the leader's lease.
//     The lease is this package's own: it starts when a ReadIndex round is
//     sent and lasts 3/4 of the minimum election timeout, because raft's
//     ReadOnlyLeaseBased let a partitioned leader serve stale reads (a
//     porcupine run caught it). All readers waiting at once share one
//     ReadIndex request; a lease is renewed in the background. On the
//     service, the reads of one connection that arrive together share one
//     request and one reply write, and later reads join that request until
//     the raft goroutine seals it to take its index (readbatch.go).
//     Follower reads get the ReadIndex from the leader
//     and wait to apply up to it, unless the follower is more than
//     Config.FollowerLagMax entries behind: then it redirects to the
//     leader.
//   - Unsafe reads are served from the leader's state as it is.
//
// # The raft goroutine's loop
//
//  1. Wait for a tick, a peer message, a proposal, a read or a transport
//     report. Step what arrived; drain all queued proposals into entries
//     and all queued readers into one ReadIndex.
//  2. For each Ready: on the leader, send messages first, apply committed
//     entries and answer ReadIndex waiters, then persist; everywhere else
//     persist first, then send, install any snapshot, apply and answer.
//     Persisting is one pebble batch with entries, hard state and snapshot,
//     synced only when raft's MustSync says so: one fsync per Ready at most.
//  3. Advance, then snapshot if SnapshotEntries entries were applied since
//     the last one: the state is encoded, compressed with zstd, stored, and
//     the log compacted but for SnapshotTrailing entries.
//
// # Determinism
//
// State.Apply reads nothing but the event and the state: no clock, no
// heartbeat table, no local config. An ElectMaster event carries the
// heartbeat snapshot (liveness and per-group log end of each candidate) it
// is decided from; apply picks the in-sync candidate with the highest log
// end under a new epoch, and only with the unclean option (event or
// cluster config) one from outside the SyncStateSet.
//
// # Failure detection
//
// Only the leader takes heartbeats. The table is split into 16 shards by
// broker id, each with its own lock and a deadline heap, so a scan pops only
// the brokers that expired. Each group a dead broker mastered (found by the
// state's master index, not a scan) gets an ElectMaster proposal, at most
// 2048 groups per event. A new leader gives every registered broker one
// timeout to heartbeat to it.
//
// # Membership
//
// Members are given at start (Config.Peers) and changed by joint consensus
// (ChangeMembership, membership.go): one ConfChangeV2 entry carrying the
// new address book; every member snapshots right after applying it, and a
// joining member (Config.Join) takes appends only once a snapshot gave it
// a configuration. Operators reach it through the service (Client.Members,
// Client.ChangeMembership; berthctl members, members add, members remove)
// and start a new member with berthd -controller-join.
//
// # Lost logs and large snapshots
//
// Raft never lowers a follower's acknowledged match. A member whose data
// directory was wiped would be probed at its old match forever while the
// leader still holds that entry; the leader notices a rejection whose hint
// lies below the match and compacts its log past it, so raft sends a
// snapshot (checkLostLog). As in any Raft, wiping a member while another is
// down can still lose acknowledged writes: the wiped member votes with an
// empty log. Raft messages over 4 MiB (snapshots) cross in TypeRaftChunk
// frames, reassembled per connection; a snapshot is bounded by the 1 GiB
// state bound.
//
// # Limits
//
// The port is open to anyone unless Config.Auth is set (berthd's
// -cluster-ca/-cluster-cert/-cluster-key or -cluster-secret-file): then
// every connection, raft peer, broker or berthctl alike, proves cluster
// membership (internal/peerauth) before its first frame is read, and
// ctlclient.NewClientAuth gives that proof. A snapshot is built and sent
// whole, in memory.
package controlplane
