// Command berthd runs a Berth broker. With no flags it runs a single node
// with embedded defaults: clients on 127.0.0.1:7400, admin HTTP on
// 127.0.0.1:7480, a one-member controller on 127.0.0.1:7402.
//
// -controller-peers and -controller-id make it one member of a 3- or
// 5-member controller group; -role controller runs only that member.
// -controller-join starts a member to be added to a running group with
// "berthctl members add ID=ADDR".
package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/berthmq/berth/server"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func envOr(key, def string) string {
	if v, ok := os.LookupEnv(key); ok {
		return v
	}
	return def
}

func envInt(key string, def int) int {
	if v, ok := os.LookupEnv(key); ok {
		if n, err := strconv.Atoi(v); err == nil {
			return n
		}
	}
	return def
}

// envBool reads a boolean variable; unset or empty is def.
func envBool(key string, def bool) (bool, error) {
	v, ok := os.LookupEnv(key)
	if !ok || strings.TrimSpace(v) == "" {
		return def, nil
	}
	b, err := strconv.ParseBool(strings.TrimSpace(v))
	if err != nil {
		return false, fmt.Errorf("%s=%q: want true or false", key, v)
	}
	return b, nil
}

func run(args []string) int {
	opts, err := parseArgs(args)
	if err != nil {
		if !errors.Is(err, errUsage) {
			fmt.Fprintln(os.Stderr, "berthd:", err)
		}
		return 2
	}
	runtime.SetMutexProfileFraction(opts.mutexFraction)
	runtime.SetBlockProfileRate(opts.blockRate)
	cfg, log := opts.cfg, opts.cfg.Logger
	if cfg.JournalFS, err = faultJournalFS(log); err != nil {
		fmt.Fprintln(os.Stderr, "berthd:", err)
		return 2
	}
	srv, err := server.Start(cfg)
	if err != nil {
		log.Error("berthd: start failed", "err", err)
		return 1
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	sig := <-sigs
	log.Info("berthd: shutting down", "signal", sig.String())
	if err := srv.Close(); err != nil {
		log.Error("berthd: shutdown", "err", err)
		return 1
	}
	log.Info("berthd: stopped")
	return 0
}

// errUsage reports a flag error the flag package has already printed.
var errUsage = errors.New("usage")

type options struct {
	cfg                      server.Config
	mutexFraction, blockRate int
}

// parseArgs turns flags and environment variables into a checked server
// configuration; it starts nothing.
func parseArgs(args []string) (options, error) {
	d := server.DefaultConfig()
	fs := flag.NewFlagSet("berthd", flag.ContinueOnError)
	listen := fs.String("listen", envOr("BERTH_LISTEN", d.ClientAddr), "client listen address (env BERTH_LISTEN)")
	admin := fs.String("admin", envOr("BERTH_ADMIN", d.AdminAddr), "admin HTTP listen address, empty to disable (env BERTH_ADMIN)")
	dataDir := fs.String("data", envOr("BERTH_DATA", d.DataDir), "data directory (env BERTH_DATA)")
	shardCount := fs.Int("shards", envInt("BERTH_SHARDS", 0), "shard count, 0 = one per core (env BERTH_SHARDS)")
	loops := fs.Int("loops", envInt("BERTH_LOOPS", 0), "event loop count, 0 = one per core (env BERTH_LOOPS)")
	heartbeat := fs.Int("heartbeat-ms", envInt("BERTH_HEARTBEAT_MS", int(d.HeartbeatMs)), "default heartbeat interval in ms (env BERTH_HEARTBEAT_MS)")
	controller := fs.String("controller", envOr("BERTH_CONTROLLER", "127.0.0.1:7402"), "in-process controller address; durable wiring goes through it; empty to keep wiring in a local file (env BERTH_CONTROLLER)")
	fsync := fs.String("fsync", envOr("BERTH_FSYNC", d.Fsync), "journal fsync policy: always, or never (unsafe) (env BERTH_FSYNC)")
	segmentBytes := fs.Int64("journal-segment-bytes", int64(envInt("BERTH_JOURNAL_SEGMENT_BYTES", 0)), "journal segment size in bytes, 0 = default 2 MiB (env BERTH_JOURNAL_SEGMENT_BYTES)")
	mutexFraction := fs.Int("mutex-profile-fraction", envInt("BERTH_MUTEX_PROFILE_FRACTION", 0), "sample 1/n mutex contention events for /debug/pprof/mutex, 0 = off (env BERTH_MUTEX_PROFILE_FRACTION)")
	blockRate := fs.Int("block-profile-rate", envInt("BERTH_BLOCK_PROFILE_RATE", 0), "sample blocking events of this many ns for /debug/pprof/block, 0 = off (env BERTH_BLOCK_PROFILE_RATE)")
	role := fs.String("role", envOr("BERTH_ROLE", server.RoleBroker), "broker (serves clients, embeds its controller member) or controller (controller member only) (env BERTH_ROLE)")
	controllerID := fs.String("controller-id", envOr("BERTH_CONTROLLER_ID", ""), "this node's id in -controller-peers (env BERTH_CONTROLLER_ID)")
	controllerPeers := fs.String("controller-peers", envOr("BERTH_CONTROLLER_PEERS", ""), "controller group members as id=host:port,... (1, 3 or 5), this node included; overrides -controller (env BERTH_CONTROLLER_PEERS)")
	joinDefault, err := envBool("BERTH_CONTROLLER_JOIN", false)
	if err != nil {
		return options{}, err
	}
	join := fs.Bool("controller-join", joinDefault, "start this controller member to be added to a running group (then run 'berthctl members add ID=ADDR'); -controller-peers lists this node and the members it knows (env BERTH_CONTROLLER_JOIN)")
	leaseDefault, err := envBool("BERTH_CONTROLLER_LEASE_READ", false)
	if err != nil {
		return options{}, err
	}
	leaseRead := fs.Bool("controller-lease-read", leaseDefault, "serve the controller's consistent reads from the leader's lease instead of a heartbeat round each; relies on bounded clock drift (env BERTH_CONTROLLER_LEASE_READ)")
	advertise := fs.String("advertise", envOr("BERTH_ADVERTISE", ""), "client address registered with the controller for others to dial, empty = the -listen address (env BERTH_ADVERTISE)")
	ctlHeartbeat := fs.Int("controller-heartbeat-ms", envInt("BERTH_CONTROLLER_HEARTBEAT_MS", int(server.ControllerHeartbeatDefault/time.Millisecond)), "interval of the broker's heartbeats to the controller in ms; keep it well under the controller's 3 s broker timeout (env BERTH_CONTROLLER_HEARTBEAT_MS)")
	logLevel := fs.String("log-level", envOr("BERTH_LOG_LEVEL", "info"), "debug, info, warn or error (env BERTH_LOG_LEVEL)")
	if err := fs.Parse(args); err != nil {
		return options{}, errUsage
	}
	if fs.NArg() > 0 {
		return options{}, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	id, peers, err := controllerFlags(*controllerID, *controllerPeers, *join)
	if err != nil {
		return options{}, err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return options{}, fmt.Errorf("bad -log-level: %v", err)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	cfg := d
	cfg.ClientAddr, cfg.AdminAddr, cfg.DataDir = *listen, *admin, *dataDir
	cfg.Shards, cfg.Loops, cfg.HeartbeatMs = *shardCount, *loops, uint32(*heartbeat)
	cfg.Logger = log
	cfg.Fsync = *fsync
	cfg.ControllerAddr = *controller
	cfg.JournalSegmentBytes = *segmentBytes
	cfg.Role, cfg.ControllerID, cfg.ControllerPeers = *role, id, peers
	cfg.ControllerJoin = *join
	cfg.AdvertiseAddr = *advertise
	cfg.ControllerLeaseRead = *leaseRead
	if *ctlHeartbeat <= 0 {
		return options{}, fmt.Errorf("-controller-heartbeat-ms %d: want a positive interval", *ctlHeartbeat)
	}
	cfg.ControllerHeartbeat = time.Duration(*ctlHeartbeat) * time.Millisecond
	if *advertise != "" {
		if _, _, err := net.SplitHostPort(*advertise); err != nil {
			return options{}, fmt.Errorf("-advertise %q: want host:port", *advertise)
		}
	}
	if err := cfg.CheckController(); err != nil {
		return options{}, err
	}
	return options{cfg: cfg, mutexFraction: *mutexFraction, blockRate: *blockRate}, nil
}

// controllerFlags parses -controller-id and -controller-peers. Peers look
// like "1=127.0.0.1:7402,2=127.0.0.1:7412,3=127.0.0.1:7422": 1, 3 or 5
// members with distinct ids from 1 and distinct host:port addresses, and
// the id must name one of them. Both empty means no group (the
// -controller flag's one-member controller). With join the list is this
// node and the running members it knows: 2 to 6 entries.
func controllerFlags(idText, peersText string, join bool) (uint64, map[uint64]string, error) {
	idText, peersText = strings.TrimSpace(idText), strings.TrimSpace(peersText)
	if peersText == "" {
		if idText != "" {
			return 0, nil, errors.New("-controller-id needs -controller-peers")
		}
		if join {
			return 0, nil, errors.New("-controller-join needs -controller-peers (this node and at least one running member) and -controller-id")
		}
		return 0, nil, nil
	}
	peers, err := parsePeers(peersText, join)
	if err != nil {
		return 0, nil, err
	}
	if idText == "" {
		return 0, nil, errors.New("-controller-peers needs -controller-id (this node's id in the list)")
	}
	id, err := strconv.ParseUint(idText, 10, 64)
	if err != nil || id == 0 {
		return 0, nil, fmt.Errorf("-controller-id %q: want a positive integer", idText)
	}
	if _, ok := peers[id]; !ok {
		return 0, nil, fmt.Errorf("-controller-id %d is not in -controller-peers %q", id, peersText)
	}
	return id, peers, nil
}

// peersMax bounds the entries parsed from -controller-peers; a joining
// member may list a full group of 5 and itself.
const (
	peersMax     = 5
	peersJoinMax = 6
)

func parsePeers(text string, join bool) (map[uint64]string, error) {
	parts := strings.Split(text, ",")
	if join && len(parts) > peersJoinMax {
		return nil, fmt.Errorf("-controller-peers: a joining member lists itself and at most %d members, not %d entries", peersJoinMax-1, len(parts))
	}
	if !join && len(parts) > peersMax {
		return nil, fmt.Errorf("-controller-peers: a controller group has 1, 3 or 5 members, not %d", len(parts))
	}
	peers := make(map[uint64]string, len(parts))
	owner := make(map[string]uint64, len(parts))
	for _, p := range parts {
		p = strings.TrimSpace(p)
		idText, addr, ok := strings.Cut(p, "=")
		if !ok {
			return nil, fmt.Errorf("-controller-peers: entry %q: want id=host:port", p)
		}
		idText, addr = strings.TrimSpace(idText), strings.TrimSpace(addr)
		id, err := strconv.ParseUint(idText, 10, 64)
		if err != nil || id == 0 {
			return nil, fmt.Errorf("-controller-peers: entry %q: id must be a positive integer", p)
		}
		host, port, err := net.SplitHostPort(addr)
		if err != nil || host == "" {
			return nil, fmt.Errorf("-controller-peers: entry %q: want host:port after the =", p)
		}
		if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
			return nil, fmt.Errorf("-controller-peers: entry %q: port must be 1..65535", p)
		}
		if _, dup := peers[id]; dup {
			return nil, fmt.Errorf("-controller-peers: id %d appears twice", id)
		}
		if other, dup := owner[addr]; dup {
			return nil, fmt.Errorf("-controller-peers: ids %d and %d share the address %s", other, id, addr)
		}
		peers[id], owner[addr] = addr, id
	}
	switch n := len(peers); {
	case join && n < 2:
		return nil, errors.New("-controller-peers: a joining member lists itself and at least one running member")
	case !join && n != 1 && n != 3 && n != 5:
		return nil, fmt.Errorf("-controller-peers: a controller group has 1, 3 or 5 members, not %d", n)
	}
	return peers, nil
}
