package client

import (
	"fmt"

	"github.com/xdg-go/scram"

	"github.com/berthmq/berth/wire"
)

// offeredVersions are the protocol versions HELLO offers, newest first: a
// 1.0 server (which has no AUTH frame) still serves this client, except
// for SCRAM-SHA-256, which needs 1.1. A server of 1.3 may end a consumer
// with CANCELLED and keep the session; an older one closes it instead. A
// server of 1.4 answers outcome-unknown for a command it lost track of;
// an older one unavailable, which only its text tells apart.
var offeredVersions = []wire.Version{wire.VersionOutcome, wire.VersionCancelled, wire.VersionProducer, wire.VersionAuth, wire.Version10}

// offerUpTo is offeredVersions without those newer than max (zero: all).
func offerUpTo(max wire.Version) []wire.Version {
	if max == 0 {
		return offeredVersions
	}
	var out []wire.Version
	for _, v := range offeredVersions {
		if v <= max {
			out = append(out, v)
		}
	}
	return out
}

// login is the client's side of the mechanism Config names.
type login struct {
	mechanism string
	first     []byte                    // HELLO's auth field
	scram     *scram.ClientConversation // SCRAM-SHA-256 only
}

func newLogin(cfg *Config) (*login, error) {
	l := &login{mechanism: cfg.Mechanism}
	switch cfg.Mechanism {
	case wire.MechPlain:
		l.first = append(append(append([]byte{0}, cfg.User...), 0), cfg.Password...)
	case wire.MechExternal:
		l.first = []byte(cfg.User)
	case wire.MechScramSHA256:
		c, err := scram.SHA256.NewClient(cfg.User, cfg.Password, "")
		if err != nil {
			return nil, fmt.Errorf("%w: SCRAM-SHA-256: %v", ErrInvalid, err)
		}
		l.scram = c.NewConversation()
		first, err := l.scram.Step("")
		if err != nil {
			return nil, fmt.Errorf("%w: SCRAM-SHA-256: %v", ErrInvalid, err)
		}
		l.first = []byte(first)
	}
	if len(l.first) > wire.TextLenMax {
		return nil, fmt.Errorf("%w: credentials longer than %d bytes", ErrInvalid, wire.TextLenMax)
	}
	return l, nil
}

// step answers the server's AUTH challenge; a nil reply means the
// exchange is over (the server proved it holds the user's keys).
func (l *login) step(challenge []byte) ([]byte, error) {
	if l.scram == nil || l.scram.Done() {
		return nil, fmt.Errorf("%w: AUTH during a %s login", ErrProtocol, l.mechanism)
	}
	reply, err := l.scram.Step(string(challenge))
	if err != nil {
		return nil, fmt.Errorf("%w: SCRAM-SHA-256: %v", ErrProtocol, err)
	}
	if l.scram.Done() {
		if !l.scram.Valid() {
			return nil, fmt.Errorf("%w: SCRAM-SHA-256: the server's signature is wrong", ErrProtocol)
		}
		return nil, nil
	}
	return []byte(reply), nil
}

// done checks, at WELCOME, that the login ended as it must: a SCRAM
// server proved itself first. A server that welcomes a SCRAM client
// without the exchange (a 1.0 server ignores mechanisms) is refused: it
// did not check the password, and did not prove it knows the user.
func (l *login) done() error {
	if l.scram != nil && !l.scram.Valid() {
		return fmt.Errorf("%w: WELCOME before the SCRAM-SHA-256 exchange ended: the server does not authenticate", ErrProtocol)
	}
	return nil
}
