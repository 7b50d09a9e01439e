package ctlapi

import (
	"errors"
	"fmt"
)

// Sentinel errors. All start with "controlplane: ".
var (
	ErrStopped = errors.New("controlplane: node stopped")
	// ErrBusy: a bounded queue is full; retry later.
	ErrBusy = errors.New("controlplane: too many requests in flight")
	// ErrLeaderChanged: leadership moved while a write was in flight. The
	// write may or may not have been applied.
	ErrLeaderChanged = errors.New("controlplane: leadership changed; outcome unknown")
	// ErrReadAborted: a consistent read lost its ReadIndex to a leader
	// change; it was not served and may be retried.
	ErrReadAborted = errors.New("controlplane: read index request aborted")
	ErrTimeout     = errors.New("controlplane: request timed out")
	ErrBadRequest  = errors.New("controlplane: bad request")
)

// NotLeaderError says this controller cannot serve the request. Leader is
// the address to retry at, when known.
type NotLeaderError struct{ Leader string }

func (e *NotLeaderError) Error() string {
	if e.Leader == "" {
		return "controlplane: not the leader; leader unknown"
	}
	return fmt.Sprintf("controlplane: not the leader; leader is %s", e.Leader)
}

// LaggingError is a follower's redirect when it is too far behind the
// leader to serve a follower read without blocking.
type LaggingError struct {
	Leader string
	Behind uint64
}

func (e *LaggingError) Error() string {
	return fmt.Sprintf("controlplane: follower is %d entries behind; read at leader %s", e.Behind, e.Leader)
}
