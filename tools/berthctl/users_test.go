package main

import (
	"bytes"
	"context"
	"crypto/hmac"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/xdg-go/scram"

	"github.com/berthmq/berth/controlplane/ctlapi"
	"github.com/berthmq/berth/controlplane/ctlclient"
)

// users add, passwd, list and remove against a real broker's controller:
// what is stored are SCRAM keys that check the password given on
// standard input, and nothing that contains it.
func TestUsersCommand(t *testing.T) {
	s := startBroker(t)
	ctlIn := func(stdin string, args ...string) (int, string, string) {
		full := append([]string{"--controller", s.ControllerAddr(), "--timeout", "5s"}, args...)
		var stdout, stderr bytes.Buffer
		code := runIO(full, strings.NewReader(stdin), &stdout, &stderr)
		return code, stdout.String(), stderr.String()
	}
	if code, _, errOut := ctlIn("s3cret-one\n", "users", "--configure", "alice-.*", "--write", ".*", "--read", "alice-.*", "add", "alice"); code != exitOK {
		t.Fatalf("users add: exit %d: %s", code, errOut)
	}
	if code, _, _ := ctlIn("other\n", "users", "add", "alice"); code == exitOK {
		t.Fatal("adding alice twice succeeded")
	}
	if code, _, _ := ctlIn("", "users", "add", "nopass"); code == exitOK {
		t.Fatal("users add with no password on standard input succeeded")
	}
	if code, _, _ := ctlIn("x\n", "users", "--configure", "(", "add", "badpattern"); code == exitOK {
		t.Fatal("users add with a pattern that does not compile succeeded")
	}
	stored := func() ctlapi.User {
		t.Helper()
		c := ctlclient.NewClient([]string{s.ControllerAddr()})
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		us, err := c.GetUsers(ctx, ctlapi.ReadConsistent)
		if err != nil || len(us) != 1 {
			t.Fatalf("users %v, %v", us, err)
		}
		return us[0]
	}
	checks := func(u ctlapi.User, password string) bool {
		cl, err := scram.SHA256.NewClient("", password, "")
		if err != nil {
			t.Fatal(err)
		}
		sc := cl.GetStoredCredentials(scram.KeyFactors{Salt: string(u.Credentials.Salt), Iters: int(u.Credentials.Iterations)})
		return hmac.Equal(sc.StoredKey, u.Credentials.StoredKey) && hmac.Equal(sc.ServerKey, u.Credentials.ServerKey)
	}
	u := stored()
	if !checks(u, "s3cret-one") || checks(u, "s3cret-two") {
		t.Fatal("the stored keys do not check the password given (or check another)")
	}
	if u.Permissions != (ctlapi.Permissions{Configure: "alice-.*", Write: ".*", Read: "alice-.*"}) {
		t.Fatalf("permissions %+v", u.Permissions)
	}
	if bytes.Contains(ctlapi.EncodeEvent(nil, &ctlapi.AddUser{User: u}), []byte("s3cret")) {
		t.Fatal("the stored user contains the password")
	}
	if code, _, errOut := ctlIn("s3cret-two\n", "users", "passwd", "alice"); code != exitOK {
		t.Fatalf("users passwd: exit %d: %s", code, errOut)
	}
	u2 := stored()
	if !checks(u2, "s3cret-two") || checks(u2, "s3cret-one") || bytes.Equal(u2.Credentials.Salt, u.Credentials.Salt) {
		t.Fatal("passwd did not replace the keys with new ones under a new salt")
	}
	if u2.Permissions != u.Permissions {
		t.Fatal("passwd changed the permissions")
	}
	// permissions replaces all three patterns, and leaves the keys.
	if code, _, errOut := ctlIn("", "users", "--read", "reports-.*", "permissions", "alice"); code != exitOK {
		t.Fatalf("users permissions: exit %d: %s", code, errOut)
	}
	if u3 := stored(); u3.Permissions != (ctlapi.Permissions{Read: "reports-.*"}) || !bytes.Equal(u3.Credentials.StoredKey, u2.Credentials.StoredKey) {
		t.Fatalf("after users permissions: %+v", u3.Permissions)
	}
	if code, _, _ := ctlIn("", "users", "--write", "(", "permissions", "alice"); code != exitUsage {
		t.Fatal("users permissions with a pattern that does not compile was not refused as bad usage")
	}
	if code, _, _ := ctlIn("", "users", "permissions", "nobody"); code == exitOK {
		t.Fatal("users permissions of a missing user succeeded")
	}
	code, out, errOut := ctlIn("", "--json", "users", "list")
	if code != exitOK {
		t.Fatalf("users list: exit %d: %s", code, errOut)
	}
	var list []map[string]any
	if err := json.Unmarshal([]byte(out), &list); err != nil || len(list) != 1 || list[0]["name"] != "alice" {
		t.Fatalf("users list --json: %v %s", err, out)
	}
	if strings.Contains(out, "stored") || strings.Contains(out, "salt") {
		t.Fatalf("users list shows key material: %s", out)
	}
	if code, _, errOut := ctlIn("", "users", "remove", "alice"); code != exitOK {
		t.Fatalf("users remove: exit %d: %s", code, errOut)
	}
	if code, _, _ := ctlIn("", "users", "remove", "alice"); code == exitOK {
		t.Fatal("removing a missing user succeeded")
	}
}

// TestLoginFlags: once a user exists, broker commands log in with --user
// and --password (or BERTH_PASSWORD), and the user's permissions apply.
func TestLoginFlags(t *testing.T) {
	s := startBroker(t)
	run := func(stdin string, args ...string) (int, string) {
		full := append([]string{"--controller", s.ControllerAddr(), "--broker", s.ClientAddr(), "--timeout", "5s"}, args...)
		var stdout, stderr bytes.Buffer
		code := runIO(full, strings.NewReader(stdin), &stdout, &stderr)
		return code, stderr.String()
	}
	if code, errOut := run("pw-1\n", "users", "--configure", "carol-.*", "add", "carol"); code != exitOK {
		t.Fatalf("users add: %s", errOut)
	}
	// The broker learns of carol through its controller watch.
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, errOut := run("", "--user", "carol", "--password", "pw-1", "declare-queue", "carol-q")
		if code == exitOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("declare as carol: %s", errOut)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if code, errOut := run("", "declare-queue", "carol-r"); code == exitOK || !strings.Contains(errOut, "auth-failed") {
		t.Fatalf("declare as the default user with a user defined: exit %d: %s", code, errOut)
	}
	if code, errOut := run("", "--user", "carol", "--password", "wrong", "declare-queue", "carol-r"); code == exitOK || !strings.Contains(errOut, "wrong password") {
		t.Fatalf("declare with a wrong password: exit %d: %s", code, errOut)
	}
	if code, errOut := run("", "--user", "carol", "--password", "pw-1", "declare-queue", "dave-q"); code == exitOK || !strings.Contains(errOut, "not-allowed") {
		t.Fatalf("declare outside carol's configure pattern: exit %d: %s", code, errOut)
	}
	t.Setenv("BERTH_PASSWORD", "pw-1")
	if code, errOut := run("", "--user", "carol", "declare-queue", "carol-env"); code != exitOK {
		t.Fatalf("declare with BERTH_PASSWORD: %s", errOut)
	}
}
