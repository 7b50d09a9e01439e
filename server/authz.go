package server

import (
	"bytes"
	"fmt"

	"github.com/berthmq/berth/wire"
)

// Authorization: each command is checked against the session user's
// configure, write and read patterns (authUser), as RabbitMQ checks
// them:
//
//	configure  DECLARE_QUEUE, DECLARE_EXCHANGE, DELETE (the named object);
//	           BIND and UNBIND (the queue and the exchange)
//	write      PUBLISH: the exchange, or for the default exchange the
//	           queue the routing key names; DECLARE_QUEUE's dead-letter
//	           exchange
//	read       SUBSCRIBE (and so a get), PURGE
//
// CANCEL, CREDIT and the settles act on the session's own consumers and
// need nothing more. A denied command gets ERROR(not-allowed) naming what
// was denied; the session goes on.
//
// Changes to the users reach open sessions: the session notes the
// userSet generation it resolved its user in, and looks the user up
// again (dropping its cache) when the generation moved. A removed user's
// session is refused everything.
//
// PUBLISH is the hot path: a session remembers the verdict per exchange
// (or default-exchange queue) name, in a map bounded by permCacheMax, with
// the last name in front of it; in steady state a check is one atomic
// load, a bytes comparison or a map lookup, and no allocation. A user
// whose pattern is ".*" skips even that.

// permCacheMax bounds the names one session remembers verdicts for; past
// it the cache starts again empty.
const permCacheMax = 256

type permClass uint8

const (
	permConfigure permClass = iota
	permWrite
	permRead
)

var (
	permVerbs = [...]string{permConfigure: "configure", permWrite: "write to", permRead: "read from"}
	permNames = [...]string{permConfigure: "configure", permWrite: "write", permRead: "read"}
)

// sessionAuthz is a session's identity and its cached verdicts. It
// belongs to the connection's owner.
type sessionAuthz struct {
	name    string
	builtin bool
	user    *authUser // as resolved in userSet generation gen
	gen     uint64

	lastName  []byte // the last name checked for write, and its verdict
	lastValid bool
	lastOK    bool
	writes    map[string]bool
}

// current is the session's user as the users are now.
func (cs *connState) currentUser() *authUser {
	z := &cs.authz
	set := cs.s.auth.users.Load()
	if set.gen != z.gen {
		z.user, z.gen = set.lookup(z.name, z.builtin), set.gen
		z.lastValid = false
		clear(z.writes)
	}
	return z.user
}

func (u *authUser) pattern(c permClass) *permPattern {
	switch c {
	case permConfigure:
		return &u.configure
	case permWrite:
		return &u.write
	}
	return &u.read
}

// allowed checks one permission; on a denial it fails command id with
// not-allowed and counts it.
func (cs *connState) allowed(c permClass, kind string, name []byte, id uint64) bool {
	u := cs.currentUser()
	p := u.pattern(c)
	if p.match(name) {
		return true
	}
	cs.denied(u, c, kind, name, id)
	return false
}

func (cs *connState) denied(u *authUser, c permClass, kind string, name []byte, id uint64) {
	cs.s.sec.denied.Inc()
	var text string
	if u.removed {
		text = fmt.Sprintf("permission denied: user %q no longer exists (may not %s %s %q)", u.name, permVerbs[c], kind, name)
	} else {
		text = fmt.Sprintf("permission denied: user %q may not %s %s %q (%s pattern %q)", u.name, permVerbs[c], kind, name, permNames[c], u.pattern(c).source)
	}
	cs.fail(id, wire.CodeNotAllowed, text)
}

// canPublish checks write permission for one message: on the exchange, or
// for the default exchange on the queue the routing key names.
func (cs *connState) canPublish(exchange, routingKey []byte, id uint64) bool {
	u := cs.currentUser()
	if u.write.all {
		return true
	}
	name, kind := exchange, "exchange"
	if len(exchange) == 0 {
		name, kind = routingKey, "queue"
	}
	z := &cs.authz
	ok := z.lastOK
	if !z.lastValid || !bytes.Equal(z.lastName, name) {
		var found bool
		ok, found = z.writes[string(name)]
		if !found {
			ok = u.write.match(name)
			if z.writes == nil || len(z.writes) >= permCacheMax {
				z.writes = make(map[string]bool, 16)
			}
			z.writes[string(name)] = ok
		}
		z.lastName, z.lastValid, z.lastOK = append(z.lastName[:0], name...), true, ok
	}
	if !ok {
		cs.denied(u, permWrite, kind, name, id)
	}
	return ok
}
