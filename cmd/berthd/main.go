// Command berthd runs a Berth broker. With no flags it runs a single node
// with embedded defaults: clients on 127.0.0.1:7400, admin HTTP on
// 127.0.0.1:7480, a one-member controller on 127.0.0.1:7402.
//
// -controller-peers and -controller-id make it one member of a 3- or
// 5-member controller group; -role controller runs only that member.
// -controller-join starts a member to be added to a running group with
// "berthctl members add ID=ADDR".
//
// -config FILE reads settings from a TOML file whose keys are the flag
// names (docs/berth.example.toml); -print-config prints the effective
// configuration and exits; -version prints the build's version, commit and
// Go version and exits.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/berthmq/berth/internal/version"
	"github.com/berthmq/berth/journal"
	"github.com/berthmq/berth/replication/groups"
	"github.com/berthmq/berth/server"
	"github.com/berthmq/berth/shards"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	opts, err := parseArgs(args)
	if err != nil {
		if !errors.Is(err, errUsage) {
			fmt.Fprintln(os.Stderr, "berthd:", err)
		}
		return 2
	}
	switch {
	case opts.version:
		fmt.Println("berthd", version.Get())
		return 0
	case opts.printConfig:
		if err := printConfig(os.Stdout, opts.fs, opts.origins, opts.cmdline); err != nil {
			fmt.Fprintln(os.Stderr, "berthd:", err)
			return 1
		}
		return 0
	}
	runtime.SetMutexProfileFraction(opts.mutexFraction)
	runtime.SetBlockProfileRate(opts.blockRate)
	cfg, log := opts.cfg, opts.cfg.Logger
	if cfg.JournalFS, err = faultJournalFS(log); err != nil {
		fmt.Fprintln(os.Stderr, "berthd:", err)
		return 2
	}
	if l := goMemoryLimit(cfg.MemoryLimit, os.Getenv("GOMEMLIMIT")); l > 0 {
		debug.SetMemoryLimit(l)
		log.Info("berthd: the Go runtime's soft memory limit follows -memory-limit (GOMEMLIMIT overrides it)", "go_memory_limit_bytes", l)
	}
	// Signals are caught before the start: the client port opens inside
	// Start, and a SIGTERM or SIGINT that came between that and
	// signal.Notify killed the process without its graceful stop
	// (TestProcessConfig saw "signal: interrupt"). One that comes during
	// the start now stops the broker as soon as it is up.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	srv, err := server.Start(cfg)
	if err != nil {
		log.Error("berthd: start failed", "err", err)
		if errors.Is(err, server.ErrPeerRequired) {
			return 2 // a configuration error: a restart would only repeat it
		}
		return 1
	}
	sig := <-sigs
	for ; sig == syscall.SIGHUP; sig = <-sigs {
		// SIGHUP rereads the TLS files; open connections stay.
		reloaded := false
		for _, r := range []struct {
			set    bool
			what   string
			reload func() error
		}{
			{cfg.TLSAddr != "", "client TLS", srv.ReloadTLS},
			{cfg.AdminTLSCert != "", "admin HTTPS", srv.ReloadAdminTLS},
			{cfg.ClusterCA != "", "cluster TLS", srv.ReloadClusterTLS},
		} {
			if !r.set {
				continue
			}
			reloaded = true
			if err := r.reload(); err != nil {
				log.Error("berthd: "+r.what+" reload failed; keeping the certificates in use", "err", err)
			}
		}
		if !reloaded {
			log.Info("berthd: SIGHUP ignored: no TLS certificates in use")
		}
	}
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

	// version and printConfig ask for an action instead of a start; for
	// printConfig, fs holds the effective values, origins and cmdline
	// where they came from.
	version, printConfig bool
	fs                   *flag.FlagSet
	origins              origins
	cmdline              map[string]bool
}

// envPrefix starts the environment variable of every flag: -controller-id
// is BERTH_CONTROLLER_ID.
const envPrefix = "BERTH_"

// envName is the environment variable bound to the flag name.
func envName(flagName string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// flags holds the values of berthd's flags.
type flags struct {
	listen, admin, dataDir, controller, fsync, role    string
	controllerID, controllerPeers, advertise, logLevel string
	controllerAddrs                                    string
	logFormat, configPath, memoryLimit, frameSize      string
	listenTLS, tlsCert, tlsKey, tlsClientCA            string
	allowPlain                                         bool
	clusterCA, clusterCert, clusterKey, clusterSecret  string
	adminToken, adminTLSCert, adminTLSKey              string
	peer, peerAdvertise                                string
	printConfig, version                               bool
	shards, loops, heartbeatMs, ctlHeartbeatMs         int
	mutexFraction, blockRate                           int
	segmentBytes, checkpointRecords                    int64
	join, leaseRead                                    bool
	controllerWait                                     time.Duration
	brokerTimeout, leaderGrace                         time.Duration
	rebalance, groupLag, groupLease                    time.Duration
	consumeAtReplicas                                  bool
	ownSlice                                           time.Duration
	outboundMax                                        int64
	metricsQueueLimit                                  int
	outboundTimeout, handshakeTimeout                  time.Duration
}

// newFlagSet defines every berthd flag with its built-in default. Each
// flag's environment variable is bound by bindEnv, not here.
func newFlagSet() (*flag.FlagSet, *flags) {
	d := server.DefaultConfig()
	f := &flags{}
	fs := flag.NewFlagSet("berthd", flag.ContinueOnError)
	fs.StringVar(&f.listen, "listen", d.ClientAddr, "client listen address")
	fs.StringVar(&f.listenTLS, "listen-tls", "", "TLS client listen address, empty for none; needs -tls-cert and -tls-key")
	fs.StringVar(&f.tlsCert, "tls-cert", "", "PEM certificate (chain) of the TLS listener; reread on SIGHUP")
	fs.StringVar(&f.tlsKey, "tls-key", "", "PEM private key of -tls-cert; reread on SIGHUP")
	fs.StringVar(&f.tlsClientCA, "tls-client-ca", "", "PEM CA certificates; TLS clients must present a certificate they signed (mutual TLS); reread on SIGHUP")
	fs.BoolVar(&f.allowPlain, "allow-plain-without-tls", false, "accept PLAIN logins on the plaintext listener, where passwords cross the network in the clear")
	fs.StringVar(&f.admin, "admin", d.AdminAddr, "admin HTTP listen address, empty to disable")
	fs.StringVar(&f.adminToken, "admin-token", "", "bearer token that opens the admin HTTP's /v1, /ui and /debug/pprof paths, which then need credentials even on loopback; prefer the environment variable to the command line")
	fs.StringVar(&f.adminTLSCert, "admin-tls-cert", "", "PEM certificate of the admin HTTP, which then serves HTTPS only; reread on SIGHUP")
	fs.StringVar(&f.adminTLSKey, "admin-tls-key", "", "PEM private key of -admin-tls-cert; reread on SIGHUP")
	fs.StringVar(&f.clusterCA, "cluster-ca", "", "PEM cluster CA: peer and controller connections are mutual TLS with certificates it signed; reread on SIGHUP")
	fs.StringVar(&f.clusterCert, "cluster-cert", "", "PEM certificate of this node, signed by -cluster-ca, for serving and dialling peers and controllers; reread on SIGHUP")
	fs.StringVar(&f.clusterKey, "cluster-key", "", "PEM private key of -cluster-cert; reread on SIGHUP")
	fs.StringVar(&f.clusterSecret, "cluster-secret-file", "", "file holding the cluster secret every peer and controller connection proves (HMAC challenge-response; never sent)")
	fs.StringVar(&f.dataDir, "data", d.DataDir, "data directory")
	fs.IntVar(&f.shards, "shards", 0, "shard count, 0 = one per core")
	fs.IntVar(&f.loops, "loops", 0, "event loop count, 0 = one per core")
	fs.IntVar(&f.heartbeatMs, "heartbeat-ms", int(d.Heartbeat/time.Millisecond), "default heartbeat interval in ms")
	fs.Int64Var(&f.outboundMax, "outbound-max", d.OutboundMax, "bytes written to one connection and not yet read by its client; past it the connection gets no deliveries and no frames are taken from it until it drains, -1 = no cap")
	fs.DurationVar(&f.outboundTimeout, "outbound-timeout", d.OutboundTimeout, "close a connection that stays over -outbound-max this long")
	fs.DurationVar(&f.handshakeTimeout, "handshake-timeout", d.HandshakeTimeout, "close a connection that has not logged in this long after it was accepted")
	fs.StringVar(&f.frameSize, "frame-size-max", frameSizeDefault, "largest frame (header and body) a client may negotiate, so the largest message it may publish: 4KiB to 64MiB; a client that asks for less gets what it asked")
	fs.StringVar(&f.controller, "controller", "127.0.0.1:7402", "in-process controller address; durable wiring goes through it; empty to keep wiring in a local file")
	fs.StringVar(&f.fsync, "fsync", d.Fsync.String(), "journal fsync policy: always, or never (unsafe)")
	fs.Int64Var(&f.segmentBytes, "journal-segment-bytes", 0, "journal segment size in bytes, 0 = default 2 MiB")
	fs.Int64Var(&f.checkpointRecords, "journal-checkpoint-records", 0, "journal records per shard between checkpoints of the durable queues (also every 30 s and at a clean stop), 0 = default 262144; a restart after a crash replays up to this many records, or a quarter of the queues' messages if more")
	fs.StringVar(&f.memoryLimit, "memory-limit", memoryLimitDefault, "memory budget for messages: bytes (2GiB, 512MiB), a share of RAM (40%), or 0 for none; above half of it bodies are paged to disk, above it publishers are throttled")
	fs.IntVar(&f.metricsQueueLimit, "metrics-queue-limit", server.MetricsQueueLimitDefault, "most queues /metrics exports berth_queue_* series of; past it only their sums (/metrics/queues?prefix=P lists them), -1 = no limit")
	fs.IntVar(&f.mutexFraction, "mutex-profile-fraction", 0, "sample 1/n mutex contention events for /debug/pprof/mutex, 0 = off")
	fs.IntVar(&f.blockRate, "block-profile-rate", 0, "sample blocking events of this many ns for /debug/pprof/block, 0 = off")
	fs.StringVar(&f.role, "role", server.RoleBroker, "broker (serves clients, embeds its controller member) or controller (controller member only)")
	fs.StringVar(&f.controllerAddrs, "controller-addrs", "", "a controller group's member addresses as host:port,...: this broker uses that group (registration, heartbeats, wiring, users, groups) and runs no member of it; excludes -controller and -controller-peers")
	fs.StringVar(&f.controllerID, "controller-id", "", "this node's id in -controller-peers")
	fs.StringVar(&f.controllerPeers, "controller-peers", "", "controller group members as id=host:port,... (1, 3 or 5), this node included; overrides -controller")
	fs.BoolVar(&f.join, "controller-join", false, "start this controller member to be added to a running group (then run 'berthctl members add ID=ADDR'); -controller-peers lists this node and the members it knows")
	fs.BoolVar(&f.consumeAtReplicas, "consume-at-replicas", false, "serve a consumer of a replicated queue on its own broker when that broker holds a replica of the queue's group, taking the queue's ownership in turns with the other brokers that consume it, rather than proxying it to the group's master (experimental)")
	fs.DurationVar(&f.ownSlice, "own-slice", shards.OwnSliceDefault, "how long a broker that owns a replicated queue keeps it while consumers on another broker wait for it (with -consume-at-replicas)")
	fs.BoolVar(&f.leaseRead, "controller-lease-read", false, "serve the controller's consistent reads from the leader's lease instead of a heartbeat round each; relies on bounded clock drift")
	fs.DurationVar(&f.controllerWait, "controller-wait", server.ControllerWaitDefault, "how long a broker with a member of a 3- or 5-member controller group waits at start for the group to elect a leader before it gives up")
	fs.DurationVar(&f.groupLag, "group-lag", groups.LagDefault, "how long a group's follower may go without acknowledging before its master takes it out of the group's SyncStateSet (at least 20ms)")
	fs.DurationVar(&f.groupLease, "group-lease", 0, "how long the controller's answer to a heartbeat lets a group's master deliver, and how long a new master waits after its election before it delivers (so that a master it replaced has stopped); 0 = twice the heartbeat interval")
	fs.DurationVar(&f.rebalance, "group-rebalance", groups.RebalanceDefault, "how often a group's master hands the group back to its preferred master once that broker is in sync again; 0 = never")
	fs.DurationVar(&f.brokerTimeout, "controller-broker-timeout", server.ControllerBrokerTimeoutDefault, "a broker silent to the controller leader this long is dead (its groups get new masters); a closed heartbeat connection counts at once")
	fs.DurationVar(&f.leaderGrace, "controller-leader-grace", 0, "a new controller leader counts a broker dead that has not heartbeated to it within this long of its election; 0 = half of -controller-broker-timeout")
	fs.StringVar(&f.advertise, "advertise", "", "client address registered with the controller for others to dial, empty = the -listen address")
	fs.StringVar(&f.peer, "peer", "", "replication groups' peer listen address (default port 7401), empty = no groups; needs a controller")
	fs.StringVar(&f.peerAdvertise, "peer-advertise", "", "peer address published in the controller for other brokers to dial, empty = the -peer address")
	fs.IntVar(&f.ctlHeartbeatMs, "controller-heartbeat-ms", int(server.ControllerHeartbeatDefault/time.Millisecond), "interval of the broker's heartbeats to the controller in ms; keep it well under -controller-broker-timeout")
	fs.StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&f.logFormat, "log-format", "text", "log lines as text (key=value) or json")
	fs.StringVar(&f.configPath, "config", "", "read settings from this TOML file (keys are the flag names); flags and BERTH_* variables override it")
	fs.BoolVar(&f.printConfig, "print-config", false, "print the effective configuration as TOML and exit")
	fs.BoolVar(&f.version, "version", false, "print the version, commit and Go version and exit")
	fs.VisitAll(func(fl *flag.Flag) {
		if !notInEnv[fl.Name] {
			fl.Usage += " (env " + envName(fl.Name) + ")"
		}
	})
	return fs, f
}

// isStringFlag reports whether the flag holds a string, for which an empty
// value is a value (BERTH_ADMIN= disables the admin listener).
func isStringFlag(fl *flag.Flag) bool {
	g, ok := fl.Value.(flag.Getter)
	if !ok {
		return false
	}
	_, isString := g.Get().(string)
	return isString
}

// bindEnv sets every flag of fs whose environment variable is set, as if
// it had been given on the command line; call it before fs.Parse so that
// the command line wins. A value the flag does not accept is an error
// naming the variable, even when the command line sets the flag too. For
// flags other than strings, an empty or blank variable counts as unset.
// The action flags (-version, -print-config) have no variable.
func bindEnv(fs *flag.FlagSet, lookup func(string) (string, bool)) error {
	return bindEnvOrigins(fs, lookup, nil)
}

// bindEnvOrigins is bindEnv recording in o, if not nil, each variable that
// set its flag.
func bindEnvOrigins(fs *flag.FlagSet, lookup func(string) (string, bool), o origins) error {
	var errs []error
	fs.VisitAll(func(fl *flag.Flag) {
		if notInEnv[fl.Name] {
			return
		}
		key := envName(fl.Name)
		v, ok := lookup(key)
		if !ok {
			return
		}
		if !isStringFlag(fl) {
			v = strings.TrimSpace(v)
			if v == "" {
				return
			}
		}
		if err := fl.Value.Set(v); err != nil {
			errs = append(errs, fmt.Errorf("%s=%q: %v", key, v, envSetError(fl, err)))
			return
		}
		if o != nil {
			o[fl.Name] = key
		}
	})
	return errors.Join(errs...)
}

// envSetError says what a flag wants instead of the flag package's
// "parse error" wording.
func envSetError(fl *flag.Flag, err error) error {
	g, ok := fl.Value.(flag.Getter)
	if !ok {
		return err
	}
	switch g.Get().(type) {
	case bool:
		return errors.New("want true or false")
	case int, int64:
		if strings.Contains(err.Error(), "range") {
			return errors.New("integer out of range")
		}
		return errors.New("want an integer")
	case time.Duration:
		return errors.New("want a duration such as 500ms or 30s")
	}
	return err
}

// parseArgs turns flags, environment variables and the -config file into
// a checked server configuration; it starts nothing. Each source
// overrides the ones after it: the command line, the environment, the
// file, the defaults.
func parseArgs(args []string) (options, error) {
	// The command line alone first: it may ask for the version, and it
	// names the file unless BERTH_CONFIG does.
	cl, clf := newFlagSet()
	if err := cl.Parse(args); err != nil {
		return options{}, errUsage
	}
	if cl.NArg() > 0 {
		return options{}, fmt.Errorf("unexpected arguments %q", cl.Args())
	}
	if clf.version {
		return options{version: true}, nil
	}
	cmdline := map[string]bool{}
	cl.Visit(func(fl *flag.Flag) { cmdline[fl.Name] = true })
	path := clf.configPath
	if !cmdline["config"] {
		path, _ = os.LookupEnv(envName("config"))
	}

	fs, f := newFlagSet()
	fs.SetOutput(io.Discard) // the first parse reported any usage error
	o := origins{}
	if path != "" {
		if err := loadConfigFile(fs, path, o); err != nil {
			return options{}, err
		}
	}
	if err := bindEnvOrigins(fs, os.LookupEnv, o); err != nil {
		return options{}, err
	}
	if err := fs.Parse(args); err != nil {
		return options{}, errUsage
	}
	for name := range cmdline {
		delete(o, name)
	}
	id, peers, err := controllerFlags(f.controllerID, f.controllerPeers, f.join)
	if err != nil {
		return options{}, o.annotate(err, "controller-id", "controller-peers", "controller-join")
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(f.logLevel)); err != nil {
		return options{}, o.annotate(fmt.Errorf("bad -log-level %q: want debug, info, warn or error", f.logLevel), "log-level")
	}
	hopts := &slog.HandlerOptions{Level: level}
	var log *slog.Logger
	switch f.logFormat {
	case "text":
		log = slog.New(slog.NewTextHandler(os.Stderr, hopts))
	case "json":
		log = slog.New(slog.NewJSONHandler(os.Stderr, hopts))
	default:
		return options{}, o.annotate(fmt.Errorf("-log-format %q: want text or json", f.logFormat), "log-format")
	}
	// What the flags' text cannot mean is refused here; the settings it
	// gives are checked by the server's own Validate below.
	cfg := server.DefaultConfig()
	cfg.Logger = log
	if cfg.Fsync, err = parseFsync(f.fsync); err != nil {
		return options{}, o.annotate(err, "fsync")
	}
	if cfg.FrameSizeMax, err = parseFrameSize(f.frameSize); err != nil {
		return options{}, o.annotate(err, "frame-size-max")
	}
	if cfg.MemoryLimit, err = parseMemoryLimit(f.memoryLimit); err != nil {
		return options{}, o.annotate(err, "memory-limit")
	}
	if cfg.Heartbeat, err = millis("heartbeat-ms", f.heartbeatMs); err != nil {
		return options{}, o.annotate(err, "heartbeat-ms")
	}
	if cfg.ControllerHeartbeat, err = millis("controller-heartbeat-ms", f.ctlHeartbeatMs); err != nil {
		return options{}, o.annotate(err, "controller-heartbeat-ms")
	}
	// In server.Config a zero (and for some a negative value) stands for
	// the default; these flags show theirs, so such a value given for one
	// is a mistake, not a request for the default.
	for _, z := range []struct {
		key  string
		bad  bool
		v    any
		want string
	}{
		{"outbound-max", f.outboundMax == 0 || f.outboundMax < -1, f.outboundMax, "a positive byte count, or -1 for no cap"},
		{"outbound-timeout", f.outboundTimeout <= 0, f.outboundTimeout, "a positive duration"},
		{"handshake-timeout", f.handshakeTimeout <= 0, f.handshakeTimeout, "a positive duration"},
		{"metrics-queue-limit", f.metricsQueueLimit == 0 || f.metricsQueueLimit < -1, f.metricsQueueLimit, "a positive queue count, or -1 for no limit"},
		{"controller-heartbeat-ms", f.ctlHeartbeatMs <= 0, f.ctlHeartbeatMs, "a positive interval"},
		{"controller-wait", f.controllerWait <= 0, f.controllerWait, "a positive duration"},
		{"controller-broker-timeout", f.brokerTimeout <= 0, f.brokerTimeout, "a positive duration"},
		{"group-lag", f.groupLag == 0, f.groupLag, "20ms to 1h"},
		{"own-slice", f.ownSlice <= 0, f.ownSlice, "a positive duration"},
		{"group-rebalance", f.rebalance < 0, f.rebalance, "a positive interval, or 0 for none"},
	} {
		if z.bad {
			return options{}, o.annotate(fmt.Errorf("-%s %v: want %s", z.key, z.v, z.want), z.key)
		}
	}
	cfg.ClientAddr, cfg.AdminAddr, cfg.DataDir = f.listen, f.admin, f.dataDir
	cfg.Shards, cfg.Loops = f.shards, f.loops
	cfg.OutboundMax, cfg.OutboundTimeout, cfg.HandshakeTimeout = f.outboundMax, f.outboundTimeout, f.handshakeTimeout
	cfg.MetricsQueueLimit = f.metricsQueueLimit
	cfg.JournalSegmentBytes, cfg.JournalCheckpointRecords = f.segmentBytes, int(f.checkpointRecords)
	cfg.Role, cfg.ControllerAddr, cfg.ControllerID, cfg.ControllerPeers = f.role, f.controller, id, peers
	if addrs := strings.TrimSpace(f.controllerAddrs); addrs != "" {
		// -controller's default (the one-member controller of make run)
		// gives way; set explicitly, it conflicts (validateController).
		if _, set := o["controller"]; !set && !cmdline["controller"] {
			cfg.ControllerAddr = ""
		}
		for _, a := range strings.Split(addrs, ",") {
			cfg.ControllerAddrs = append(cfg.ControllerAddrs, strings.TrimSpace(a))
		}
	}
	cfg.ControllerJoin, cfg.ControllerLeaseRead, cfg.ControllerWait = f.join, f.leaseRead, f.controllerWait
	cfg.ControllerBrokerTimeout, cfg.ControllerLeaderGrace = f.brokerTimeout, f.leaderGrace
	cfg.AdvertiseAddr = f.advertise
	cfg.PeerAddr, cfg.PeerAdvertise = f.peer, f.peerAdvertise
	cfg.GroupLag, cfg.GroupLease = f.groupLag, f.groupLease
	cfg.ConsumeAtReplicas, cfg.OwnSlice = f.consumeAtReplicas, f.ownSlice
	cfg.GroupRebalance = f.rebalance
	if f.rebalance == 0 {
		cfg.GroupRebalance = -1 // the flag's 0 is none, the server's the default
	}
	cfg.TLSAddr, cfg.TLSCert, cfg.TLSKey, cfg.TLSClientCA = f.listenTLS, f.tlsCert, f.tlsKey, f.tlsClientCA
	cfg.AllowPlainWithoutTLS = f.allowPlain
	cfg.ClusterCA, cfg.ClusterCert, cfg.ClusterKey, cfg.ClusterSecretFile = f.clusterCA, f.clusterCert, f.clusterKey, f.clusterSecret
	cfg.AdminToken, cfg.AdminTLSCert, cfg.AdminTLSKey = f.adminToken, f.adminTLSCert, f.adminTLSKey
	if err := cfg.Validate(); err != nil {
		var ce *server.ConfigError
		if errors.As(err, &ce) {
			err = o.annotate(err, ce.Keys...)
		}
		return options{}, err
	}
	return options{cfg: cfg, mutexFraction: f.mutexFraction, blockRate: f.blockRate,
		printConfig: f.printConfig, fs: fs, origins: o, cmdline: cmdline}, nil
}

// parseFsync reads -fsync; empty (BERTH_FSYNC=) is the default policy.
func parseFsync(name string) (journal.FsyncPolicy, error) {
	if name == "" {
		return server.DefaultConfig().Fsync, nil
	}
	p, err := journal.ParseFsyncPolicy(name)
	if err != nil {
		return 0, fmt.Errorf("-fsync %q: want %s", name, strings.Join(journal.FsyncPolicyNames(), " or "))
	}
	return p, nil
}

// millis turns a flag in milliseconds into a duration. Only what no
// duration holds is refused here; the server checks the interval.
func millis(key string, ms int) (time.Duration, error) {
	if limit := int(math.MaxInt64 / time.Millisecond); ms > limit || ms < -limit {
		return 0, fmt.Errorf("-%s %d: integer out of range", key, ms)
	}
	return time.Duration(ms) * time.Millisecond, nil
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
