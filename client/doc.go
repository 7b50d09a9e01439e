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
//     completion and return nil or an *Error.
//   - PublishAsync and the *Async settle calls wait only for window space;
//     their done callback gets the result later.
//   - Consumer.Credit never blocks.
//   - Consumer.Next waits for a delivery.
//
// Contexts bound the waiting only: a command already sent is not taken
// back when its context ends, the server still carries it out.
//
// Callbacks (done functions, Config.ErrorHandler) run on the connection's
// reader goroutine; they must be quick and must not call methods that
// wait for the same Conn.
//
// A Conn does not reconnect. When it fails, pending and later calls return
// an error wrapping ErrClosed; messages acquired by its consumers and not
// accepted are requeued by the server.
package client
