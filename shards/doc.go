// Package shards is Berth's per-core data plane: queues, consumers,
// credit and delivery, and each shard's write-ahead journal. It knows
// nothing of exchanges, bindings or the controller; those live one layer
// up, in server/wiring, which creates and drops queues here and hands the
// shards a Router for dead letters.
//
// # What it owns
//
//   - Queue (queue.go): one queue's messages as a pure state machine.
//     Apply takes an Event (enqueue, acquire, release, reject, dequeue,
//     expire, purge, remove, promote) and changes the queue; NextDelivery
//     decides, without changing anything, what the queue does next
//     (promote delayed messages whose time came, expire the head, or hand
//     it to which consumer with which tag). A priority queue keeps one
//     level of ready messages per priority; a message with a deliver-at
//     time waits in the queue's delay heap until an EvPromote whose Now
//     reaches it. Neither reads a clock nor
//     does I/O: the shard passes the time in, and what leaves the queue
//     goes out through Effects. The replication work drives the same two
//     functions from a group log, and tests drive them in a simulator
//     (delivery_test.go).
//   - Shard (shard.go): one goroutine that owns a set of queues, their
//     consumers, the per-session output buffers and, with a journal, the
//     shard's journal (durable.go). Everything a shard owns is touched by
//     its goroutine only; nothing on it takes a lock shared with another
//     core.
//   - Command (command.go): what a shard is asked to do, by value through
//     its ring. Each op has its own type (Publish, Settle, ...) whose
//     fields mean one thing each; a Command is the ring's slot for any
//     of them, as small as the largest op's arguments (136 bytes).
//   - Broker (broker.go): the shards as a set. It starts and stops them,
//     creates and drops queues on them (AddQueue, DropQueue), replays the
//     journals (Recover), and answers status and metrics by asking each
//     shard (Call).
//   - The memory budget (memory.go, paging.go): each shard counts the
//     index entries and in-memory bodies of its messages against its
//     share of Config.MemoryLimit, pages bodies out above half of it (to
//     the journal's copy, or to a per-shard paging file), reads them back
//     ahead of delivery, and above the share raises the flag
//     (Shard.Throttled) that event loops read before pushing a publish.
//     Queue never sees any of it: a paged entry just has a nil Body.
//     Replicated queues page too: the group log drops the data their
//     body aliases, and a paged body is read back from the group journal
//     (memory.go tells who drops what, on which goroutine).
//   - Checkpoints (checkpoint.go): each shard writes its durable queues'
//     messages (positions, delivery counts, priorities, deliver-at
//     times, sizes, not bodies) and producer tables with its journal's
//     index, periodically and at a clean stop; Recover loads them,
//     replays only the journal's tail and leaves the bodies paged.
//   - Delayed delivery (delay.go): one heap per shard of the queues
//     holding delayed messages, by their earliest deliver-at time, and
//     one wake-up timer armed for the earliest; the 100 ms tick is its
//     fallback.
//   - Expiry (shard.go, watchHead): one heap per shard of the queues
//     whose head has a TTL, by that head's expiry time; the 100 ms tick
//     expires what came due. Nothing in the shard walks all its queues
//     on a timer, so a million idle queues cost no CPU, and an idle
//     queue is one 160-byte allocation (Queue; queueBusy and queueRare come
//     with messages and rare features) plus a slot in its shard's queueSet.
//   - Body, Session, Fanout (message.go, session.go, broker.go): a
//     message's bytes, shared by reference count; a client session as the
//     shards see it; one publish's progress over several queues. A
//     session over its cap of unwritten bytes (Session.OutMax, against
//     the OutBuffered gauge its connection's owner keeps) gets no
//     deliveries: its consumers count as without credit until the server
//     sends a Resume.
//   - Encoder (encoder.go): the bytes a shard writes to a session, in
//     the session's client protocol. A Session with no Encoder gets the
//     native wire format (NativeEncoder) by direct calls; a second
//     protocol plugs in an Encoder of its own. The shard fills one write
//     batch per session and cycle (completions, errors, then each
//     consumer's deliveries), payloads left out of the buffer as writev
//     entries, and it alone cuts a batch that would pass IovecsMax.
//
// # Goroutines
//
// Per shard: the shard goroutine (Shard.run), a ticker goroutine that
// pushes a tick for expiry, the runtime's timer callback of the shard's
// wake-up timer (it only pushes a wake-up), and, with a journal, the
// journal's writer,
// which runs fsync and reports completions through a ring. Broker hands
// AutoDeleted to a goroutine of its own, so the wiring can wait on other
// shards without holding this one.
//
// # Who may call what
//
//   - Event loops (server) call Shard.TryPush with Commands (command.go:
//     Publish, Subscribe, Cancel, Credit, Settle, Resume), and read
//     Queue fields only through the Routing snapshot's pointers, never
//     a queue's state: a loop never blocks and never takes a lock.
//   - The wiring layer and admin code call Broker methods: AddQueue,
//     AddQueues, CheckDrop, DropQueue, Purge, SessionClosed, Queues,
//     Stats, Metrics, Call. These block until the shard has run them
//     (AddQueue only until its command is in the shard's ring, ahead of
//     anything pushed later); never call them from an event loop or from
//     a shard goroutine.
//   - Shard.Push blocks while the ring is full: management goroutines
//     only.
//   - Queue and Consumer fields are the shard goroutine's. Other
//     goroutines read them inside Broker.Call only. A Queue's Name, shard
//     and Options never change after AddQueue and may be read anywhere.
//
// # Order of start-up
//
// New, SetHooks (the router and auto-delete hook), Start (the shard
// goroutines), AddQueue for every queue that existed before (the wiring
// layer restores them), then Recover, which replays each journal into
// those queues and drops the records of queues that are gone. The shards
// recover at once, each on its own goroutine, from their last checkpoint
// and the journal records after it.
package shards
