package server

import (
	"log/slog"
	"time"

	"github.com/berthmq/berth/journal"
	"github.com/berthmq/berth/wire"
)

// Config configures a Server.
type Config struct {
	ClientAddr string // host:port; port 0 picks a free one
	AdminAddr  string // "" = no admin HTTP
	DataDir    string
	Shards     int
	Loops      int
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
	Logger           *slog.Logger
	ServerName       string
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
	// JournalSegmentBytes overrides the journal segment size.
	JournalSegmentBytes int64
	// JournalCheckpointRecords overrides the journal records per shard
	// between checkpoints (shards.JournalConfig.CheckpointRecords).
	JournalCheckpointRecords int
	// MetricsQueueLimit is the most queues /metrics exports series of
	// one by one; past it only their sums are (berth_queue_metrics_omitted
	// says so) and /metrics/queues has them. 0: MetricsQueueLimitDefault;
	// negative: no limit.
	MetricsQueueLimit int
	// RingSize is the capacity of each shard's command ring (0: the
	// shards' default). Tests make it tiny to exercise full rings.
	RingSize int
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
	// DataDir (the log lives in DataDir/controller). See CheckController.
	ControllerPeers map[uint64]string
	ControllerID    uint64
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
	// Role is RoleBroker (default, "" too) or RoleController: a
	// controller-only node runs its controller member and the admin HTTP
	// (/healthz, /readyz, /metrics, /v1/status), no client listener and
	// no shards.
	Role string
	// ControllerHeartbeat is the interval of a broker's heartbeats to the
	// controller (default ControllerHeartbeatDefault); keep it well under
	// the controller's broker timeout (0.8 s by default). See
	// registration.go.
	ControllerHeartbeat time.Duration
	// ControllerBrokerTimeout and ControllerLeaderGrace are the embedded
	// controller member's controlplane.Config.BrokerTimeout and
	// LeaderGrace (0: their defaults, 3 s and a third of the timeout).
	ControllerBrokerTimeout time.Duration
	ControllerLeaderGrace   time.Duration
	// GroupRebalance is how often a group's master looks for a
	// preferred master back in sync to hand the group over to
	// (server/groups/rebalance.go): 0 means groups.RebalanceDefault, a
	// negative value turns it off.
	GroupRebalance time.Duration
	// GroupLag is how long a group's follower may go without
	// acknowledging before its master takes it out of the SyncStateSet;
	// 0 means groups.LagDefault (500 ms).
	GroupLag time.Duration
	// GroupLease is how long the controller's answer to a heartbeat lets
	// a group's master deliver, and how long a new master waits after its
	// election before it delivers (group.Config.Lease); 0 means twice
	// ControllerHeartbeat.
	GroupLease time.Duration
	// MemoryLimit is the memory budget for messages in bytes, split
	// evenly across the shards; 0 means none. Above half of a shard's
	// share its new message bodies are paged out to disk, above the share
	// its publishers are throttled (shards/memory.go). berthd's default is
	// a share of the machine's RAM.
	MemoryLimit int64
	// AdvertiseAddr is the client address the broker registers with the
	// controller, for other nodes and clients to dial; empty means the
	// address the client listener is bound to (which must then not be a
	// wildcard such as 0.0.0.0).
	AdvertiseAddr string

	// TLSAddr is the TLS client address (host:port; port 0 picks a free
	// one); "" runs no TLS listener. It needs TLSCert and TLSKey, PEM
	// files; TLSClientCA, if set, is a PEM file of the CAs whose client
	// certificates are required (mutual TLS). Server.ReloadTLS rereads
	// all three.
	TLSAddr, TLSCert, TLSKey, TLSClientCA string

	// PeerAddr is where this broker's replication-group transport listens
	// (host:port); "" runs no groups. It needs a controller. The broker
	// publishes PeerAdvertise (default: the bound address) in the
	// controller, and replicates the groups whose replica set the
	// controller placed it in ("berthctl cluster init --groups G
	// --replicas R"); it forwards publishes for the others to their
	// masters.
	PeerAddr, PeerAdvertise string

	// ClusterCA, ClusterCert and ClusterKey (PEM files) make every
	// connection on the peer and controller ports, both ways, mutual TLS
	// with certificates the cluster CA signed; ClusterSecretFile holds a
	// shared secret every such connection proves (clusterauth.go). With
	// none, those ports must listen on loopback.
	ClusterCA, ClusterCert, ClusterKey, ClusterSecretFile string

	// AdminToken, if set, opens the admin HTTP's guarded paths to
	// "Authorization: Bearer AdminToken" and makes them need credentials
	// even on loopback (adminauth.go). AdminTLSCert and AdminTLSKey make
	// the admin port serve HTTPS.
	AdminToken, AdminTLSCert, AdminTLSKey string

	// AllowPlainWithoutTLS lets clients log in with PLAIN on the
	// plaintext listener, where their password crosses the network in
	// the clear.
	AllowPlainWithoutTLS bool
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

// heartbeatMs is Heartbeat in the unit the wire carries (WELCOME's
// HeartbeatMs), whole milliseconds.
func (c *Config) heartbeatMs() uint32 { return uint32(c.Heartbeat / time.Millisecond) }

// MetricsQueueLimitDefault is Config.MetricsQueueLimit's default: about
// 110,000 series, a few megabytes per scrape.
const MetricsQueueLimitDefault = 10000

func (c *Config) fill() {
	d := DefaultConfig()
	if c.MetricsQueueLimit == 0 {
		c.MetricsQueueLimit = MetricsQueueLimitDefault
	}
	if c.ClientAddr == "" {
		c.ClientAddr = "127.0.0.1:0"
	}
	if c.Heartbeat == 0 {
		c.Heartbeat = d.Heartbeat
	}
	if c.FrameSizeMax == 0 {
		c.FrameSizeMax = d.FrameSizeMax
	}
	if c.FrameSizeMax < wire.FrameSizeMin {
		c.FrameSizeMax = wire.FrameSizeMin
	}
	if c.FrameSizeMax > wire.FrameSizeMax {
		c.FrameSizeMax = wire.FrameSizeMax
	}
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
		c.OutboundMax = d.OutboundMax
	}
	if c.OutboundMax < 0 {
		c.OutboundMax = 0 // no cap
	}
	if c.OutboundTimeout <= 0 {
		c.OutboundTimeout = d.OutboundTimeout
	}
	if c.HandshakeTimeout <= 0 {
		c.HandshakeTimeout = d.HandshakeTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.ServerName == "" {
		c.ServerName = d.ServerName
	}
	if len(c.ServerName) > wire.NameLenMax {
		c.ServerName = c.ServerName[:wire.NameLenMax] // WELCOME carries at most this much
	}
	if c.Shards <= 0 {
		c.Shards = numCPU()
	}
	if c.Loops <= 0 {
		c.Loops = numCPU()
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
}
