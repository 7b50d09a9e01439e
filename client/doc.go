// Package client is the Go client of the Berth message broker.
//
// A Conn is one session over TCP (see docs/PROTOCOL.md). Every method is
// safe for concurrent use. Commands are numbered and pipelined: a single
// writer goroutine coalesces whatever callers queued, from any number of
// goroutines, into one write (publishes to the same exchange share PUBLISH
// frames of up to wire.BatchMax messages), and a reader goroutine retires
// COMPLETE ranges in bulk. A Conn never has more than Window uncompleted
// commands; callers block (until their context ends) while it is full.
//
// Blocking, by method:
//   - Publish, the declares, Bind, Unbind, Delete*, Purge, Subscribe,
//     Cancel and the settle calls without "Async" wait for the server's
//     completion and return nil or an error (see Outcomes).
//   - PublishAsync and the *Async settle calls wait only for window space;
//     their done callback gets the result later.
//   - Consumer.Credit never blocks.
//   - Consumer.Next waits for a delivery.
//
// Contexts bound the waiting only: a command already sent is not taken
// back when its context ends, the server still carries it out.
//
// # Outcomes
//
// The result of a command (returned, or given to its done callback) says
// what became of it:
//   - nil: the server carried it out.
//   - an error matching ErrOutcomeUnknown (errors.Is): the server may or
//     may not have carried it out. Either its answer was not heard: the
//     connection ended first (the error also wraps ErrClosed), or the
//     context of a call that waits for the answer ended first (it also
//     wraps ctx.Err()); or the server answered that it does not know: an
//     *Error with code outcome-unknown (protocol 1.4: the replicated
//     queue's master was lost with the command in flight), store or
//     internal, which errors.As gives with the broker's text.
//   - any other *Error (errors.As): the server refused it; it was not
//     carried out. Code tells why (docs/PROTOCOL.md 1.4 says, for each
//     code, whether the command was carried out). With a server of 1.3
//     or older, unavailable may also mean that the outcome is unknown:
//     only its text tells.
//   - an error wrapping ErrClosed but not ErrOutcomeUnknown: the
//     connection had ended (or Close was called) before the command was
//     sent; it was not carried out.
//   - ctx.Err() alone: the context ended while the call waited for window
//     space; nothing was sent.
//   - ErrInvalid, ErrTooLarge, ErrNoTags, ErrCalledFromCallback: refused
//     by this side before sending.
//
// Why the connection ended is Conn.Err: a network error,
// ErrHeartbeatTimeout, ErrProtocol, or an *Error with CommandID 0 when the
// server closed the session with a code (shutdown, for instance).
//
// # Callbacks
//
// Callbacks (done functions, Consume's OnSettled, Config.ErrorHandler) run
// on the connection's reader goroutine, the one that reads every answer and
// delivery; while a callback runs, nothing else of that Conn completes.
// They must be quick. A call from a callback that would have to wait (for
// window space, for a command's completion, for a delivery, or Flush and
// Close) could only be ended by the reader that is running it, so it would
// deadlock: it returns ErrCalledFromCallback instead, and does nothing. A
// call that needs no wait, such as PublishAsync while the window has room
// or Consumer.Credit, works. To wait, hand the work to another goroutine.
//
// When a connection ends, its commands still in flight get their error
// (their callbacks run on whichever goroutine noticed the end), and then
// Conn.Done is closed: after Done, no callback of that Conn runs.
//
// Without Config.Reconnect a Conn does not reconnect. When it fails,
// pending and later calls return an error wrapping ErrClosed; messages
// acquired by its consumers and not accepted are requeued by the server,
// so an AckExplicit consumer's buffered deliveries are dropped rather than
// handed out (see Consumer.Next). To survive a broker restart, dial again
// (ServerAddrs lists the cluster's addresses), publish again what ended
// with ErrOutcomeUnknown (at-least-once: it may arrive twice), and
// subscribe again; or set Config.Reconnect.
//
// # Reconnecting
//
// With Config.Reconnect a Conn outlives its connection. When the
// connection breaks (a network error, a missed heartbeat, the server
// closing it), the Conn reports EventDisconnected and dials the addresses
// it knows, those of the latest WELCOME and then those given to Dial, in
// rounds separated by waits that double from DelayMin up to DelayMax with
// jitter, until one takes a session (the same login again) or the
// policy's bound of rounds or time runs out (EventGaveUp: the Conn then
// ends as one without Reconnect would, Err wrapping ErrGaveUp).
//
// A broker that stops answering without closing the connection (frozen,
// or cut off) is noticed after three heartbeat intervals without a frame
// from it: 3 s at the 1 s a reconnecting Conn asks for unless
// Config.Heartbeat says otherwise (ReconnectHeartbeatDefault; a Conn
// without Reconnect takes the server's default, 5 s). A cluster gives a
// frozen master's queues a new master within about 0.8 s
// (-controller-broker-timeout), so a client that must follow it that
// fast asks for a shorter interval, Config.Heartbeat of 200 ms or so (the
// server then sends a HEARTBEAT frame of 8 bytes every 100 ms, and
// expects one from the client as often). While it
// dials, calls queue as usual and wait for window space; Flush waits.
//
// On the new connection (EventReconnected), in command-id order and under
// their own ids:
//   - publishes that had no answer are sent again, and so are declares,
//     binds and unbinds (idempotent): their callers see only the final
//     outcome. A resent command that the new server refuses fails with
//     ErrOutcomeUnknown (and ErrConnectionLost), not an *Error: the copy
//     sent before the break may have been carried out. What is kept for this is the encoded message per
//     uncompleted publish, so the window bounds it (a slot keeps a buffer
//     of up to 16 KiB for its next command).
//   - each consumer is subscribed again (same Consumer value, same
//     options) with the credit the server owed it; deliveries keep
//     increasing tags. A SUBSCRIBE refused as unavailable (a replicated
//     queue whose group is still electing its master, or a broker that
//     has not learned the new master yet) is sent again after a wait
//     that grows as between reconnect rounds, until the policy's bounds
//     run out; then the consumer ends with that error. So is one refused
//     as not-found, for ResubscribeNotFound (5 s by default): a cluster
//     broker may not have learned a queue declared through another one
//     yet. A queue deleted for good ends the consumer with not-found
//     after that time.
//   - a Cancel that had no answer is done (the consumer is not
//     subscribed again); a Purge or Delete fails with ErrConnectionLost
//     (with ErrOutcomeUnknown if it was sent).
//
// Deliveries of the broken connection cannot be settled any more: the
// broker requeued them when that session ended, and they come back marked
// Redelivered. An AckExplicit consumer drops those it buffered; settling
// one the program holds returns ErrStaleDelivery and sends nothing (in a
// batch, such tags are left out and the rest settled). A settle that was
// out at the break fails with ErrStaleDelivery too, with
// ErrOutcomeUnknown if it was sent. Consume goes on past these. AckNone
// deliveries still in flight at the break are lost (at-most-once).
//
// Resent publishes carry the Conn's producer id (ProducerID) and their
// command id as sequence number, on servers of protocol 1.2 and later
// (docs/PROTOCOL.md, PUBLISH): a queue that already enqueued a resent
// message skips it, so a publish is enqueued once per queue even when
// its first answer was lost. Older servers, or NoProducerID, make resends
// at-least-once. The server keeps this state for at most 1024 producers
// per queue. A server that answers a publish with shutdown (it is going
// away) did not take it: a reconnecting Conn sends it again elsewhere.
// One answered outcome-unknown (its queue's master was lost with it in
// flight) is not sent again: its result is that *Error, which matches
// ErrOutcomeUnknown, and the program decides (a new Publish of it may
// enqueue it twice: the producer id covers only the Conn's own resends).
//
// A reconnect offers only the protocol version negotiated first and asks
// for the same frame size; a server that offers less (a smaller window or
// credit) is passed over.
//
// # Consumers the broker ends
//
// A server of protocol 1.3 may end one consumer and keep the connection
// (CANCELLED, docs/PROTOCOL.md section 6.8): one it served through the
// queue's master, another broker, when that master was lost (code
// unavailable), or one whose queue was deleted (not-found). Without
// Config.Reconnect the consumer ends: Next, Consume and Err return an
// error wrapping ErrConsumerEnded and the server's *Error, an AckExplicit
// consumer drops what it buffered (the broker requeues what was not
// accepted), and settling its deliveries fails. With Config.Reconnect the
// consumer is subscribed again as after a reconnect (same Consumer value,
// a new id on the wire, the unavailable retries and their bounds), and
// its old deliveries settle as stale ones do (ErrStaleDelivery); it ends
// only if that SUBSCRIBE fails otherwise (a deleted queue: not-found). An
// older server closes the whole connection instead.
package client
