package testutil

import (
	"context"
	"crypto/rand"
	"testing"
	"time"

	"github.com/xdg-go/scram"

	"github.com/berthmq/berth/controlplane/ctlapi"
	"github.com/berthmq/berth/controlplane/ctlclient"
)

// Credentials derives SCRAM-SHA-256 keys for password under a fresh salt,
// as berthctl users add does.
func Credentials(t testing.TB, password string) ctlapi.Credentials {
	t.Helper()
	salt := make([]byte, ctlapi.UserSaltLenMin)
	if _, err := rand.Read(salt); err != nil {
		t.Fatal(err)
	}
	c, err := scram.SHA256.NewClient("", password, "")
	if err != nil {
		t.Fatal(err)
	}
	sc, err := c.GetStoredCredentialsWithError(scram.KeyFactors{Salt: string(salt), Iters: ctlapi.UserIterationsMin})
	if err != nil {
		t.Fatal(err)
	}
	return ctlapi.Credentials{Salt: salt, Iterations: ctlapi.UserIterationsMin, StoredKey: sc.StoredKey, ServerKey: sc.ServerKey}
}

// Propose commits ev in the controller at controllerAddr and fails t if
// it is refused.
func Propose(t testing.TB, controllerAddr string, ev ctlapi.Event) {
	t.Helper()
	cl := ctlclient.NewClient([]string{controllerAddr})
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := cl.Propose(ctx, ev)
	if err == nil {
		err = r.Err()
	}
	if err != nil {
		t.Fatalf("controller %s: %T: %v", controllerAddr, ev, err)
	}
}

// AddUser adds a user with password and permissions through the
// controller at controllerAddr.
func AddUser(t testing.TB, controllerAddr, name, password string, perms ctlapi.Permissions) {
	t.Helper()
	Propose(t, controllerAddr, &ctlapi.AddUser{User: ctlapi.User{Name: name, Credentials: Credentials(t, password), Permissions: perms}})
}
