package client

import (
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/berthmq/berth/controlplane/ctlapi"
	"github.com/berthmq/berth/internal/testutil"
	"github.com/berthmq/berth/server"
	"github.com/berthmq/berth/wire"
)

func TestLoginConfigChecks(t *testing.T) {
	for name, cfg := range map[string]Config{
		"scram without user":    {Mechanism: wire.MechScramSHA256, Password: "x"},
		"plain without user":    {Mechanism: wire.MechPlain},
		"none with a user":      {Mechanism: wire.MechNone, User: "u"},
		"external without cert": {Mechanism: wire.MechExternal},
		"unknown mechanism":     {Mechanism: "GSSAPI", User: "u"},
	} {
		if _, err := cfg.withDefaults(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
	if c, err := (&Config{User: "u"}).withDefaults(); err != nil || c.Mechanism != wire.MechScramSHA256 {
		t.Fatalf("a User alone: mechanism %q, %v; want SCRAM-SHA-256", c.Mechanism, err)
	}
}

// TestScramLogin logs in with SCRAM-SHA-256 against a real broker, and
// is refused with the wrong password.
func TestScramLogin(t *testing.T) {
	s := startServer(t, func(c *server.Config) { c.ControllerAddr = testutil.FreeAddr(t) })
	testutil.AddUser(t, s.ControllerAddr(), "erin", "erin-pw", ctlapi.Permissions{Configure: "erin-.*", Write: "erin-.*", Read: "erin-.*"})
	var c *Conn
	testutil.WaitFor(t, 10*time.Second, func() error {
		var err error
		c, err = DialConfig(testCtx(t), Config{User: "erin", Password: "erin-pw"}, s.ClientAddr())
		return err
	})
	defer c.Close()
	if c.version != wire.Current || c.version < wire.VersionAuth {
		t.Fatalf("session version %v, want %v (SCRAM needs %v or later)", c.version, wire.Current, wire.VersionAuth)
	}
	if err := c.DeclareQueue(testCtx(t), "erin-q", QueueOptions{}); err != nil {
		t.Fatal(err)
	}
	_, err := DialConfig(testCtx(t), Config{User: "erin", Password: "nope"}, s.ClientAddr())
	if Code(err) != wire.CodeAuthFailed {
		t.Fatalf("wrong password: %v", err)
	}
}

// fakeOldServer answers any HELLO as a 1.0 server does: WELCOME at once,
// whatever the mechanism.
func fakeOldServer(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer nc.Close()
				buf := make([]byte, 4096)
				if _, err := nc.Read(buf); err != nil {
					return
				}
				w := wire.Welcome{Version: wire.Version10, FrameSizeMax: wire.FrameSizeDefault, HeartbeatMs: 5000, CreditMax: 100, WindowMax: 100,
					ServerName: []byte("old"), Addrs: [][]byte{[]byte(ln.Addr().String())}}
				_, _ = nc.Write(wire.AppendWelcome(nil, &w))
				_, _ = nc.Read(buf) // until the client goes
			}()
		}
	}()
	return ln.Addr().String()
}

// TestOldServer: a 1.0 server still serves this client, except for
// SCRAM-SHA-256, where a WELCOME without the exchange means the server
// checked nothing and proved nothing.
func TestOldServer(t *testing.T) {
	addr := fakeOldServer(t)
	c, err := DialConfig(testCtx(t), Config{CloseTimeout: 100 * time.Millisecond}, addr)
	if err != nil {
		t.Fatalf("mechanism none against a 1.0 server: %v", err)
	}
	if c.version != wire.Version10 {
		t.Fatalf("version %v", c.version)
	}
	c.Close()
	_, err = DialConfig(testCtx(t), Config{User: "u", Password: "p"}, addr)
	if !errors.Is(err, ErrProtocol) || !strings.Contains(err.Error(), "does not authenticate") {
		t.Fatalf("SCRAM against a 1.0 server: %v", err)
	}
}
