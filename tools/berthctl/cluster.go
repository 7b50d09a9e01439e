package main

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/berthmq/berth/controlplane/ctlapi"
	"github.com/berthmq/berth/controlplane/ctlclient"
	"github.com/berthmq/berth/replication/groups"
)

// clusterCmd: "cluster init" sets the cluster's group count and mode;
// "cluster" alone shows them.
func clusterCmd(fs *flag.FlagSet) func(context.Context, *env, []string) error {
	groups := fs.Uint("groups", 0, "replication groups (init: required; fixed once set, queues hash onto them)")
	mode := fs.String("mode", "active-active", "active-active, or active-passive: the controller also elects one primary broker (berthctl primary) and moves it when it dies; brokers do not act on it yet, every broker still takes clients and none redirects them")
	replicas := fs.Uint("replicas", 0, "init: brokers holding each group (default 3, or every broker registered when fewer); the controller places the groups over the brokers registered then")
	unclean := fs.Bool("unclean-election", false, "allow a master from outside a group's SyncStateSet when none in it is alive (may lose committed events)")
	return func(ctx context.Context, e *env, args []string) error {
		if len(args) > 1 || (len(args) == 1 && args[0] != "init") {
			return usageErrorf("cluster takes no argument, or init")
		}
		var m uint8
		switch *mode {
		case "active-active":
			m = ctlapi.ModeActiveActive
		case "active-passive":
			m = ctlapi.ModeActivePassive
		default:
			return usageErrorf("--mode %q: want active-active or active-passive", *mode)
		}
		if len(args) == 1 && (*groups == 0 || *groups > ctlapi.GroupCountMax) {
			return usageErrorf("cluster init needs --groups between 1 and %d", ctlapi.GroupCountMax)
		}
		if *replicas > ctlapi.SyncStateSetSizeMax {
			return usageErrorf("--replicas %d: at most %d", *replicas, ctlapi.SyncStateSetSizeMax)
		}
		c, err := dialController(e)
		if err != nil {
			return err
		}
		defer c.Close()
		info, err := c.GetClusterInfo(ctx, ctlapi.ReadConsistent)
		if err != nil {
			return fmt.Errorf("controller: %w", err)
		}
		if len(args) == 1 {
			if info.Config.Groups != 0 && info.Config.Groups != uint32(*groups) {
				return fmt.Errorf("the cluster has %d groups already; the count cannot change (queues hash onto it)", info.Config.Groups)
			}
			if info.Config.Groups == 0 {
				if err := checkPeers(ctx, c); err != nil {
					return err
				}
			}
			cfg := ctlapi.ClusterConfig{Groups: uint32(*groups), Mode: m, UncleanElection: *unclean, Replicas: uint32(*replicas)}
			if err := c.SetClusterConfig(ctx, cfg); err != nil {
				return fmt.Errorf("controller: %w", err)
			}
			if info, err = c.GetClusterInfo(ctx, ctlapi.ReadConsistent); err != nil {
				return fmt.Errorf("controller: %w", err)
			}
		}
		out := map[string]any{"groups": info.Config.Groups, "mode": modeName(info.Config.Mode),
			"unclean_election": info.Config.UncleanElection, "version": info.Version, "replicas": info.Config.Replicas}
		if e.json {
			return writeJSON(e.stdout, out)
		}
		fmt.Fprintf(e.stdout, "groups %d, mode %s, unclean election %t, cluster version %d\n",
			info.Config.Groups, modeName(info.Config.Mode), info.Config.UncleanElection, info.Version)
		return nil
	}
}

// peerWaitMax bounds how long cluster init waits for registered brokers
// to publish their peer addresses: a broker started with -peer publishes
// its address after its first heartbeat (within a few hundred
// milliseconds of /readyz), one without -peer never does.
const peerWaitMax = 3 * time.Second

// checkPeers refuses the cluster init that creates the groups while a
// registered broker has published no peer address. The controller places
// groups on every broker registered, but only a broker running the
// groups' peer transport (-peer) holds them: one without it keeps its
// durable queues to itself, never learns the replicated ones (clients get
// not-found for queues declared through other brokers), and leaves the
// groups placed on it a replica short. Before this check such a cluster
// initialised and then failed silently.
func checkPeers(ctx context.Context, c *ctlclient.Client) error {
	wait := peerWaitMax
	if dl, ok := ctx.Deadline(); ok {
		wait = min(wait, time.Until(dl)/2)
	}
	give := time.Now().Add(wait)
	for {
		bs, err := c.GetBrokers(ctx, ctlapi.ReadConsistent)
		if err != nil {
			return fmt.Errorf("controller: %w", err)
		}
		var missing []string
		for _, b := range bs {
			_, ok, err := c.GetAttribute(ctx, ctlapi.ReadConsistent, groups.PeerAttribute(b.ID))
			if err != nil {
				return fmt.Errorf("controller: %w", err)
			}
			if !ok {
				name := fmt.Sprint(b.ID)
				if len(b.Addrs) > 0 {
					name += " (" + b.Addrs[0] + ")"
				}
				missing = append(missing, name)
			}
		}
		if len(missing) == 0 {
			return nil
		}
		if time.Now().After(give) {
			who := "broker " + missing[0] + " has"
			if len(missing) > 1 {
				who = "brokers " + strings.Join(missing, ", ") + " have"
			}
			return fmt.Errorf("cluster init refused: registered %s published no peer address: a broker started without -peer "+
				"(BERTH_PEER) runs no replication groups, so it would hold none of the groups placed on it and serve none of "+
				"the replicated queues (they would be not-found there); start every broker with -peer and run cluster init again "+
				"(a broker that is gone for good: berthctl clean-broker ID)", who)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
