package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berthmq/berth/controlplane/ctlapi"
	"github.com/berthmq/berth/controlplane/ctlclient"
	"github.com/berthmq/berth/internal/testutil"
)

// TestPeerlessClusterRefused: three real berthd processes sharing a
// 3-member controller but started without -peer (issue 25 item 5).
// Before, "cluster init --groups 8" succeeded and the cluster then failed
// silently: queues declared through one broker were not-found at the
// others for good. Now cluster init refuses, naming every broker that has
// no peer address and the flag; and a broker without -peer refuses to
// start (exit status 2, naming -peer) in a cluster that has groups
// already, here made through the controller's API as an older berthctl
// did.
func TestPeerlessClusterRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	type proc struct {
		args   []string
		client string
		log    string
		p      *testutil.Proc
	}
	dir := t.TempDir()
	ctls := []string{testutil.FreeAddr(t), testutil.FreeAddr(t), testutil.FreeAddr(t)}
	var peers []string
	for i, a := range ctls {
		peers = append(peers, fmt.Sprintf("%d=%s", i+1, a))
	}
	procs := make([]*proc, 3)
	for i := range procs {
		client := testutil.FreeAddr(t)
		procs[i] = &proc{client: client, log: filepath.Join(dir, fmt.Sprintf("berthd-%d.log", i+1)),
			args: []string{"-data", filepath.Join(dir, fmt.Sprintf("berthd-%d", i+1)), "-listen", client, "-admin", "",
				"-controller-id", fmt.Sprint(i + 1), "-controller-peers", strings.Join(peers, ","),
				"-shards", "1", "-loops", "1"}}
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, p := range procs {
				t.Logf("%s:\n%s", p.log, testutil.FileTail(p.log, 3000))
			}
		}
	})
	for _, p := range procs {
		p.p = testutil.StartBerthd(t, p.log, p.args...)
	}
	for _, p := range procs {
		p.p.WaitPort(t, p.client, 30*time.Second)
	}
	cl := ctlclient.NewClient(ctls)
	defer cl.Close()
	testutil.WaitFor(t, 20*time.Second, func() error {
		bs, err := cl.GetBrokers(ctx, ctlapi.ReadConsistent)
		if err != nil {
			return err
		}
		if len(bs) != 3 {
			return fmt.Errorf("%d brokers registered, want 3", len(bs))
		}
		return nil
	})

	var stdout, stderr bytes.Buffer
	code := run([]string{"--controller", strings.Join(ctls, ","), "--timeout", "10s", "cluster", "init", "--groups", "8"}, &stdout, &stderr)
	if code != exitFail {
		t.Fatalf("cluster init of peerless brokers: exit %d, want %d; stdout %q stderr %q", code, exitFail, stdout.String(), stderr.String())
	}
	msg := stderr.String()
	for _, want := range []string{"published no peer address", "-peer", procs[0].client, procs[1].client, procs[2].client} {
		if !strings.Contains(msg, want) {
			t.Errorf("cluster init's refusal %q does not name %q", msg, want)
		}
	}
	info, err := cl.GetClusterInfo(ctx, ctlapi.ReadConsistent)
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.Groups != 0 {
		t.Fatalf("the refused init made %d groups", info.Config.Groups)
	}

	// Groups made anyway, through the API: a broker without -peer no
	// longer starts into them.
	if err := cl.SetClusterConfig(ctx, ctlapi.ClusterConfig{Groups: 8}); err != nil {
		t.Fatal(err)
	}
	b := procs[1]
	b.p.Stop(t, syscall.SIGTERM, 15*time.Second)
	b.p = testutil.StartBerthd(t, b.log, b.args...)
	err = b.p.Wait(t, 45*time.Second)
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 {
		t.Fatalf("berthd without -peer in a cluster with groups ended with %v, want exit status 2", err)
	}
	logText, _ := os.ReadFile(b.log)
	for _, want := range []string{"runs no peer transport (-peer)", "the cluster has 8 groups", "start broker"} {
		if !bytes.Contains(logText, []byte(want)) {
			t.Errorf("its log does not say %q:\n%s", want, testutil.FileTail(b.log, 2000))
		}
	}
}
