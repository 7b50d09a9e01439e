package controlplane

import (
	"maps"
	"slices"

	"github.com/berthmq/berth/controlplane/ctlapi"
	"github.com/berthmq/berth/wire"
)

// Users in the state machine (ctlapi/users.go says what a user holds).
// Apply checks again what ValidateEvent checks, so that a malformed event
// in the log is refused the same way on every controller.

func (s *State) applyUser(ev ctlapi.Event) ctlapi.Result {
	if err := ctlapi.ValidateEvent(ev); err != nil {
		return fail(ctlapi.CodeInvalid, "%v", err)
	}
	switch ev := ev.(type) {
	case *ctlapi.AddUser:
		if _, ok := s.users[ev.User.Name]; ok {
			return fail(ctlapi.CodeConflict, "user %q exists", ev.User.Name)
		}
		s.users[ev.User.Name] = cloneUser(ev.User)
	case *ctlapi.SetUserCredentials:
		u, ok := s.users[ev.Name]
		if !ok {
			return fail(ctlapi.CodeNotFound, "no user %q", ev.Name)
		}
		u.Credentials = ev.Credentials
		s.users[ev.Name] = cloneUser(u)
	case *ctlapi.SetPermissions:
		u, ok := s.users[ev.Name]
		if !ok {
			return fail(ctlapi.CodeNotFound, "no user %q", ev.Name)
		}
		u.Permissions = ev.Permissions
		s.users[ev.Name] = u
	case *ctlapi.RemoveUser:
		if _, ok := s.users[ev.Name]; !ok {
			return fail(ctlapi.CodeNotFound, "no user %q", ev.Name)
		}
		delete(s.users, ev.Name)
	}
	return ctlapi.Result{}
}

// cloneUser copies the byte slices: the event's may alias a log buffer.
func cloneUser(u ctlapi.User) ctlapi.User {
	c := &u.Credentials
	c.Salt, c.StoredKey, c.ServerKey = slices.Clone(c.Salt), slices.Clone(c.StoredKey), slices.Clone(c.ServerKey)
	return u
}

// Users returns every user, sorted by name; the slices are the caller's.
func (s *State) Users() []ctlapi.User {
	out := make([]ctlapi.User, 0, len(s.users))
	for _, name := range slices.Sorted(maps.Keys(s.users)) {
		out = append(out, cloneUser(s.users[name]))
	}
	return out
}

// User returns one user.
func (s *State) User(name string) (ctlapi.User, bool) {
	u, ok := s.users[name]
	return cloneUser(u), ok
}

// appendUsers ends a snapshot with the users, only when there are some:
// a state without users encodes as it did before users existed.
func (s *State) appendUsers(b []byte) []byte {
	if len(s.users) == 0 {
		return b
	}
	b = wire.AppendU32(b, uint32(len(s.users)))
	for _, name := range slices.Sorted(maps.Keys(s.users)) {
		u := s.users[name]
		b = ctlapi.AppendUser(b, &u)
	}
	return b
}

// readUsers reads appendUsers' section if the snapshot has one.
func (s *State) readUsers(r *wire.Reader) {
	if r.Err() != nil || r.Remaining() == 0 {
		return
	}
	n := r.Count(2 + 4 + 4 + 4 + 4 + 6)
	for i := 0; i < n && r.Err() == nil; i++ {
		u := ctlapi.ReadUser(r)
		s.users[u.Name] = u
	}
}
