package controlplane

import (
	"bytes"
	"reflect"
	"testing"

	"github.com/berthmq/berth/controlplane/ctlapi"
)

func TestUsersApply(t *testing.T) {
	s := NewState()
	apply := func(ev ctlapi.Event, want uint8) {
		t.Helper()
		if r := s.Apply(ev); r.Code != want {
			t.Fatalf("apply %T %+v: code %d (%s), want %d", ev, ev, r.Code, r.Msg, want)
		}
	}
	alice := goldenUser()
	apply(&ctlapi.AddUser{User: alice}, ctlapi.CodeOK)
	apply(&ctlapi.AddUser{User: alice}, ctlapi.CodeConflict)
	// A new password keeps the permissions; new permissions keep the keys.
	apply(&ctlapi.SetUserCredentials{Name: "alice", Credentials: goldenCredentials(7)}, ctlapi.CodeOK)
	if u, _ := s.User("alice"); !reflect.DeepEqual(u.Credentials, goldenCredentials(7)) || u.Permissions != alice.Permissions {
		t.Fatalf("after passwd: %+v", u)
	}
	perms := ctlapi.Permissions{Configure: "x", Write: "y", Read: "z"}
	apply(&ctlapi.SetPermissions{Name: "alice", Permissions: perms}, ctlapi.CodeOK)
	if u, _ := s.User("alice"); !reflect.DeepEqual(u.Credentials, goldenCredentials(7)) || u.Permissions != perms {
		t.Fatalf("after set permissions: %+v", u)
	}
	apply(&ctlapi.SetUserCredentials{Name: "nobody", Credentials: goldenCredentials(1)}, ctlapi.CodeNotFound)
	apply(&ctlapi.SetPermissions{Name: "nobody"}, ctlapi.CodeNotFound)
	apply(&ctlapi.RemoveUser{Name: "nobody"}, ctlapi.CodeNotFound)
	// Malformed credentials or patterns never reach the state.
	short := goldenCredentials(1)
	short.Salt = short.Salt[:8]
	few := goldenCredentials(1)
	few.Iterations = 1000
	plaintextLike := goldenCredentials(1)
	plaintextLike.StoredKey = []byte("hunter2")
	for _, c := range []ctlapi.Credentials{short, few, plaintextLike} {
		apply(&ctlapi.AddUser{User: ctlapi.User{Name: "bad", Credentials: c}}, ctlapi.CodeInvalid)
	}
	apply(&ctlapi.AddUser{User: ctlapi.User{Name: "bad", Credentials: goldenCredentials(1), Permissions: ctlapi.Permissions{Read: "("}}}, ctlapi.CodeInvalid)
	apply(&ctlapi.AddUser{User: ctlapi.User{Name: "", Credentials: goldenCredentials(1)}}, ctlapi.CodeInvalid)
	if _, ok := s.User("bad"); ok {
		t.Fatal("an invalid user was added")
	}
	// The state's copy does not alias the event's bytes.
	ev := &ctlapi.AddUser{User: ctlapi.User{Name: "bob", Credentials: goldenCredentials(3)}}
	apply(ev, ctlapi.CodeOK)
	ev.User.Credentials.StoredKey[0] ^= 0xff
	if u, _ := s.User("bob"); !reflect.DeepEqual(u.Credentials, goldenCredentials(3)) {
		t.Fatal("the state shares the event's key bytes")
	}
	// A snapshot keeps the users.
	got, err := DecodeState(s.Encode())
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got.Users(), s.Users()) || !bytes.Equal(got.Encode(), s.Encode()) {
		t.Fatalf("snapshot: users %+v, want %+v", got.Users(), s.Users())
	}
	apply(&ctlapi.RemoveUser{Name: "alice"}, ctlapi.CodeOK)
	apply(&ctlapi.RemoveUser{Name: "bob"}, ctlapi.CodeOK)
	if len(s.Users()) != 0 || !bytes.Equal(s.Encode(), NewState().Encode()) {
		t.Fatal("a state whose users were all removed does not encode as one that never had any")
	}
}
