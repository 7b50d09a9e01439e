package main

import (
	"context"
	"flag"
	"fmt"

	"github.com/berthmq/berth/controlplane/ctlapi"
)

// clusterCmd: "cluster init" sets the cluster's group count and mode;
// "cluster" alone shows them.
func clusterCmd(fs *flag.FlagSet) func(context.Context, *env, []string) error {
	groups := fs.Uint("groups", 0, "replication groups (init: required; fixed once set, queues hash onto them)")
	mode := fs.String("mode", "active-active", "active-active, or active-passive (one primary takes every client)")
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
