package server_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/berthmq/berth/controlplane/ctlapi"
	"github.com/berthmq/berth/controlplane/ctlclient"
	"github.com/berthmq/berth/internal/certgen"
	"github.com/berthmq/berth/internal/peerauth"
	"github.com/berthmq/berth/internal/testutil"
	"github.com/berthmq/berth/server"
)

// TestClusterPortsNeedCredentialsOffLoopback: a peer or controller address
// off loopback with no cluster credentials stops the start, saying what to
// give, before anything listens.
func TestClusterPortsNeedCredentialsOffLoopback(t *testing.T) {
	for name, mutate := range map[string]func(*server.Config){
		"peer":       func(c *server.Config) { c.PeerAddr = "0.0.0.0:0" },
		"controller": func(c *server.Config) { c.ControllerAddr = "0.0.0.0:0" },
		"controller peers": func(c *server.Config) {
			c.ControllerPeers, c.ControllerID = map[uint64]string{1: "0.0.0.0:7402"}, 1
		},
	} {
		cfg := server.DefaultConfig()
		cfg.ClientAddr, cfg.AdminAddr, cfg.DataDir, cfg.ControllerAddr = "127.0.0.1:0", "", t.TempDir(), testutil.FreeAddr(t)
		cfg.Logger = testLogger(t)
		mutate(&cfg)
		s, err := server.Start(cfg)
		if err == nil {
			s.Close()
			t.Fatalf("%s: started open off loopback", name)
		}
		if !strings.Contains(err.Error(), "-cluster-secret-file") {
			t.Errorf("%s: %v, want it to name -cluster-secret-file", name, err)
		}
	}
}

// TestBrokerControllerSecret: a broker started with a cluster secret makes
// its controller port refuse a client without it (berthctl without
// credentials), serve one with it, and count the refusal.
func TestBrokerControllerSecret(t *testing.T) {
	files, err := certgen.Init(t.TempDir(), certgen.Spec{Nodes: 1})
	if err != nil {
		t.Fatal(err)
	}
	s := startServer(t, func(c *server.Config) {
		c.ControllerAddr, c.AdminAddr, c.ClusterSecretFile = testutil.FreeAddr(t), "127.0.0.1:0", files.Secret
	})
	auth, err := peerauth.Load(peerauth.Options{SecretFile: files.Secret})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	good := ctlclient.NewClientAuth([]string{s.ControllerAddr()}, auth)
	defer good.Close()
	if _, err := good.GetClusterInfo(ctx, ctlapi.ReadConsistent); err != nil {
		t.Fatalf("with the secret: %v", err)
	}
	bad := ctlclient.NewClient([]string{s.ControllerAddr()})
	defer bad.Close()
	short, cancelShort := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancelShort()
	if _, err := bad.GetClusterInfo(short, ctlapi.ReadConsistent); err == nil {
		t.Fatal("the controller answered a client without the secret")
	}
	testutil.WaitFor(t, 5*time.Second, func() error {
		resp, err := http.Get("http://" + s.AdminAddr() + "/metrics")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, "berth_cluster_handshake_refusals_total ") && !strings.HasSuffix(line, " 0") {
				return nil
			}
		}
		return io.ErrUnexpectedEOF
	})
}
