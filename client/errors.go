package client

import (
	"errors"

	"github.com/berthmq/berth/wire"
)

// Sentinel errors. Every error this package returns either is one of these,
// wraps one of them, or is an *Error from the server.
var (
	// ErrClosed is returned once the connection has ended, by Close, by the
	// server, or by a failure. Alone (without ErrOutcomeUnknown) it means
	// the command was never sent: the server did not carry it out. Errors
	// for commands that were sent and not yet answered wrap it too, together
	// with ErrOutcomeUnknown.
	ErrClosed = errors.New("client: connection closed")
	// ErrOutcomeUnknown means a command was sent and the server may or may
	// not have carried it out (a publish may be enqueued, a settle may have
	// taken effect). Two kinds of error match it (errors.Is):
	//   - the connection ended before the server answered (or the context
	//     of a call that waited for the answer ended): the error also wraps
	//     ErrClosed (or ctx.Err()) and holds no *Error; the reason the
	//     connection ended is Conn.Err;
	//   - the server answered that it does not know: an *Error (errors.As
	//     gives its code and the broker's reason text) whose code says so
	//     (wire.ErrorCode.Outcome): outcome-unknown (protocol 1.4: the
	//     command's replicated queue lost its master with the command in
	//     flight; a server of 1.3 or older says unavailable instead, with
	//     a text saying the outcome is unknown), store (the journal failed:
	//     a publish is enqueued in memory but may be gone after a restart),
	//     internal, or a code this client does not know.
	//
	// A program that must not lose a message publishes it again, and so may
	// publish it twice: a new Publish is a new command, which the broker's
	// producer-id check does not take for a copy (only a reconnecting
	// Conn's own resends keep their sequence numbers). A settle with an
	// unknown outcome needs nothing: a message not settled is requeued when
	// its session ends or its consumer is ended.
	ErrOutcomeUnknown = errors.New("client: the command may or may not have been carried out; outcome unknown")
	// ErrCalledFromCallback is returned by a call that would have to wait
	// (for window space, for a completion, for a delivery) when it is made
	// from a callback run by a Conn's reader goroutine (a done function or
	// Config.ErrorHandler). Only that goroutine could end the wait, so the
	// call would deadlock; it returns this instead and does nothing.
	ErrCalledFromCallback = errors.New("client: call would wait on the reader goroutine that runs this callback")
	// ErrNoAddress is returned by Dial when it is given no address.
	ErrNoAddress = errors.New("client: no address to dial")
	// ErrProtocol means the server sent something the protocol forbids; the
	// connection is closed.
	ErrProtocol = errors.New("client: protocol violation by server")
	// ErrHeartbeatTimeout means nothing arrived from the server for three
	// heartbeat intervals; the connection is closed.
	ErrHeartbeatTimeout = errors.New("client: server missed its heartbeats")
	// ErrTooLarge means a message or command does not fit in one frame of
	// the negotiated maximum size.
	ErrTooLarge = errors.New("client: command exceeds the negotiated maximum frame size")
	// ErrInvalid means an argument cannot be encoded (a name or key too
	// long, an unknown option value).
	ErrInvalid = errors.New("client: invalid argument")
	// ErrConsumerClosed is returned by Consumer.Next once the consumer was
	// cancelled and every message delivered before that was handed out.
	ErrConsumerClosed = errors.New("client: consumer cancelled")
	// ErrConsumerEnded is wrapped, with the broker's *Error (code and
	// reason), by Consumer.Err, Next and the settles of a consumer that
	// the broker ended without being asked (protocol 1.3 CANCELLED: for
	// one consumed through a broker that is not its queue's master, that
	// master was lost). The connection, its publishers and its other
	// consumers go on. Its deliveries not yet accepted go back to the
	// queue and cannot be settled any more; an AckExplicit consumer drops
	// what it buffered. A reconnecting Conn (Config.Reconnect) does not
	// end the consumer: it subscribes it again, as after a reconnect.
	ErrConsumerEnded = errors.New("client: the broker ended the consumer")
	// ErrNoTags is returned by the batch settle calls when given no tags.
	ErrNoTags = errors.New("client: no delivery tags given")
	// ErrConnectionLost is the result of a command of a reconnecting Conn
	// (Config.Reconnect) that could not be carried over to the new
	// connection (a purge or a delete; a settle gets ErrStaleDelivery).
	// With ErrOutcomeUnknown it was sent and may have taken effect;
	// without, it was never sent. The Conn itself lives on.
	ErrConnectionLost = errors.New("client: the connection broke; the command was not carried over to the next one")
	// ErrStaleDelivery is the result of a settle (Accept, Release, Reject)
	// of deliveries that came over a connection that has since broken: a
	// reconnecting Conn cannot settle them on its new connection. Those
	// messages were requeued by the broker when the old session ended and
	// come back, marked Redelivered, to a consumer. With
	// ErrOutcomeUnknown the settle was sent before the break and may have
	// taken effect (then the message does not come back).
	ErrStaleDelivery = errors.New("client: delivery from a connection that broke; the broker requeues it")
	// ErrGaveUp is wrapped by Conn.Err (and so by the errors of calls)
	// when a reconnecting Conn stopped trying (ReconnectPolicy bounds).
	ErrGaveUp = errors.New("client: gave up reconnecting")
)

// Error is an ERROR or CLOSE frame from the server. Returned by a command
// (CommandID is its id) it means the broker refused that command: it was
// not carried out, unless its code says that the outcome is unknown
// (outcome-unknown, store, internal: see ErrOutcomeUnknown, which such an
// *Error matches with errors.Is; docs/PROTOCOL.md 1.4 says what each code
// means for its command). CommandID 0 is the broker's word about the
// connection, not about a command: Dial returns it when the server refuses
// the session, Config.ErrorHandler receives it, and Conn.Err wraps it when
// the server closed the connection with an error code. A command's error
// never holds one with CommandID 0. Use errors.As to get at it.
type Error struct {
	Code      wire.ErrorCode
	Text      string
	CommandID uint64 // 0 for errors that concern the connection
}

// Is reports whether target is ErrOutcomeUnknown and e answers a command
// whose outcome its code leaves unknown (wire.OutcomeUnknown).
func (e *Error) Is(target error) bool {
	return target == ErrOutcomeUnknown && e.CommandID != 0 && e.Code.Outcome() == wire.OutcomeUnknown
}

func (e *Error) Error() string {
	if e.Text == "" {
		return "client: server error " + e.Code.String()
	}
	return "client: server error " + e.Code.String() + ": " + e.Text
}

// Code returns the server error code carried by err, or wire.CodeOK when
// err is nil or carries no *Error.
func Code(err error) wire.ErrorCode {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return wire.CodeOK
}
