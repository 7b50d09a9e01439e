package clustertest

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/controlplane/ctlapi"
	"github.com/berthmq/berth/controlplane/ctlclient"
	"github.com/berthmq/berth/internal/certgen"
	"github.com/berthmq/berth/internal/peerauth"
	"github.com/berthmq/berth/internal/testutil"
)

// TestClusterWithCredentials: three berthd processes whose peer and
// controller ports require mutual TLS with a cluster CA and the cluster
// secret elect controllers and group masters and replicate a durable
// queue to every member; a controller client without the credentials and
// garbage on a peer port get nothing.
func TestClusterWithCredentials(t *testing.T) {
	const groups, total = 3, 100
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	f, err := certgen.Init(t.TempDir(), certgen.Spec{Nodes: 3})
	if err != nil {
		t.Fatal(err)
	}
	c := &rcluster{t: t, ctx: ctx, admins: map[*node]string{}}
	peers := map[*node]string{}
	c.nodes = startGroupEach(t, func(i int, n *node) []string {
		c.admins[n], peers[n] = testutil.FreeAddr(t), testutil.FreeAddr(t)
		return []string{"-peer", peers[n], "-controller-heartbeat-ms", "200", "-admin", c.admins[n],
			"-cluster-ca", f.CA, "-cluster-cert", f.NodeCerts[i], "-cluster-key", f.NodeKey[i], "-cluster-secret-file", f.Secret}
	}, "broker", "broker", "broker")
	var ctlAddrs []string
	for _, n := range c.nodes {
		ctlAddrs = append(ctlAddrs, n.ctl)
	}
	auth, err := peerauth.Load(peerauth.Options{CAFile: f.CA, CertFile: f.ClientCert, KeyFile: f.ClientKey, SecretFile: f.Secret})
	if err != nil {
		t.Fatal(err)
	}
	c.cl = ctlclient.NewClientAuth(ctlAddrs, auth)
	t.Cleanup(c.cl.Close)

	stranger := ctlclient.NewClient(ctlAddrs)
	defer stranger.Close()
	sctx, scancel := context.WithTimeout(ctx, 300*time.Millisecond)
	if _, err := stranger.GetBrokers(sctx, ctlapi.ReadUnsafe); err == nil {
		t.Fatal("a controller answered a client without the cluster credentials")
	}
	scancel()
	for _, n := range c.nodes {
		conn, err := net.Dial("tcp", peers[n])
		if err != nil {
			t.Fatal(err)
		}
		_, _ = conn.Write([]byte("\xB3\x27 not a cluster member, not TLS either"))
		_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		buf := make([]byte, 256)
		for {
			if _, err := conn.Read(buf); err != nil {
				if ne, ok := err.(net.Error); ok && ne.Timeout() {
					t.Fatalf("%s's peer port kept a stranger's connection open", n.name)
				}
				break
			}
		}
		conn.Close()
	}

	testutil.WaitFor(t, 20*time.Second, func() error {
		bs, err := c.cl.GetBrokers(ctx, ctlapi.ReadConsistent)
		if err != nil {
			return err
		}
		if len(bs) != 3 {
			return fmt.Errorf("%d brokers registered", len(bs))
		}
		return nil
	})
	info, err := c.cl.GetClusterInfo(ctx, ctlapi.ReadConsistent)
	if err != nil {
		t.Fatal(err)
	}
	cfg := info.Config
	cfg.Groups = groups
	if err := c.cl.SetClusterConfig(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	const queue = "guarded"
	_, _, mnode, conn := c.declare(queue, groups)
	c.publishAll(conn, queue, names(0, total))
	// The followers hold them: the group traffic crossed the guarded peer
	// ports.
	c.waitReady(queue, total)
	// A follower forwards a publish to the master across the guarded
	// peer ports (its forwarding connection makes the handshake too).
	for _, n := range c.nodes {
		if n == mnode {
			continue
		}
		fconn := dial(t, ctx, n.client)
		testutil.WaitFor(t, 20*time.Second, func() error {
			pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
			defer pcancel()
			return fconn.Publish(pctx, "", queue, []byte("forwarded"), client.PublishOptions{Persistent: true})
		})
		break
	}
	if ready, _, err := c.depth(mnode, queue); err != nil || ready != total+1 {
		t.Fatalf("master holds %d ready after a forwarded publish (%v), want %d", ready, err, total+1)
	}
}
