package shards

import (
	"github.com/berthmq/berth/journal"
	"github.com/berthmq/berth/wire"
)

// Commands: what the rest of the broker asks of a shard goes through the
// shard's ring (Shard.TryPush) as a Command, by value, so that the ring
// allocates nothing per message. Each op has its own type that names
// what it carries: Publish, Subscribe, Cancel, Credit, Settle and Resume
// for the server, replEnqueue and deadLettered for the shards' own use,
// and one constructor each for the ops that carry one value (a tick, a
// call, ...). The type's Command method builds the Command; on the shard
// goroutine, Shard.handle reads it back through the same op's view
// (Command.publish, ...), so no field is read for an op that did not
// write it.

// opCode is what a Command asks a shard to do.
type opCode uint8

const (
	opPublish opCode = iota + 1
	opSubscribe
	opCancel
	opCredit
	opSettle
	// opSessionClosed: sess ended; requeue what it acquired on the
	// shard (Broker.SessionClosed).
	opSessionClosed
	// opTick: the ticker's tick, at now (expiry, deferred dead letters,
	// checkpoints).
	opTick
	// opCall: run call on the shard goroutine (CallCommand).
	opCall
	// opDeadLettered: every target of a dead letter holds it; the
	// source queue removes it (deadLettered).
	opDeadLettered
	// opResume: see Resume.
	opResume
	// opWake: the timer for the earliest delayed message fired, at now
	// (delay.go).
	opWake
	// opReplDone: a replicated publish committed (replicated.go).
	opReplDone
	// opReplEnqueue: apply a committed enqueue of a replicated queue
	// (replEnqueue).
	opReplEnqueue
	// opAddQueue: queue is the shard's from now on (Broker.AddQueue).
	opAddQueue
	// opAcquired: a replicated queue's acquires event committed
	// (acquire.go).
	opAcquired
)

// Settle kinds.
const (
	SettleAccept  uint8 = 1
	SettleRelease uint8 = 2
	SettleReject  uint8 = 3
)

// RangesInline is how many tag ranges one Settle carries; a settle with
// more is split over several, of which only the last completes.
const RangesInline = 4

// argsWords is the size of Command.args: a settle's, the largest (a word
// of kind, count and last, and two per range).
const argsWords = 1 + 2*RangesInline

// Command is one op for a shard, as it travels by value through the
// shard's ring. Build one with its op's type (Publish{...}.Command()) or
// constructor (CallCommand); the zero Command does nothing.
//
// Its fields are of two kinds. Those that several ops carry mean the same
// for each of them, and an op with no use for one leaves it zero. The
// scalars that only one op carries go in args, laid out by that op's pair
// of methods (its Command method and its view, side by side below) and
// read nowhere else: so a ring slot holds the shared fields and the
// largest op's scalars, not every op's side by side (TestCommandSize).
type Command struct {
	op opCode
	// consumerID is the session's consumer a subscribe, cancel, credit
	// or settle is for.
	consumerID uint32
	// sess is the session the command comes from or is about.
	sess *Session
	// queue is the queue the command acts on.
	queue *Queue
	// body is the message a command carries: one reference, given to
	// the shard.
	body *Body
	// fanout is shared by the publishes of one message to several
	// queues.
	fanout *Fanout
	// call is what an opCall runs.
	call func(*Shard)
	// cmdID is the client's command this is (part of), which the shard
	// completes or fails for sess (a split settle: at its last part); 0
	// for none.
	cmdID uint64
	// now is when the command was made, in unix nanoseconds, 0 for a
	// command that carries no time. The shard's clock never runs behind
	// it.
	now int64
	// args are the op's own scalars, in its view's layout.
	args [argsWords]uint64
}

// Completes reports whether the shard will complete (or fail) a client's
// command once it has run c: what counts against the session's window
// of uncompleted commands. Of a settle split over several Commands, only
// the last completes.
func (c *Command) Completes() bool {
	if c.cmdID == 0 {
		return false
	}
	if c.op == opSettle {
		_, _, last := c.settleHead()
		return last
	}
	return true
}

// Publish asks a queue's shard to enqueue a message and then complete the
// publish: once the message is enqueued, durable on a journaled queue,
// committed on a replicated one.
type Publish struct {
	Sess *Session // nil for a dead letter
	// CmdID is the publish's command id (0: nothing to complete). With
	// a Producer, it is also the producer's sequence number (dedup.go).
	CmdID uint64
	Queue *Queue
	Body  *Body // one reference, given to the shard
	// Fanout is shared by the publishes of one message to several
	// queues: the command completes once every one of them is done.
	Fanout *Fanout
	// Now is when the broker took the publish, in unix nanoseconds.
	// The message's TTL runs from it (or from its deliver-at time).
	Now      int64
	TTLNanos int64  // the message's TTL, 0 = none
	Producer uint64 // the producer id, 0 = none (dedup.go)
}

// Command builds p's Command. args: TTLNanos, Producer.
func (p Publish) Command() Command {
	c := Command{op: opPublish, sess: p.Sess, cmdID: p.CmdID, queue: p.Queue, body: p.Body, fanout: p.Fanout, now: p.Now}
	c.args[0] = uint64(p.TTLNanos)
	c.args[1] = p.Producer
	return c
}

func (c *Command) publish() Publish {
	return Publish{Sess: c.sess, CmdID: c.cmdID, Queue: c.queue, Body: c.body, Fanout: c.fanout, Now: c.now,
		TTLNanos: int64(c.args[0]), Producer: c.args[1]}
}

// Subscribe asks a queue's shard to add a consumer.
type Subscribe struct {
	Sess       *Session
	CmdID      uint64
	Queue      *Queue
	ConsumerID uint32
	Credit     uint32 // the consumer's first credit, cut to CreditMax
	AckMode    uint8  // wire.AckExplicit or wire.AckNone
	Exclusive  bool   // no other consumer on the queue, then or later
}

// Command builds sub's Command. args: Credit in bits 0-31, AckMode in
// bits 32-39, Exclusive in bit 40.
func (sub Subscribe) Command() Command {
	c := Command{op: opSubscribe, sess: sub.Sess, cmdID: sub.CmdID, queue: sub.Queue, consumerID: sub.ConsumerID}
	c.args[0] = uint64(sub.Credit) | uint64(sub.AckMode)<<32
	if sub.Exclusive {
		c.args[0] |= 1 << 40
	}
	return c
}

func (c *Command) subscribe() Subscribe {
	return Subscribe{Sess: c.sess, CmdID: c.cmdID, Queue: c.queue, ConsumerID: c.consumerID,
		Credit: uint32(c.args[0]), AckMode: uint8(c.args[0] >> 32), Exclusive: c.args[0]>>40&1 != 0}
}

// Cancel asks a consumer's shard to stop delivering to it. What it
// acquired stays acquired and can still be settled.
type Cancel struct {
	Sess       *Session
	CmdID      uint64 // 0: nothing to complete
	ConsumerID uint32
}

// Command builds cn's Command. No args.
func (cn Cancel) Command() Command {
	return Command{op: opCancel, sess: cn.Sess, cmdID: cn.CmdID, consumerID: cn.ConsumerID}
}

func (c *Command) cancel() Cancel {
	return Cancel{Sess: c.sess, CmdID: c.cmdID, ConsumerID: c.consumerID}
}

// Credit gives a consumer more credit, up to CreditMax. Nothing completes.
type Credit struct {
	Sess       *Session
	ConsumerID uint32
	Credit     uint32 // added to what the consumer holds
}

// Command builds cr's Command. args: Credit.
func (cr Credit) Command() Command {
	c := Command{op: opCredit, sess: cr.Sess, consumerID: cr.ConsumerID}
	c.args[0] = uint64(cr.Credit)
	return c
}

func (c *Command) credit() Credit {
	return Credit{Sess: c.sess, ConsumerID: c.consumerID, Credit: uint32(c.args[0])}
}

// Settle accepts, releases or rejects a consumer's deliveries by their
// tags. A settle of more than RangesInline ranges is split over several
// Settles with the same CmdID; only the Last completes it.
type Settle struct {
	Sess       *Session
	CmdID      uint64
	ConsumerID uint32
	Kind       uint8 // SettleAccept, SettleRelease or SettleReject
	// Last is the settle's last part, which completes CmdID.
	Last    bool
	NRanges uint8 // how many of Ranges this part carries
	Ranges  [RangesInline]wire.Range
}

// Command builds st's Command. args: Kind in bits 0-7 of word 0,
// NRanges in bits 8-15, Last in bit 16; range i in words 1+2i and 2+2i.
func (st Settle) Command() Command {
	c := Command{op: opSettle, sess: st.Sess, cmdID: st.CmdID, consumerID: st.ConsumerID}
	c.args[0] = uint64(st.Kind) | uint64(st.NRanges)<<8
	if st.Last {
		c.args[0] |= 1 << 16
	}
	for i, r := range st.Ranges {
		c.args[1+2*i], c.args[2+2*i] = r.First, r.Last
	}
	return c
}

func (c *Command) settle() Settle {
	st := Settle{Sess: c.sess, CmdID: c.cmdID, ConsumerID: c.consumerID}
	st.Kind, st.NRanges, st.Last = c.settleHead()
	for i := range st.Ranges {
		st.Ranges[i] = wire.Range{First: c.args[1+2*i], Last: c.args[2+2*i]}
	}
	return st
}

// settleHead reads a settle's word 0 (Settle.Command).
func (c *Command) settleHead() (kind, nRanges uint8, last bool) {
	return uint8(c.args[0]), uint8(c.args[0] >> 8), c.args[0]>>16&1 != 0
}

// Resume tells a shard that Sess's connection drained below its cap of
// unwritten bytes (Session.OutMax): its consumers' queues deliver to it
// again.
type Resume struct {
	Sess *Session
}

// Command builds r's Command. No args.
func (r Resume) Command() Command { return Command{op: opResume, sess: r.Sess} }

// CallCommand is the command that runs f on the shard goroutine it is
// pushed to (TryCall's), for whoever queues commands before they reach
// the ring.
func CallCommand(f func(*Shard)) Command { return Command{op: opCall, call: f} }

// tickCommand is the ticker's tick at now (unix nanoseconds).
func tickCommand(now int64) Command { return Command{op: opTick, now: now} }

// wakeCommand is the delay timer's wake-up at now (unix nanoseconds).
func wakeCommand(now int64) Command { return Command{op: opWake, now: now} }

// sessionClosedCommand ends sess on the shard.
func sessionClosedCommand(sess *Session) Command {
	return Command{op: opSessionClosed, sess: sess}
}

// addQueueCommand hands q to its shard.
func addQueueCommand(q *Queue) Command { return Command{op: opAddQueue, queue: q} }

// replDoneCommand completes the replicated publish waiting under tag
// (replWaits) as committed. args: tag.
func replDoneCommand(tag uint64) Command {
	c := Command{op: opReplDone}
	c.args[0] = tag
	return c
}

// acquiredCommand reports the acquires event waiting under tag
// (acqWaits) as committed. args: tag.
func acquiredCommand(tag uint64) Command {
	c := Command{op: opAcquired}
	c.args[0] = tag
	return c
}

// replDoneTag is the tag of replDoneCommand (and of acquiredCommand).
func (c *Command) replDoneTag() uint64 { return c.args[0] }

// replEnqueue is a committed enqueue of a replicated queue, for
// Shard.ApplyEnqueue (whose parameters say what each field is).
type replEnqueue struct {
	queue                 *Queue
	seq                   uint64
	body                  *Body
	expiresAt             int64
	producer, producerSeq uint64
	logPos                uint64
}

// command builds e's Command. args: seq, expiresAt, producer,
// producerSeq, logPos.
func (e replEnqueue) command() Command {
	c := Command{op: opReplEnqueue, queue: e.queue, body: e.body}
	c.args[0], c.args[1] = e.seq, uint64(e.expiresAt)
	c.args[2], c.args[3] = e.producer, e.producerSeq
	c.args[4] = e.logPos
	return c
}

func (c *Command) replEnqueue() replEnqueue {
	return replEnqueue{queue: c.queue, body: c.body, seq: c.args[0], expiresAt: int64(c.args[1]),
		producer: c.args[2], producerSeq: c.args[3], logPos: c.args[4]}
}

// deadLettered is the source message of a dead letter, which its queue
// removes once every target holds it (Shard.DeadLetter): a Fanout holds
// it until then, and opDeadLettered carries it to the queue's shard.
type deadLettered struct {
	queue *Queue
	// seq is the source message of a replicated queue, whose removal
	// the master proposes now.
	seq uint64
	// journalPos is the enqueue record of the source message of a
	// journaled queue, whose dequeue the shard journals now.
	journalPos journal.Pos
}

// command builds d's Command. args: seq, journalPos.
func (d deadLettered) command() Command {
	c := Command{op: opDeadLettered, queue: d.queue}
	c.args[0], c.args[1] = d.seq, uint64(d.journalPos)
	return c
}

func (c *Command) deadLettered() deadLettered {
	return deadLettered{queue: c.queue, seq: c.args[0], journalPos: journal.Pos(c.args[1])}
}
