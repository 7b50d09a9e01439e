package ctlapi

import (
	"fmt"
	"regexp"

	"github.com/berthmq/berth/wire"
)

// Users of the client port live in the controller's state, so every
// broker of a cluster agrees on them and they survive restarts. A user
// holds SCRAM-SHA-256 credentials (RFC 5802, RFC 7677), never a
// password: the salt, the iteration count, StoredKey = H(ClientKey) and
// ServerKey. They check a SCRAM exchange, and a PLAIN password (derived
// with the same salt and count, compared in constant time). Whoever adds
// a user (berthctl) derives them; the controller only stores them.

// Credential limits, checked by ValidateEvent.
const (
	UserSaltLenMin       = 16
	UserSaltLenMax       = 64
	UserIterationsMin    = 4096 // RFC 7677's minimum for SCRAM-SHA-256
	UserIterationsMax    = 1 << 24
	UserKeyLen           = 32 // SHA-256
	PermissionPatternMax = 1024
)

// Credentials are a user's SCRAM-SHA-256 keys.
type Credentials struct {
	Salt       []byte
	Iterations uint32
	StoredKey  []byte
	ServerKey  []byte
}

// Permissions are three regular expressions (Go syntax, matched against
// the whole name) as RabbitMQ has them: Configure for declaring, deleting,
// binding (the queue and the exchange) and unbinding; Write for
// publishing to an exchange (the default exchange: the queue); Read for
// subscribing to, getting from and purging a queue. "" matches nothing.
type Permissions struct {
	Configure, Write, Read string
}

// User is one user as the controller holds it.
type User struct {
	Name        string
	Credentials Credentials
	Permissions Permissions
}

// AddUser creates a user; a user of that name is a conflict.
type AddUser struct{ User User }

// SetUserCredentials replaces an existing user's credentials (a new
// password); the permissions stay.
type SetUserCredentials struct {
	Name        string
	Credentials Credentials
}

// SetPermissions replaces an existing user's permissions.
type SetPermissions struct {
	Name        string
	Permissions Permissions
}

// RemoveUser deletes a user.
type RemoveUser struct{ Name string }

func (*AddUser) Kind() EventKind            { return KindAddUser }
func (*SetUserCredentials) Kind() EventKind { return KindSetUserCredentials }
func (*SetPermissions) Kind() EventKind     { return KindSetPermissions }
func (*RemoveUser) Kind() EventKind         { return KindRemoveUser }

func appendCredentials(b []byte, c *Credentials) []byte {
	b = wire.AppendBytes(b, c.Salt)
	b = wire.AppendU32(b, c.Iterations)
	b = wire.AppendBytes(b, c.StoredKey)
	return wire.AppendBytes(b, c.ServerKey)
}

func readCredentials(r *wire.Reader, c *Credentials) {
	c.Salt = append([]byte(nil), r.Bytes(UserSaltLenMax)...)
	c.Iterations = r.U32()
	c.StoredKey = append([]byte(nil), r.Bytes(UserKeyLen)...)
	c.ServerKey = append([]byte(nil), r.Bytes(UserKeyLen)...)
}

func appendPermissions(b []byte, p *Permissions) []byte {
	return AppendString(AppendString(AppendString(b, p.Configure), p.Write), p.Read)
}

func readPermissions(r *wire.Reader, p *Permissions) {
	p.Configure, p.Write, p.Read = ReadString(r), ReadString(r), ReadString(r)
}

// AppendUser appends a user's encoding (events and snapshots share it).
func AppendUser(b []byte, u *User) []byte {
	b = AppendString(b, u.Name)
	b = appendCredentials(b, &u.Credentials)
	return appendPermissions(b, &u.Permissions)
}

// ReadUser decodes AppendUser's encoding.
func ReadUser(r *wire.Reader) User {
	var u User
	u.Name = ReadString(r)
	readCredentials(r, &u.Credentials)
	readPermissions(r, &u.Permissions)
	return u
}

func (ev *AddUser) appendBody(b []byte) []byte { return AppendUser(b, &ev.User) }
func (ev *AddUser) decodeBody(r *wire.Reader)  { ev.User = ReadUser(r) }
func (ev *SetUserCredentials) appendBody(b []byte) []byte {
	return appendCredentials(AppendString(b, ev.Name), &ev.Credentials)
}
func (ev *SetUserCredentials) decodeBody(r *wire.Reader) {
	ev.Name = ReadString(r)
	readCredentials(r, &ev.Credentials)
}
func (ev *SetPermissions) appendBody(b []byte) []byte {
	return appendPermissions(AppendString(b, ev.Name), &ev.Permissions)
}
func (ev *SetPermissions) decodeBody(r *wire.Reader) {
	ev.Name = ReadString(r)
	readPermissions(r, &ev.Permissions)
}
func (ev *RemoveUser) appendBody(b []byte) []byte { return AppendString(b, ev.Name) }
func (ev *RemoveUser) decodeBody(r *wire.Reader)  { ev.Name = ReadString(r) }

// ValidateCredentials says what is wrong with c, or nil.
func ValidateCredentials(c *Credentials) error {
	switch {
	case len(c.Salt) < UserSaltLenMin || len(c.Salt) > UserSaltLenMax:
		return fmt.Errorf("controlplane: user salt must be %d..%d bytes", UserSaltLenMin, UserSaltLenMax)
	case c.Iterations < UserIterationsMin || c.Iterations > UserIterationsMax:
		return fmt.Errorf("controlplane: user iteration count must be %d..%d", UserIterationsMin, UserIterationsMax)
	case len(c.StoredKey) != UserKeyLen || len(c.ServerKey) != UserKeyLen:
		return fmt.Errorf("controlplane: user keys must be %d bytes (SHA-256)", UserKeyLen)
	}
	return nil
}

// ValidatePermissions says which pattern does not compile, or nil.
func ValidatePermissions(p *Permissions) error {
	for what, re := range map[string]string{"configure": p.Configure, "write": p.Write, "read": p.Read} {
		if len(re) > PermissionPatternMax {
			return fmt.Errorf("controlplane: %s pattern longer than %d bytes", what, PermissionPatternMax)
		}
		if _, err := regexp.Compile("^(?:" + re + ")$"); err != nil {
			return fmt.Errorf("controlplane: %s pattern %q: %w", what, re, err)
		}
	}
	return nil
}

func validateUserEvent(ev Event) error {
	switch ev := ev.(type) {
	case *AddUser:
		if err := validName("user", ev.User.Name); err != nil {
			return err
		}
		if err := ValidateCredentials(&ev.User.Credentials); err != nil {
			return err
		}
		return ValidatePermissions(&ev.User.Permissions)
	case *SetUserCredentials:
		if err := validName("user", ev.Name); err != nil {
			return err
		}
		return ValidateCredentials(&ev.Credentials)
	case *SetPermissions:
		if err := validName("user", ev.Name); err != nil {
			return err
		}
		return ValidatePermissions(&ev.Permissions)
	case *RemoveUser:
		return validName("user", ev.Name)
	}
	return nil
}
