package server

import (
	"context"
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/berthmq/berth/controlplane"
	"github.com/berthmq/berth/journal"
	"github.com/berthmq/berth/shards"
)

// scrapeTimeout bounds the shards' answers to one scrape.
const scrapeTimeout = 10 * time.Second

// shardCollector exports the broker's shard and queue metrics. Each scrape
// asks every shard once (shards.Broker.Metrics): the shards count on their
// own goroutines in plain fields, and nothing on the publish path takes a
// lock or an atomic shared across cores for a metric. Until Start has
// recovered every shard, and after Close, it exports none of them.
type shardCollector struct {
	s *Server

	published, delivered, accepted, deadLettered, queues *prometheus.Desc
	ready, unacked, delayed, consumers, omitted          *prometheus.Desc

	qDepth, qReady, qUnacked, qDelayed, qConsumers, qBytes                       *prometheus.Desc
	qPublished, qDelivered, qAccepted, qDeadLettered, qExpired                   *prometheus.Desc
	ringFull, storeErrors, droppedDeadLetters, duplicates, recovery, recoveredMs *prometheus.Desc
	acquiresEvents, releasesEvents, inherited                                    *prometheus.Desc
	ownEvents, ownedSeconds, orphanRequeues                                      *prometheus.Desc
	fsyncs, recordsPerFsync, fsyncSeconds, appends, segments                     *prometheus.Desc
	diskBytes, liveBytes, journalFailed                                          *prometheus.Desc
	memLimit, memUsed, memPaged, memThrottled, memThrottles                      *prometheus.Desc
	pageOuts, pageIns, pageErrors                                                *prometheus.Desc
}

func newShardCollector(s *Server) *shardCollector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, nil)
	}
	q, sh := "queue", "shard"
	return &shardCollector{
		s: s,

		published:    d("berth_messages_published_total", "Messages enqueued, summed over the queues (dead letters included; journal recovery not)."),
		delivered:    d("berth_messages_delivered_total", "Messages delivered to consumers, redeliveries included."),
		accepted:     d("berth_messages_accepted_total", "Messages accepted by an ACCEPT."),
		deadLettered: d("berth_messages_dead_lettered_total", "Messages dead-lettered or discarded."),
		queues:       d("berth_queues", "Declared queues."),
		ready:        d("berth_messages_ready", "Messages ready for delivery, summed over the queues."),
		unacked:      d("berth_messages_unacked", "Messages delivered and not yet settled, summed over the queues."),
		delayed:      d("berth_messages_delayed", "Messages held until their deliver-at time, summed over the queues."),
		consumers:    d("berth_consumers", "Consumers, summed over the queues."),
		omitted:      d("berth_queue_metrics_omitted", "Queues whose berth_queue_* series /metrics leaves out because there are more than -metrics-queue-limit queues; /metrics/queues lists them."),

		qDepth:        d("berth_queue_depth", "Messages in the queue: ready and unacked.", q),
		qReady:        d("berth_queue_ready", "Messages ready for delivery.", q),
		qUnacked:      d("berth_queue_unacked", "Messages delivered and not yet accepted, released or rejected.", q),
		qDelayed:      d("berth_queue_delayed", "Messages held until their deliver-at time.", q),
		qConsumers:    d("berth_queue_consumers", "Consumers subscribed to the queue.", q),
		qBytes:        d("berth_queue_bytes", "Payload and property bytes of the messages in the queue, ready and unacked.", q),
		qPublished:    d("berth_queue_published_total", "Messages that entered the queue since start: publishes and dead letters routed to it (not journal recovery).", q),
		qDelivered:    d("berth_queue_delivered_total", "Deliveries from the queue, redeliveries included.", q),
		qAccepted:     d("berth_queue_accepted_total", "Messages accepted from the queue: by ACCEPT, or on delivery in ack mode none.", q),
		qDeadLettered: d("berth_queue_dead_lettered_total", "Messages that left the queue for its dead-letter exchange or were discarded: rejected, expired, over a limit.", q),
		qExpired:      d("berth_queue_expired_total", "Messages that expired in the queue.", q),

		ringFull:           d("berth_shard_ring_full_total", "Times a non-blocking push (an event loop, a ticker, another shard) found the shard's ring full.", sh),
		storeErrors:        d("berth_shard_store_errors_total", "Journal records of the shard that failed to become durable; their commands got an error.", sh),
		droppedDeadLetters: d("berth_shard_dropped_dead_letters_total", "Dead letters the shard dropped because other shards' rings stayed full.", sh),
		duplicates:         d("berth_shard_publish_duplicates_total", "Publishes the shard's queues skipped as retries of an enqueue they had applied (same producer id, sequence number not newer).", sh),
		acquiresEvents:     d("berth_shard_acquires_events_total", "Acquires events the shard proposed as master of replicated queues' groups: each records deliveries, which go out once it commits.", sh),
		releasesEvents:     d("berth_shard_releases_events_total", "Releases events the shard proposed as master of replicated queues' groups: acquired messages put back.", sh),
		ownedSeconds:       d("berth_shard_owned_seconds_total", "Time this broker owned replicated queues whose group it does not master (consumers served at replicas, -consume-at-replicas), summed over the queues, counted at the shard's ticks.", sh),
		orphanRequeues:     d("berth_shard_orphan_requeues_total", "Own events the shard proposed to requeue messages its group's log holds as acquired by this broker that no consumer here holds any more (after a step-down, a resync or a restart).", sh),
		ownEvents:          d("berth_shard_own_events_total", "Own events the shard applied: handovers of replicated queues from one owner broker to another, and queues taken back from an owner that went silent.", sh),
		inherited:          d("berth_shard_inherited_redeliveries_total", "Messages the shard requeued, flagged redelivered, on becoming master of a replicated queue's group, because an earlier master had handed them out and nobody settled them.", sh),
		recovery:           d("berth_shard_recovery_seconds", "How long the shard's journal recovery took at start.", sh),
		recoveredMs:        d("berth_shard_recovered_messages", "Messages the shard's journal recovery brought back at start.", sh),
		fsyncs:             d("berth_journal_fsyncs_total", "Journal fsyncs that made records durable.", sh),
		recordsPerFsync:    d("berth_journal_records_per_fsync", "Records made durable by each journal fsync (group commit).", sh),
		fsyncSeconds:       d("berth_journal_fsync_seconds", "Time of each journal fsync that made records durable, measured on the journal's writer goroutine.", sh),
		appends:            d("berth_journal_appends_total", "Records appended to the shard's journal.", sh),
		segments:           d("berth_journal_segments", "Segment files of the shard's journal.", sh),
		diskBytes:          d("berth_journal_disk_bytes", "Bytes in the shard's journal segments.", sh),
		liveBytes:          d("berth_journal_live_bytes", "Bytes of journal records that must stay on disk.", sh),
		journalFailed:      d("berth_journal_failed", "1 once the shard's journal has failed on an I/O error and refuses records.", sh),
		memLimit:           d("berth_shard_memory_limit_bytes", "The shard's share of -memory-limit; 0 when there is no budget.", sh),
		memUsed:            d("berth_shard_memory_bytes", "Bytes the shard counts against its share: message index entries and bodies in memory.", sh),
		memPaged:           d("berth_shard_paged_messages", "Messages of the shard whose body is paged out to the journal or the paging file.", sh),
		memThrottled:       d("berth_shard_memory_throttled", "1 while the shard is over its memory share and publishers to it are held back.", sh),
		memThrottles:       d("berth_shard_memory_throttles_total", "Times the shard went over its memory share and began holding publishers back.", sh),
		pageOuts:           d("berth_shard_page_outs_total", "Message bodies paged out of memory.", sh),
		pageIns:            d("berth_shard_page_ins_total", "Paged message bodies read back for delivery.", sh),
		pageErrors:         d("berth_shard_page_errors_total", "Page-outs and read-backs that failed (the body stayed in memory, or the queue waits).", sh),
	}
}

func (c *shardCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.published, c.delivered, c.accepted, c.deadLettered, c.queues,
		c.ready, c.unacked, c.delayed, c.consumers, c.omitted,
		c.qDepth, c.qReady, c.qUnacked, c.qDelayed, c.qConsumers, c.qBytes,
		c.qPublished, c.qDelivered, c.qAccepted, c.qDeadLettered, c.qExpired,
		c.ringFull, c.storeErrors, c.droppedDeadLetters, c.duplicates, c.recovery, c.recoveredMs,
		c.acquiresEvents, c.releasesEvents, c.inherited, c.ownEvents, c.ownedSeconds, c.orphanRequeues,
		c.fsyncs, c.recordsPerFsync, c.fsyncSeconds, c.appends, c.segments,
		c.diskBytes, c.liveBytes, c.journalFailed,
		c.memLimit, c.memUsed, c.memPaged, c.memThrottled, c.memThrottles, c.pageOuts, c.pageIns, c.pageErrors} {
		ch <- d
	}
}

func (c *shardCollector) Collect(ch chan<- prometheus.Metric) {
	b := c.s.boot.broker.Load()
	if b == nil {
		return
	}
	limit := c.s.cfg.MetricsQueueLimit
	ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()
	ms, err := b.MetricsSelect(ctx, shards.QueueSelect{Max: limit})
	if err != nil {
		// Still starting (or stopping): the shards are not asked. A
		// timeout is reported as a failed scrape.
		if err != shards.ErrNotRunning {
			ch <- prometheus.NewInvalidMetric(c.published, err)
		}
		return
	}
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	var total shards.ShardStats
	var sums shards.QueueTotals
	nq := 0
	for i := range ms {
		m := &ms[i]
		total.Published += m.Stats.Published
		total.Delivered += m.Stats.Delivered
		total.Accepted += m.Stats.Accepted
		total.DeadLettered += m.Stats.DeadLettered
		nq += m.QueueCount
		sums.Ready += m.Totals.Ready
		sums.Unacked += m.Totals.Unacked
		sums.Delayed += m.Totals.Delayed
		sums.Consumers += m.Totals.Consumers
	}
	omitted := 0
	if limit >= 0 && nq > limit {
		// Some of them or none: a partial set would come and go between
		// scrapes as the shards' map order changes.
		omitted = nq
	} else {
		c.collectQueues(ch, ms)
	}
	for i := range ms {
		m := &ms[i]
		shard := strconv.Itoa(m.Shard)
		counter(c.ringFull, m.RingFull, shard)
		counter(c.storeErrors, m.Stats.StoreErrors, shard)
		counter(c.droppedDeadLetters, m.Stats.DroppedDeadLetters, shard)
		counter(c.duplicates, m.Stats.Duplicates, shard)
		counter(c.acquiresEvents, m.Stats.AcquiresEvents, shard)
		counter(c.releasesEvents, m.Stats.ReleasesEvents, shard)
		counter(c.inherited, m.Stats.Inherited, shard)
		counter(c.ownEvents, m.Stats.OwnEvents, shard)
		counter(c.orphanRequeues, m.Stats.OrphanRequeues, shard)
		ch <- prometheus.MustNewConstMetric(c.ownedSeconds, prometheus.CounterValue, float64(m.Stats.OwnedNanos)/1e9, shard)
		mem := &m.Memory
		gauge(c.memLimit, float64(mem.LimitBytes), shard)
		gauge(c.memUsed, float64(mem.UsedBytes), shard)
		gauge(c.memPaged, float64(mem.PagedMessages), shard)
		throttled := 0.0
		if mem.Throttled {
			throttled = 1
		}
		gauge(c.memThrottled, throttled, shard)
		counter(c.memThrottles, mem.Throttles, shard)
		counter(c.pageOuts, mem.PageOuts, shard)
		counter(c.pageIns, mem.PageIns, shard)
		counter(c.pageErrors, mem.PageErrors, shard)
		if !m.Journaled {
			continue
		}
		gauge(c.recovery, m.Recovery.Seconds(), shard)
		gauge(c.recoveredMs, float64(m.RecoveredMessages), shard)
		j := &m.Journal
		counter(c.fsyncs, j.Fsyncs, shard)
		ch <- recordsPerFsyncHistogram(c.recordsPerFsync, j, shard)
		ch <- fsyncSecondsHistogram(c.fsyncSeconds, j, shard)
		counter(c.appends, j.Appends, shard)
		gauge(c.segments, float64(j.Segments), shard)
		gauge(c.diskBytes, float64(j.DiskBytes), shard)
		gauge(c.liveBytes, float64(j.LiveBytes), shard)
		failed := 0.0
		if j.Err != nil {
			failed = 1
		}
		gauge(c.journalFailed, failed, shard)
	}
	counter(c.published, total.Published)
	counter(c.delivered, total.Delivered)
	counter(c.accepted, total.Accepted)
	counter(c.deadLettered, total.DeadLettered)
	gauge(c.queues, float64(nq))
	gauge(c.ready, float64(sums.Ready))
	gauge(c.unacked, float64(sums.Unacked))
	gauge(c.delayed, float64(sums.Delayed))
	gauge(c.consumers, float64(sums.Consumers))
	gauge(c.omitted, float64(omitted))
}

// collectQueues exports the berth_queue_* series of the queues ms lists.
func (c *shardCollector) collectQueues(ch chan<- prometheus.Metric, ms []shards.ShardMetrics) {
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	for i := range ms {
		for _, q := range ms[i].Queues {
			name := labelValue(q.Name)
			gauge(c.qDepth, float64(q.Ready+q.Unacked), name)
			gauge(c.qReady, float64(q.Ready), name)
			gauge(c.qUnacked, float64(q.Unacked), name)
			gauge(c.qDelayed, float64(q.Delayed), name)
			gauge(c.qConsumers, float64(q.Consumers), name)
			gauge(c.qBytes, float64(q.Bytes), name)
			counter(c.qPublished, q.Published, name)
			counter(c.qDelivered, q.Delivered, name)
			counter(c.qAccepted, q.Accepted, name)
			counter(c.qDeadLettered, q.DeadLettered, name)
			counter(c.qExpired, q.Expired, name)
		}
	}
}

// queueCollector exports the berth_queue_* series of every queue whose
// name starts with prefix: /metrics/queues, for brokers with more queues
// than /metrics lists.
type queueCollector struct {
	c      *shardCollector
	prefix string
}

func (q queueCollector) Describe(ch chan<- *prometheus.Desc) {
	c := q.c
	for _, d := range []*prometheus.Desc{c.qDepth, c.qReady, c.qUnacked, c.qDelayed, c.qConsumers, c.qBytes,
		c.qPublished, c.qDelivered, c.qAccepted, c.qDeadLettered, c.qExpired} {
		ch <- d
	}
}

func (q queueCollector) Collect(ch chan<- prometheus.Metric) {
	b := q.c.s.boot.broker.Load()
	if b == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()
	ms, err := b.MetricsSelect(ctx, shards.QueueSelect{Max: -1, Prefix: q.prefix})
	if err != nil {
		if err != shards.ErrNotRunning {
			ch <- prometheus.NewInvalidMetric(q.c.qDepth, err)
		}
		return
	}
	q.c.collectQueues(ch, ms)
}

// serveQueueMetrics serves /metrics/queues[?prefix=P]: the per-queue
// series, all of them or those of the queues named with the prefix.
func (s *Server) serveQueueMetrics(w http.ResponseWriter, r *http.Request) {
	if s.metrics.shards == nil {
		http.Error(w, "no queues on a controller-only node", http.StatusNotFound)
		return
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(queueCollector{c: s.metrics.shards, prefix: r.URL.Query().Get("prefix")})
	promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(w, r)
}

// labelValue makes a queue name a valid label value: names are bytes on
// the wire, labels UTF-8. A name that is not UTF-8 is shown quoted, with
// escapes.
func labelValue(name string) string {
	if utf8.ValidString(name) {
		return name
	}
	return strconv.Quote(name)
}

// powerOfTwoHistogram builds a const histogram from counts where bucket i
// holds observations below bound(i); the last bucket is open-ended.
func powerOfTwoHistogram(d *prometheus.Desc, counts []uint64, sum float64, bound func(i int) float64, labels ...string) prometheus.Metric {
	buckets := make(map[float64]uint64, len(counts)-1)
	var cum uint64
	for i, n := range counts {
		cum += n
		if i < len(counts)-1 {
			buckets[bound(i)] = cum
		}
	}
	return prometheus.MustNewConstHistogram(d, cum, sum, buckets, labels...)
}

// recordsPerFsyncHistogram: journal bucket i counts fsyncs of [2^i,
// 2^(i+1)) records, so at most 2^(i+1)-1.
func recordsPerFsyncHistogram(d *prometheus.Desc, j *journal.Stats, labels ...string) prometheus.Metric {
	return powerOfTwoHistogram(d, j.BatchHistogram[:], float64(j.RecordsSynced),
		func(i int) float64 { return float64(uint64(1)<<(i+1) - 1) }, labels...)
}

// fsyncSecondsHistogram: journal bucket i counts fsyncs of [2^i, 2^(i+1))
// microseconds.
func fsyncSecondsHistogram(d *prometheus.Desc, j *journal.Stats, labels ...string) prometheus.Metric {
	return powerOfTwoHistogram(d, j.FsyncHistogram[:], float64(j.FsyncNanos)/1e9,
		func(i int) float64 { return float64(uint64(1)<<(i+1)) / 1e6 }, labels...)
}

// controllerCollector exports this node's controller member: term,
// leader, applied index and the proposals the leader packed per log
// entry. It reads atomics in the member, nothing on disk.
type controllerCollector struct {
	s                                         *Server
	term, leader, isLeader, applied, perEntry *prometheus.Desc
}

func newControllerCollector(s *Server) *controllerCollector {
	d := func(name, help string) *prometheus.Desc { return prometheus.NewDesc(name, help, nil, nil) }
	return &controllerCollector{
		s:        s,
		term:     d("berth_controller_term", "Raft term of this node's controller member."),
		leader:   d("berth_controller_leader", "Raft id of the controller leader this member knows, 0 if none."),
		isLeader: d("berth_controller_is_leader", "1 if this node's controller member is the leader."),
		applied:  d("berth_controller_applied_index", "Last log index this controller member applied."),
		perEntry: d("berth_controller_proposals_per_entry",
			"Proposals (events) this member packed into each log entry it proposed as leader."),
	}
}

func (c *controllerCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.term
	ch <- c.leader
	ch <- c.isLeader
	ch <- c.applied
	ch <- c.perEntry
}

func (c *controllerCollector) Collect(ch chan<- prometheus.Metric) {
	n := c.s.boot.ctl.Load()
	if n == nil {
		return
	}
	m := n.Metrics()
	gauge := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v)
	}
	gauge(c.term, float64(m.Term))
	gauge(c.leader, float64(m.Leader))
	isLeader := 0.0
	if m.IsLeader {
		isLeader = 1
	}
	gauge(c.isLeader, isLeader)
	gauge(c.applied, float64(m.Applied))
	ch <- proposalsPerEntryHistogram(c.perEntry, &m)
}

// proposalsPerEntryHistogram: bucket i counts entries of [2^i, 2^(i+1))
// proposals, so at most 2^(i+1)-1.
func proposalsPerEntryHistogram(d *prometheus.Desc, m *controlplane.Metrics) prometheus.Metric {
	return powerOfTwoHistogram(d, m.EntryBatchHistogram[:], float64(m.Proposals),
		func(i int) float64 { return float64(uint64(1)<<(i+1) - 1) })
}

// groupCollector exports this broker's replication groups, as its node
// sees them (groups.Node.Status, one round trip to the node's goroutine
// per group and scrape), and the handovers it made (rebalance).
type groupCollector struct {
	s                                    *Server
	master, epoch, last, commit, applied *prometheus.Desc
	setSize, handovers                   *prometheus.Desc
	// The group journal (one per broker, shared by its groups).
	jFsyncs, jRecordsPerFsync, jFsyncSeconds, jAppends *prometheus.Desc
	jSegments, jDiskBytes, jLiveBytes, jFailed         *prometheus.Desc
}

func newGroupCollector(s *Server) *groupCollector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, nil)
	}
	g := "group"
	return &groupCollector{
		s:         s,
		master:    d("berth_group_master", "1 while this broker serves as the group's master, else 0.", g),
		epoch:     d("berth_group_epoch", "The group's epoch as this broker knows it.", g),
		last:      d("berth_group_last_index", "Index of the last entry in this broker's copy of the group log.", g),
		commit:    d("berth_group_commit_index", "Index up to which this broker knows the group log committed.", g),
		applied:   d("berth_group_applied_index", "Index up to which this broker applied the group log to its queues.", g),
		setSize:   d("berth_group_sync_state_set_members", "Members of the group's SyncStateSet, as its master counts them (exported by the master only).", g),
		handovers: d("berth_group_handovers_total", "Groups this broker handed to their preferred master (-group-rebalance)."),

		jFsyncs:          d("berth_group_journal_fsyncs_total", "Group journal fsyncs that made records durable (the group logs of all of this broker's groups share the journal)."),
		jRecordsPerFsync: d("berth_group_journal_records_per_fsync", "Records made durable by each group journal fsync (group commit)."),
		jFsyncSeconds:    d("berth_group_journal_fsync_seconds", "Time of each group journal fsync that made records durable, measured on the journal's writer goroutine."),
		jAppends:         d("berth_group_journal_appends_total", "Records appended to the group journal."),
		jSegments:        d("berth_group_journal_segments", "Segment files of the group journal."),
		jDiskBytes:       d("berth_group_journal_disk_bytes", "Bytes in the group journal's segments."),
		jLiveBytes:       d("berth_group_journal_live_bytes", "Bytes of group journal records that must stay on disk."),
		jFailed:          d("berth_group_journal_failed", "1 once the group journal has failed on an I/O error and refuses records."),
	}
}

func (c *groupCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.master, c.epoch, c.last, c.commit, c.applied, c.setSize, c.handovers,
		c.jFsyncs, c.jRecordsPerFsync, c.jFsyncSeconds, c.jAppends, c.jSegments, c.jDiskBytes, c.jLiveBytes, c.jFailed} {
		ch <- d
	}
}

func (c *groupCollector) Collect(ch chan<- prometheus.Metric) {
	m := c.s.groups.Load()
	if m == nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(c.handovers, prometheus.CounterValue, float64(m.Handovers()))
	n := m.Node()
	if n == nil {
		return
	}
	j := n.JournalStats()
	ch <- prometheus.MustNewConstMetric(c.jFsyncs, prometheus.CounterValue, float64(j.Fsyncs))
	ch <- recordsPerFsyncHistogram(c.jRecordsPerFsync, &j)
	ch <- fsyncSecondsHistogram(c.jFsyncSeconds, &j)
	ch <- prometheus.MustNewConstMetric(c.jAppends, prometheus.CounterValue, float64(j.Appends))
	failed := 0.0
	if j.Err != nil {
		failed = 1
	}
	for d, v := range map[*prometheus.Desc]float64{c.jSegments: float64(j.Segments), c.jDiskBytes: float64(j.DiskBytes),
		c.jLiveBytes: float64(j.LiveBytes), c.jFailed: failed} {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v)
	}
	gauge := func(d *prometheus.Desc, v float64, g string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, g)
	}
	for _, g := range n.Groups() {
		st, err := n.Status(g)
		if err != nil {
			continue
		}
		id := strconv.FormatUint(uint64(g), 10)
		master := 0.0
		if n.IsMaster(g) {
			master = 1
			gauge(c.setSize, float64(len(st.Set)), id)
		}
		gauge(c.master, master, id)
		gauge(c.epoch, float64(st.Epoch), id)
		gauge(c.last, float64(st.LastIndex), id)
		gauge(c.commit, float64(st.Commit), id)
		gauge(c.applied, float64(st.Applied), id)
	}
}
