package server

// Configuration. A Server's settings sit in one flat Config, grouped below
// by the component that reads them. Start makes them whole in two steps,
// as pebble's Options do; only what needs files or the controller (the
// certificates, the users) is checked later, where Start reads it:
//
//  1. EnsureDefaults gives every zero setting its default. A zero left to
//     the component that reads it (GroupLag, GroupRebalance, GroupLease,
//     ControllerLeaderGrace, the journal and ring sizes) is said so in
//     the field's comment.
//  2. Validate refuses the settings Start cannot run with, each refusal a
//     *ConfigError naming the settings as berthd's flags and configuration
//     keys do, so that berthd reports where each got its value. The
//     component checks sit by their components (validateController in
//     controller.go, validateAdmin in adminauth.go, validateClusterPorts
//     in clusterauth.go); Validate calls them all.
//
// berthd turns text into these typed values (the -fsync name, the
// -heartbeat-ms milliseconds, byte sizes) and refuses what the text
// cannot mean, then calls Validate, before it starts anything.

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/berthmq/berth/journal"
	"github.com/berthmq/berth/wire"
)

// Config configures a Server.
type Config struct {
	Logger *slog.Logger

	// The client listener and its sessions.

	ClientAddr string // host:port; port 0 picks a free one
	Loops      int    // event loops; 0: one per core
	// AdvertiseAddr is the client address the broker registers with the
	// controller, for other nodes and clients to dial; empty means the
	// address the client listener is bound to (which must then not be a
	// wildcard such as 0.0.0.0).
	AdvertiseAddr string
	ServerName    string // WELCOME's server name, cut to wire.NameLenMax
	// Heartbeat is the heartbeat interval offered to clients that ask
	// for none; WELCOME carries it in whole milliseconds (1 ms to
	// 2^32-1 ms).
	Heartbeat    time.Duration
	FrameSizeMax uint32 // largest frame the server accepts
	WindowMax    uint32 // most uncompleted commands per session
	CreditMax    uint32 // most credit per consumer
	// InboundMax bounds the bytes buffered from one connection that the
	// server has not yet taken; past it the connection is closed.
	InboundMax int
	// OutboundMax caps the bytes written to one connection that its
	// client has not read yet; past it the connection gets no deliveries
	// and takes no frames until it drains to half (outbound.go). 0 means
	// OutboundMaxDefault, negative no cap.
	OutboundMax int64
	// OutboundTimeout closes a connection that stays over OutboundMax this
	// long (0: OutboundTimeoutDefault).
	OutboundTimeout time.Duration
	// HandshakeTimeout closes a connection that has not logged in this
	// long after it was accepted (0: HandshakeTimeoutDefault).
	HandshakeTimeout time.Duration
	// AllowPlainWithoutTLS lets clients log in with PLAIN on the
	// plaintext listener, where their password crosses the network in
	// the clear.
	AllowPlainWithoutTLS bool

	// The TLS client listener (tls.go).

	// TLSAddr is the TLS client address (host:port; port 0 picks a free
	// one); "" runs no TLS listener. It needs TLSCert and TLSKey, PEM
	// files; TLSClientCA, if set, is a PEM file of the CAs whose client
	// certificates are required (mutual TLS). Server.ReloadTLS rereads
	// all three.
	TLSAddr, TLSCert, TLSKey, TLSClientCA string

	// The shards and their journals.

	DataDir string // "" keeps nothing on disk
	Shards  int    // 0: one per core; a data directory keeps its own count
	// RingSize is the capacity of each shard's command ring (0: the
	// shards' default). Tests make it tiny to exercise full rings.
	RingSize int
	// MemoryLimit is the memory budget for messages in bytes, split
	// evenly across the shards; 0 means none. Above half of a shard's
	// share its new message bodies are paged out to disk, above the share
	// its publishers are throttled (shards/memory.go). berthd's default is
	// a share of the machine's RAM.
	MemoryLimit int64
	// Fsync is the journal's policy, for the shards' journals and the
	// group journal: journal.FsyncAlways (the zero value; a completion
	// follows the fsync that covers its record) or journal.FsyncNever (a
	// completion follows the write; unsafe: a machine crash loses
	// completed work).
	Fsync journal.FsyncPolicy
	// JournalFS, if set, replaces the real file system under the journal
	// (tests inject faults with it).
	JournalFS journal.FS
	// GroupJournalFS, if set, replaces the real file system under the
	// group journal (tests inject faults with journal.FaultFS).
	GroupJournalFS journal.FS
	// JournalSegmentBytes overrides the journal segment size (0: the
	// journal's default).
	JournalSegmentBytes int64
	// JournalCheckpointRecords overrides the journal records per shard
	// between checkpoints (shards.JournalConfig.CheckpointRecords; 0: its
	// default).
	JournalCheckpointRecords int

	// The controller (controller.go) and this broker's registration with
	// it (registration.go).

	// Role is RoleBroker (default, "" too) or RoleController: a
	// controller-only node runs its controller member and the admin HTTP
	// (/healthz, /readyz, /metrics, /v1/status), no client listener and
	// no shards.
	Role string
	// ControllerAddr is where the in-process one-member controller
	// listens (single-node mode; berthd's default is 127.0.0.1:7402).
	// Durable wiring goes through it. "" runs without a controller, with
	// the durable wiring in a local file. It needs DataDir.
	ControllerAddr string
	// ControllerPeers maps every member of the controller group, this
	// node included, from raft id to address (raft traffic and the
	// controller service share it). With 3 or 5 members this node runs
	// member ControllerID and ControllerAddr is ignored; with one member
	// it acts as ControllerAddr = ControllerPeers[ControllerID]. It needs
	// DataDir (the log lives in DataDir/controller). See
	// validateController.
	ControllerPeers map[uint64]string
	ControllerID    uint64
	// ControllerAddrs are the client addresses of a controller group's
	// members, for a broker that runs no member of it: registration,
	// heartbeats, wiring, users and groups go through them (any member
	// answers or names its leader). The controller may run on
	// controller-only nodes or inside other brokers; a group of 3 or 5
	// members so serves any number of brokers. It excludes
	// ControllerAddr and ControllerPeers and needs DataDir.
	ControllerAddrs []string
	// ControllerJoin starts this node's member as one being added to a
	// running group: it has no configuration until the leader, once an
	// operator ran "berthctl members add ID=ADDR", sends it a snapshot.
	// ControllerPeers then holds this node and the members it knows (2 to
	// 6 entries, not necessarily 1, 3 or 5), and Start does not wait for a
	// leader: the new member knows none until it is added. Keeping it set
	// on later restarts is harmless: a member with a configuration ignores
	// it.
	ControllerJoin bool
	// ControllerLeaseRead has a 3- or 5-member controller serve consistent
	// reads from the leader's lease instead of a heartbeat round each
	// (controlplane.Config.LeaseRead); it relies on bounded clock drift.
	ControllerLeaseRead bool
	// ControllerWait bounds how long Start waits for a 3- or 5-member
	// group to elect a leader before restoring the wiring (default
	// ControllerWaitDefault).
	ControllerWait time.Duration
	// ControllerHeartbeat is the interval of a broker's heartbeats to the
	// controller (default ControllerHeartbeatDefault); it must be under
	// the controller's broker timeout, and should be well under it. See
	// registration.go.
	ControllerHeartbeat time.Duration
	// ControllerBrokerTimeout and ControllerLeaderGrace are the embedded
	// controller member's controlplane.Config.BrokerTimeout and
	// LeaderGrace. The timeout's default is ControllerBrokerTimeoutDefault
	// (800 ms); a zero grace is left to controlplane (half the timeout),
	// and a grace may not exceed the timeout.
	ControllerBrokerTimeout time.Duration
	ControllerLeaderGrace   time.Duration

	// The replication groups (registration.go, package replication).

	// PeerAddr is where this broker's replication-group transport listens
	// (host:port); "" runs no groups. It needs a controller and DataDir
	// (the group log is journaled). The broker publishes PeerAdvertise
	// (default: the bound address) in the controller, and replicates the
	// groups whose replica set the controller placed it in ("berthctl
	// cluster init --groups G --replicas R"); it forwards publishes for
	// the others to their masters.
	PeerAddr, PeerAdvertise string
	// GroupRebalance is how often a group's master looks for a
	// preferred master back in sync to hand the group over to
	// (replication/groups/rebalance.go): 0 means groups.RebalanceDefault, a
	// negative value turns it off.
	GroupRebalance time.Duration
	// GroupLag is how long a group's follower may go without
	// acknowledging before its master takes it out of the SyncStateSet:
	// 20 ms to 1 h, or 0 for groups.LagDefault (500 ms).
	GroupLag time.Duration
	// ConsumeAtReplicas serves a consumer of a replicated queue on its
	// own broker when that broker holds a replica of the queue's group,
	// which then takes the queue's ownership in turns with the other
	// brokers consuming it (shards/own.go), rather than proxying it to the
	// group's master. OwnSlice is how long an owner keeps a queue while
	// another broker wants it (0: shards.OwnSliceDefault).
	ConsumeAtReplicas bool
	OwnSlice          time.Duration
	// GroupLease is how long the controller's answer to a heartbeat lets
	// a group's master deliver, and how long a new master waits after its
	// election before it delivers (group.Config.Lease): more than
	// ControllerHeartbeat up to a minute, or 0 for twice
	// ControllerHeartbeat.
	GroupLease time.Duration

	// Proof of cluster membership on the peer and controller ports
	// (clusterauth.go).

	// ClusterCA, ClusterCert and ClusterKey (PEM files) make every
	// connection on the peer and controller ports, both ways, mutual TLS
	// with certificates the cluster CA signed; ClusterSecretFile holds a
	// shared secret every such connection proves (clusterauth.go). With
	// none, those ports must listen on loopback.
	ClusterCA, ClusterCert, ClusterKey, ClusterSecretFile string

	// The admin HTTP (admin.go, adminauth.go).

	AdminAddr string // "" = no admin HTTP
	// AdminToken, if set, opens the admin HTTP's guarded paths to
	// "Authorization: Bearer AdminToken" and makes them need credentials
	// even on loopback (adminauth.go). AdminTLSCert and AdminTLSKey make
	// the admin port serve HTTPS.
	AdminToken, AdminTLSCert, AdminTLSKey string
	// MetricsQueueLimit is the most queues /metrics exports series of
	// one by one; past it only their sums are (berth_queue_metrics_omitted
	// says so) and /metrics/queues has them. 0: MetricsQueueLimitDefault;
	// negative: no limit.
	MetricsQueueLimit int
}

// DefaultConfig returns the embedded defaults: clients on 127.0.0.1:7400,
// admin HTTP on 127.0.0.1:7480, one shard and one loop per core.
func DefaultConfig() Config {
	return Config{
		ClientAddr:       "127.0.0.1:7400",
		AdminAddr:        "127.0.0.1:7480",
		DataDir:          "data",
		Heartbeat:        5 * time.Second,
		FrameSizeMax:     wire.FrameSizeDefault,
		WindowMax:        1 << 16,
		CreditMax:        1 << 16,
		InboundMax:       64 << 20,
		OutboundMax:      OutboundMaxDefault,
		OutboundTimeout:  OutboundTimeoutDefault,
		HandshakeTimeout: HandshakeTimeoutDefault,
		ServerName:       "berthd",
		Fsync:            journal.FsyncAlways,
	}
}

// MetricsQueueLimitDefault is Config.MetricsQueueLimit's default: about
// 110,000 series, a few megabytes per scrape.
const MetricsQueueLimitDefault = 10000

// heartbeatMsMax is the longest Heartbeat: WELCOME carries it in a uint32
// of milliseconds.
const heartbeatMsMax = math.MaxUint32

// EnsureDefaults gives every zero setting its default (see the top of
// this file for the ones left to their components). It is idempotent.
func (c *Config) EnsureDefaults() {
	d := DefaultConfig()
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.ClientAddr == "" {
		c.ClientAddr = "127.0.0.1:0"
	}
	if c.Loops <= 0 {
		c.Loops = numCPU()
	}
	if c.ServerName == "" {
		c.ServerName = d.ServerName
	}
	if len(c.ServerName) > wire.NameLenMax {
		c.ServerName = c.ServerName[:wire.NameLenMax] // WELCOME carries at most this much
	}
	if c.Heartbeat == 0 {
		c.Heartbeat = d.Heartbeat
	}
	if c.FrameSizeMax == 0 {
		c.FrameSizeMax = d.FrameSizeMax
	}
	c.FrameSizeMax = min(max(c.FrameSizeMax, wire.FrameSizeMin), wire.FrameSizeMax)
	if c.WindowMax == 0 {
		c.WindowMax = d.WindowMax
	}
	if c.CreditMax == 0 {
		c.CreditMax = d.CreditMax
	}
	if c.InboundMax == 0 {
		c.InboundMax = d.InboundMax
	}
	if c.OutboundMax == 0 {
		c.OutboundMax = d.OutboundMax // a negative one stays: no cap
	}
	if c.OutboundTimeout <= 0 {
		c.OutboundTimeout = d.OutboundTimeout
	}
	if c.HandshakeTimeout <= 0 {
		c.HandshakeTimeout = d.HandshakeTimeout
	}
	if c.Shards <= 0 {
		c.Shards = numCPU()
	}
	if c.Role == "" {
		c.Role = RoleBroker
	}
	if c.ControllerWait <= 0 {
		c.ControllerWait = ControllerWaitDefault
	}
	if c.ControllerHeartbeat <= 0 {
		c.ControllerHeartbeat = ControllerHeartbeatDefault
	}
	if c.ControllerBrokerTimeout <= 0 {
		c.ControllerBrokerTimeout = ControllerBrokerTimeoutDefault
	}
	if c.MetricsQueueLimit == 0 {
		c.MetricsQueueLimit = MetricsQueueLimitDefault
	}
}

// ConfigError is a setting Validate refuses. Keys are the settings the
// check involves, the refused one first, named as berthd's flags and
// configuration-file keys are (docs/OPERATIONS.md); berthd adds where
// each of them got its value.
type ConfigError struct {
	Keys []string
	err  error
}

func (e *ConfigError) Error() string { return "server: " + e.err.Error() }

// Unwrap returns the cause, if the refusal wraps one.
func (e *ConfigError) Unwrap() error { return errors.Unwrap(e.err) }

// configErrorf is a ConfigError about keys; format may wrap a cause with
// %w.
func configErrorf(keys []string, format string, args ...any) error {
	return &ConfigError{Keys: keys, err: fmt.Errorf(format, args...)}
}

// Validate reports the first setting Start cannot run with, as a
// *ConfigError. It checks a copy with the defaults applied, so it may be
// called before EnsureDefaults as well as after; it neither reads files
// nor listens.
func (c *Config) Validate() error {
	d := *c
	d.EnsureDefaults()
	if d.Heartbeat < time.Millisecond || d.Heartbeat > heartbeatMsMax*time.Millisecond {
		return configErrorf([]string{"heartbeat-ms"}, "-heartbeat-ms %s: want 0 (the default) or a positive interval, at most %d ms", msText(d.Heartbeat), uint64(heartbeatMsMax))
	}
	if d.AdvertiseAddr != "" {
		if _, _, err := net.SplitHostPort(d.AdvertiseAddr); err != nil {
			return configErrorf([]string{"advertise"}, "-advertise %q: want host:port", d.AdvertiseAddr)
		}
	}
	if d.TLSAddr != "" && (d.TLSCert == "" || d.TLSKey == "") {
		return configErrorf([]string{"listen-tls", "tls-cert", "tls-key"}, "-listen-tls %q needs -tls-cert and -tls-key", d.TLSAddr)
	}
	if !d.Fsync.Valid() {
		return configErrorf([]string{"fsync"}, "-fsync %v: want %s", d.Fsync, strings.Join(journal.FsyncPolicyNames(), " or "))
	}
	if d.JournalCheckpointRecords < 0 {
		return configErrorf([]string{"journal-checkpoint-records"}, "-journal-checkpoint-records %d: want 0 or more", d.JournalCheckpointRecords)
	}
	if err := d.validateController(); err != nil {
		return err
	}
	if err := d.validateRegistration(); err != nil {
		return err
	}
	if err := d.validateGroups(); err != nil {
		return err
	}
	if err := d.validateClusterPorts(); err != nil {
		return err
	}
	return d.validateAdmin()
}

// validateRegistration checks the timing of the heartbeats to the
// controller against the embedded member's broker timeout.
func (c *Config) validateRegistration() error {
	timeout := c.ControllerBrokerTimeout
	if g := c.ControllerLeaderGrace; g < 0 || g > timeout {
		return configErrorf([]string{"controller-leader-grace", "controller-broker-timeout"},
			"-controller-leader-grace %v: want 0 (the default) up to -controller-broker-timeout %v", g, timeout)
	}
	if c.ControllerHeartbeat >= timeout {
		return configErrorf([]string{"controller-heartbeat-ms", "controller-broker-timeout"},
			"-controller-heartbeat-ms %s is not under -controller-broker-timeout %v: every broker would be counted dead between two of its heartbeats", msText(c.ControllerHeartbeat), timeout)
	}
	return nil
}

// The bounds of Config.GroupLag and GroupLease. groupLagMin is one tick
// of a group node (replication/groups), the finest lag it measures.
const (
	groupLagMin   = 20 * time.Millisecond
	groupLagMax   = time.Hour
	groupLeaseMax = time.Minute
)

// validateGroups checks the replication groups' settings.
func (c *Config) validateGroups() error {
	for _, a := range []struct{ key, addr string }{{"peer", c.PeerAddr}, {"peer-advertise", c.PeerAdvertise}} {
		if a.addr == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(a.addr); err != nil {
			return configErrorf([]string{a.key}, "-%s %q: want host:port", a.key, a.addr)
		}
	}
	if c.PeerAddr != "" && c.DataDir == "" {
		return configErrorf([]string{"peer", "data"}, "-peer needs -data: the group log is journaled")
	}
	if l := c.GroupLag; l != 0 && (l < groupLagMin || l > groupLagMax) {
		return configErrorf([]string{"group-lag"}, "-group-lag %v: want 20ms to 1h", l)
	}
	if l, hb := c.GroupLease, c.ControllerHeartbeat; l < 0 || l != 0 && (l <= hb || l > groupLeaseMax) {
		return configErrorf([]string{"group-lease", "controller-heartbeat-ms"},
			"-group-lease %v: want 0 (twice the heartbeat interval) or more than -controller-heartbeat-ms (%v) up to 1m: a lease no longer than the interval between heartbeats lapses between two of them", l, hb)
	}
	return nil
}

// msText shows d in milliseconds, as the settings in ms are given: "250",
// or the duration when it is not whole milliseconds.
func msText(d time.Duration) string {
	if d%time.Millisecond != 0 {
		return d.String()
	}
	return strconv.FormatInt(d.Milliseconds(), 10)
}

// heartbeatMs is Heartbeat in the unit the wire carries (WELCOME's
// HeartbeatMs), whole milliseconds; Validate keeps it in 1 to
// heartbeatMsMax.
func (c *Config) heartbeatMs() uint32 { return uint32(c.Heartbeat / time.Millisecond) }
