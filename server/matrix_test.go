package server_test

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/journal"
	"github.com/berthmq/berth/server"
	"github.com/berthmq/berth/wire"
)

// matrixCells maps the test name of each running TestSemanticsMatrix
// cell to its config.
var matrixCells sync.Map

// applyMatrixCell applies the shard count and fsync policy of the
// TestSemanticsMatrix cell that t runs in, if it runs in one. startServer
// calls it before the test's own changes to the config.
func applyMatrixCell(t testing.TB, cfg *server.Config) {
	name := t.Name()
	for {
		if c, ok := matrixCells.Load(name); ok {
			c.(matrixCell).apply(cfg)
			return
		}
		i := strings.LastIndexByte(name, '/')
		if i < 0 {
			return
		}
		name = name[:i]
	}
}

// matrixCell is one configuration the semantics suite runs under.
type matrixCell struct {
	shards int
	fsync  journal.FsyncPolicy
}

func (c matrixCell) apply(cfg *server.Config) { cfg.Shards, cfg.Fsync = c.shards, c.fsync }

// matrixCase is one test of the suite; it runs in every cell with at
// least minShards shards.
type matrixCase struct {
	name      string
	minShards int
	// test is a top-level test of another file, run as it is under the
	// cell's config. It runs with startServer's defaults at top level
	// already, so the cell with those (defaultCell) skips it.
	test func(*testing.T)
	// run is a test that runs only in the matrix.
	run func(*testing.T, matrixCell)
	// short marks the cases that still run under -short.
	short bool
}

// defaultCell is the config startServer uses outside the matrix.
var defaultCell = matrixCell{shards: 2, fsync: journal.FsyncAlways}

var matrixCases = []matrixCase{
	// Delivery semantics with transient queues and messages (server_test.go).
	{name: "FIFOAndAccept", test: TestFIFOAndAccept},
	{name: "CreditIsRespected", test: TestCreditIsRespected},
	{name: "ReleaseGoesBackToItsPosition", test: TestReleaseGoesBackToItsPosition},
	{name: "RejectDeadLettersAndMaxDeliveries", test: TestRejectDeadLettersAndMaxDeliveries},
	{name: "RoutingAllExchangeKinds", test: TestRoutingAllExchangeKinds},
	{name: "TTL", test: TestTTL},
	{name: "MaxLength", test: TestMaxLength},
	{name: "DisconnectRequeues", test: TestDisconnectRequeues},
	{name: "ExclusiveAndAutoDelete", test: TestExclusiveAndAutoDelete},
	{name: "PurgeAndDelete", test: TestPurgeAndDelete},
	{name: "ConcurrentProducersConsumers", test: TestConcurrentProducersConsumers},
	{name: "LargeDeliveryBatchesFromTwoShards", minShards: 2, test: TestLargeDeliveryBatchesFromTwoShards},
	// Durable queues and persistent messages: the journal under the
	// cell's fsync policy, recovered by a restart (durable_test.go,
	// diskfault_test.go, then this file's).
	{name: "DurableQueueSurvivesRestart", test: TestDurableQueueSurvivesRestart, short: true},
	{name: "CrossShardDeadLetterSurvivesRestart", minShards: 2, test: TestCrossShardDeadLetterSurvivesRestart},
	{name: "DurableEveryShardAcrossRestarts", run: durableEveryShardAcrossRestarts, short: true},
	{name: "DurableRoutingAllExchangeKinds", run: durableRoutingAllExchangeKinds, short: true},
	{name: "DurableDeadLettersAndMaxLength", run: durableDeadLettersAndMaxLength, short: true},
	{name: "DurablePurgeDeleteAndTTL", run: durablePurgeDeleteAndTTL},
	{name: "DurableConcurrentProducersConsumers", run: durableConcurrentProducersConsumers, short: true},
}

// TestSemanticsMatrix runs the delivery semantics over shard counts 1, 2
// and 4 and both fsync policies; the durable cases publish persistent
// messages to durable queues and check them after restarts. The tests
// of other files skip the cell of startServer's defaults, where they ran
// at top level already. The cells run in parallel (as many at once as
// -test.parallel allows), the cases of a cell one after another. -short
// keeps the durable cases that cover the most.
func TestSemanticsMatrix(t *testing.T) {
	for _, shards := range []int{1, 2, 4} {
		for _, fsync := range []journal.FsyncPolicy{journal.FsyncAlways, journal.FsyncNever} {
			cell := matrixCell{shards: shards, fsync: fsync}
			if raceEnabled && !raceCell(cell) {
				continue
			}
			t.Run(fmt.Sprintf("shards=%d/fsync=%s", shards, fsync), func(t *testing.T) {
				t.Parallel()
				matrixCells.Store(t.Name(), cell)
				t.Cleanup(func() { matrixCells.Delete(t.Name()) })
				t.Run("ConfigReachesServer", func(t *testing.T) { configReachesServer(t, cell) })
				for _, mc := range matrixCases {
					switch {
					case shards < mc.minShards, testing.Short() && !mc.short:
					case mc.test != nil && cell != defaultCell:
						t.Run(mc.name, mc.test)
					case mc.run != nil:
						t.Run(mc.name, func(t *testing.T) { mc.run(t, cell) })
					}
				}
			})
		}
	}
}

// raceCell picks the cells the race detector runs: one with every
// shard count, whose goroutines are what it checks. The fsync policy
// changes only the journal writer's waits; plain runs take all six cells,
// and under the detector, which slows them about threefold, the six held
// make test's two cores for three minutes.
func raceCell(c matrixCell) bool {
	return (c.shards == 1 && c.fsync == journal.FsyncAlways) || (c.shards == 2 && c.fsync == journal.FsyncNever) || (c.shards == 4 && c.fsync == journal.FsyncAlways)
}

// configReachesServer checks that the cell's settings reach the servers
// startServer starts in it, so that each cell tests what it says: the
// shard count, and fsyncs of the journal only with fsync always.
func configReachesServer(t *testing.T, cell matrixCell) {
	s := startServer(t)
	if n := len(s.Broker().Shards()); n != cell.shards {
		t.Fatalf("%d shards, want the cell's %d", n, cell.shards)
	}
	c := dial(t, s)
	ctx := ctxT(t)
	for i := range cell.shards {
		q := queueOnShard(s, "cfg", i)
		if err := c.DeclareQueue(ctx, q, client.QueueOptions{Durable: true}); err != nil {
			t.Fatal(err)
		}
		if err := c.Publish(ctx, "", q, []byte("x"), client.PublishOptions{Persistent: true}); err != nil {
			t.Fatal(err)
		}
	}
	st, ok := s.Broker().JournalStats()
	if !ok || st.Appends == 0 {
		t.Fatalf("no journal appends after persistent publishes: %+v", st)
	}
	if synced := st.Fsyncs > 0; synced != (cell.fsync == journal.FsyncAlways) {
		t.Fatalf("fsync %s: %d fsyncs for %d appends", cell.fsync, st.Fsyncs, st.Appends)
	}
}

// inDir keeps a server's data in dir, so that a restart finds it.
func inDir(dir string) func(*server.Config) {
	return func(c *server.Config) { c.DataDir = dir }
}

// restart closes s cleanly and starts a server on the same directory
// with the same (matrix) config.
func restart(t *testing.T, s *server.Server, dir string) *server.Server {
	t.Helper()
	if err := s.Close(); err != nil {
		t.Fatalf("close before restart: %v", err)
	}
	return startServer(t, inDir(dir))
}

// depths returns every queue's ready and unacked counts by name.
func depths(s *server.Server) map[string][2]int {
	out := map[string][2]int{}
	for _, q := range s.Broker().Queues() {
		out[q.Name] = [2]int{q.Ready, q.Unacked}
	}
	return out
}

// takeAll subscribes to queue without acknowledgements, takes exactly
// len(want) messages, checks their payloads in order, and that nothing
// else is there.
func takeAll(t *testing.T, c *client.Conn, queue string, want []string) {
	t.Helper()
	ctx := ctxT(t)
	con, err := c.Subscribe(ctx, queue, client.SubscribeOptions{Credit: uint32(len(want) + 1), AckMode: client.AckNone})
	if err != nil {
		t.Fatalf("subscribe %s: %v", queue, err)
	}
	for i, w := range want {
		if d := next(t, con, 5*time.Second); string(d.Payload) != w {
			t.Fatalf("queue %s, message %d: %q, want %q", queue, i, d.Payload, w)
		}
	}
	expectNone(t, con, 50*time.Millisecond)
}

func seq(prefix string, from, to int) []string {
	var out []string
	for i := from; i < to; i++ {
		out = append(out, fmt.Sprintf("%s%03d", prefix, i))
	}
	return out
}

func mustDo(t *testing.T) func(error) {
	return func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
}

// durableEveryShardAcrossRestarts puts a durable queue on every shard
// with persistent messages; per queue the first third is accepted, the
// second third acquired when the session ends, the rest never delivered.
// After a restart each queue holds the second and last thirds in order,
// the second with delivery count 1; accepting them after the restart is
// durable too: after a second restart the queues are empty.
func durableEveryShardAcrossRestarts(t *testing.T, cell matrixCell) {
	const n = 150
	dir := t.TempDir()
	s := startServer(t, inDir(dir))
	ctx := ctxT(t)
	must := mustDo(t)
	c := dial(t, s)
	var queues []string
	for i := range cell.shards {
		q := queueOnShard(s, "every", i)
		queues = append(queues, q)
		must(c.DeclareQueue(ctx, q, client.QueueOptions{Durable: true}))
		for _, m := range seq("m", 0, n) {
			must(c.PublishAsync(ctx, "", q, []byte(m), client.PublishOptions{Persistent: true}, nil))
		}
	}
	must(c.Flush(ctx))
	for _, q := range queues {
		con, err := c.Subscribe(ctx, q, client.SubscribeOptions{Credit: 2 * n / 3})
		must(err)
		var tags []uint64
		for i := range 2 * n / 3 {
			d := next(t, con, 5*time.Second)
			if want := fmt.Sprintf("m%03d", i); string(d.Payload) != want {
				t.Fatalf("queue %s before restart: %q, want %q", q, d.Payload, want)
			}
			if i < n/3 {
				tags = append(tags, d.Tag)
			}
		}
		must(con.Accept(ctx, tags...))
	}
	_ = c.Close()
	checkFor(t, 5*time.Second, func() error {
		for _, q := range queues {
			if d := depths(s)[q]; d != [2]int{n - n/3, 0} {
				return fmt.Errorf("queue %s ready, unacked %v after the session ended, want [%d 0]", q, d, n-n/3)
			}
		}
		return nil
	})

	s = restart(t, s, dir)
	c = dial(t, s)
	for _, q := range queues {
		con, err := c.Subscribe(ctx, q, client.SubscribeOptions{Credit: n})
		must(err)
		var tags []uint64
		for i := n / 3; i < n; i++ {
			d := next(t, con, 5*time.Second)
			wantCount := uint32(0)
			if i < 2*n/3 {
				wantCount = 1
			}
			if want := fmt.Sprintf("m%03d", i); string(d.Payload) != want || d.DeliveryCount != wantCount {
				t.Fatalf("queue %s after restart: %q count %d, want %q count %d", q, d.Payload, d.DeliveryCount, want, wantCount)
			}
			tags = append(tags, d.Tag)
		}
		expectNone(t, con, 50*time.Millisecond)
		must(con.Accept(ctx, tags...))
	}
	_ = c.Close()

	s = restart(t, s, dir)
	for _, q := range queues {
		if d, ok := depths(s)[q]; !ok || d != [2]int{0, 0} {
			t.Fatalf("queue %s after accepting everything and a restart: present %v, ready, unacked %v", q, ok, d)
		}
	}
}

// durableRoutingAllExchangeKinds routes persistent messages through
// durable direct, fanout and topic exchanges to durable queues; after a
// restart every queue holds its messages in order (the transient one
// gone) and the bindings still route.
func durableRoutingAllExchangeKinds(t *testing.T, _ matrixCell) {
	dir := t.TempDir()
	s := startServer(t, inDir(dir))
	c := dial(t, s)
	ctx := ctxT(t)
	must := mustDo(t)
	for _, q := range []string{"d1", "d2", "f1", "f2", "t1", "t2", "t3"} {
		must(c.DeclareQueue(ctx, q, client.QueueOptions{Durable: true}))
	}
	must(c.DeclareExchange(ctx, "direct", client.Direct, client.ExchangeOptions{Durable: true}))
	must(c.DeclareExchange(ctx, "fan", client.Fanout, client.ExchangeOptions{Durable: true}))
	must(c.DeclareExchange(ctx, "topic", client.Topic, client.ExchangeOptions{Durable: true}))
	must(c.Bind(ctx, "direct", "d1", "a"))
	must(c.Bind(ctx, "direct", "d2", "b"))
	must(c.Bind(ctx, "fan", "f1", ""))
	must(c.Bind(ctx, "fan", "f2", ""))
	must(c.Bind(ctx, "topic", "t1", "stock.*.nyse"))
	must(c.Bind(ctx, "topic", "t2", "stock.#"))
	must(c.Bind(ctx, "topic", "t3", "#.eu"))
	must(c.Bind(ctx, "topic", "t3", "*.*.eu"))

	pub := func(c *client.Conn, ex, key, body string, persistent bool) {
		t.Helper()
		must(c.Publish(ctx, ex, key, []byte(body), client.PublishOptions{Persistent: persistent}))
	}
	publishAll := func(c *client.Conn, suffix string) {
		pub(c, "direct", "a", "da"+suffix, true)
		pub(c, "direct", "b", "db"+suffix, true)
		pub(c, "fan", "x", "fan"+suffix, true)
		pub(c, "topic", "stock.ibm.nyse", "ibm"+suffix, true)
		pub(c, "topic", "stock", "bare"+suffix, true)
		pub(c, "topic", "stock.sap.xetra.eu", "sap"+suffix, true)
		pub(c, "topic", "bond.eu", "bond"+suffix, true)
	}
	publishAll(c, "")
	pub(c, "fan", "x", "transient", false) // not journaled: gone after the restart
	pub(c, "", "d1", "default", true)

	want := func(suffix string) map[string][]string {
		return map[string][]string{
			"d1": {"da" + suffix}, "d2": {"db" + suffix}, "f1": {"fan" + suffix}, "f2": {"fan" + suffix},
			"t1": {"ibm" + suffix}, "t2": {"ibm" + suffix, "bare" + suffix, "sap" + suffix}, "t3": {"sap" + suffix, "bond" + suffix},
		}
	}
	_ = c.Close()
	s = restart(t, s, dir)
	c = dial(t, s)
	// The bindings survived: a second round routes the same way, behind
	// the restored messages.
	publishAll(c, "-2")
	before, after := want(""), want("-2")
	before["d1"] = append(before["d1"], "default")
	for q, msgs := range before {
		takeAll(t, c, q, append(msgs, after[q]...))
	}
}

// durableDeadLettersAndMaxLength: persistent messages dead-lettered by
// reject, by max-deliveries and by drop-head overflow reach a durable
// queue (on another shard where there is one) and are there after a
// restart, gone from their source; a full reject-publish queue is still
// full after the restart.
func durableDeadLettersAndMaxLength(t *testing.T, cell matrixCell) {
	dir := t.TempDir()
	s := startServer(t, inDir(dir))
	c := dial(t, s)
	ctx := ctxT(t)
	must := mustDo(t)
	work, drop := queueOnShard(s, "work", 0), queueOnShard(s, "drop", 0)
	dead := queueOnShard(s, "dead", cell.shards-1)
	full := queueOnShard(s, "full", cell.shards/2)
	must(c.DeclareExchange(ctx, "dlx", client.Fanout, client.ExchangeOptions{Durable: true}))
	must(c.DeclareQueue(ctx, dead, client.QueueOptions{Durable: true}))
	must(c.Bind(ctx, "dlx", dead, ""))
	must(c.DeclareQueue(ctx, work, client.QueueOptions{Durable: true, DeadLetterExchange: "dlx", MaxDeliveries: 2}))
	must(c.DeclareQueue(ctx, drop, client.QueueOptions{Durable: true, MaxLength: 2, Overflow: client.OverflowDropHead, DeadLetterExchange: "dlx"}))
	must(c.DeclareQueue(ctx, full, client.QueueOptions{Durable: true, MaxLength: 3}))
	persistent := client.PublishOptions{Persistent: true}
	for _, m := range []string{"rejected", "poison", "kept"} {
		must(c.Publish(ctx, "", work, []byte(m), persistent))
	}
	con, err := c.Subscribe(ctx, work, client.SubscribeOptions{Credit: 1})
	must(err)
	if d := next(t, con, 5*time.Second); string(d.Payload) != "rejected" {
		t.Fatalf("got %q, want rejected", d.Payload)
	} else {
		must(d.Reject(ctx))
	}
	for range 2 { // the second release reaches max-deliveries
		_, _ = con.Credit(1)
		d := next(t, con, 5*time.Second)
		if string(d.Payload) != "poison" {
			t.Fatalf("got %q, want poison", d.Payload)
		}
		must(d.Release(ctx))
	}
	must(con.Cancel(ctx))
	// Dead letters to another shard arrive asynchronously; these two
	// come first in the dead-letter queue.
	checkFor(t, 5*time.Second, func() error {
		if d := depths(s)[dead]; d[0] != 2 {
			return fmt.Errorf("dead-letter queue holds %v, want 2 ready", d)
		}
		return nil
	})
	for i := range 5 {
		must(c.Publish(ctx, "", drop, fmt.Appendf(nil, "drop%d", i), persistent))
	}
	for i := range 3 {
		must(c.Publish(ctx, "", full, fmt.Appendf(nil, "full%d", i), persistent))
	}
	if err := c.Publish(ctx, "", full, []byte("over"), persistent); client.Code(err) != wire.CodeResourceLimit {
		t.Fatalf("publish to a full reject-publish queue: %v", err)
	}
	checkFor(t, 5*time.Second, func() error {
		if d := depths(s)[dead]; d[0] != 5 {
			return fmt.Errorf("dead-letter queue holds %v, want 5 ready", d)
		}
		return nil
	})
	_ = c.Close()

	s = restart(t, s, dir)
	c = dial(t, s)
	if err := c.Publish(ctx, "", full, []byte("over"), persistent); client.Code(err) != wire.CodeResourceLimit {
		t.Fatalf("publish to a full reject-publish queue after restart: %v", err)
	}
	takeAll(t, c, work, []string{"kept"})
	takeAll(t, c, drop, []string{"drop3", "drop4"})
	takeAll(t, c, full, []string{"full0", "full1", "full2"})
	takeAll(t, c, dead, []string{"rejected", "poison", "drop0", "drop1", "drop2"})
}

// durablePurgeDeleteAndTTL: a purge, a queue deletion and the expiry of a
// persistent message stay done across a restart, and a persistent
// message that expired unnoticed before the restart expires after it.
func durablePurgeDeleteAndTTL(t *testing.T, _ matrixCell) {
	dir := t.TempDir()
	s := startServer(t, inDir(dir))
	c := dial(t, s)
	ctx := ctxT(t)
	must := mustDo(t)
	persistent := client.PublishOptions{Persistent: true}
	for _, q := range []string{"purged", "deleted", "ttl", "ttl-late"} {
		must(c.DeclareQueue(ctx, q, client.QueueOptions{Durable: true}))
	}
	for i := range 10 {
		must(c.Publish(ctx, "", "purged", fmt.Appendf(nil, "p%d", i), persistent))
		must(c.Publish(ctx, "", "deleted", fmt.Appendf(nil, "d%d", i), persistent))
	}
	must(c.Purge(ctx, "purged"))
	must(c.Publish(ctx, "", "purged", []byte("after-purge"), persistent))
	must(c.DeleteQueue(ctx, "deleted", client.QueueDeleteOptions{}))
	// Expired and removed by the shard's tick before the restart.
	must(c.Publish(ctx, "", "ttl", []byte("short"), client.PublishOptions{Persistent: true, TTL: 30 * time.Millisecond}))
	must(c.Publish(ctx, "", "ttl", []byte("long"), client.PublishOptions{Persistent: true, TTL: time.Hour}))
	checkFor(t, 5*time.Second, func() error {
		if d := depths(s)["ttl"]; d[0] != 1 {
			return fmt.Errorf("ttl queue holds %v, want 1 ready once the short one expired", d)
		}
		return nil
	})
	// Expiring, most likely after the last tick before the restart.
	must(c.Publish(ctx, "", "ttl-late", []byte("short"), client.PublishOptions{Persistent: true, TTL: time.Millisecond}))
	must(c.Publish(ctx, "", "ttl-late", []byte("long"), client.PublishOptions{Persistent: true, TTL: time.Hour}))
	_ = c.Close()

	s = restart(t, s, dir)
	c = dial(t, s)
	if err := c.DeclareQueue(ctx, "deleted", client.QueueOptions{Passive: true}); client.Code(err) != wire.CodeNotFound {
		t.Fatalf("deleted durable queue after restart: %v", err)
	}
	takeAll(t, c, "purged", []string{"after-purge"})
	takeAll(t, c, "ttl", []string{"long"})
	// Subscribed at once, before the restarted shard's first tick: the
	// message that expired while the broker was down is not delivered.
	takeAll(t, c, "ttl-late", []string{"long"})
}

// durableConcurrentProducersConsumers: producers publish persistent
// messages to durable queues on every shard while consumers accept every
// other message of each queue and leave the rest acquired. After the
// sessions end and a restart, exactly the rest is there, once each, in
// each producer's order.
func durableConcurrentProducersConsumers(t *testing.T, cell matrixCell) {
	const producers, perProducer = 3, 600
	dir := t.TempDir()
	s := startServer(t, inDir(dir))
	ctx := ctxT(t)
	setup := dial(t, s)
	var queues []string
	for i := range max(cell.shards, 2) {
		q := queueOnShard(s, fmt.Sprint("conc", i), i%cell.shards)
		queues = append(queues, q)
		if err := setup.DeclareQueue(ctx, q, client.QueueOptions{Durable: true}); err != nil {
			t.Fatal(err)
		}
	}
	perQueue := make([]int, len(queues))
	for i := range perProducer {
		perQueue[i%len(queues)] += producers
	}
	payload := func(p, i int) string { return fmt.Sprintf("%d-%06d", p, i) }
	// Message i of a producer goes to queue i%len(queues); every other
	// message of each queue is accepted.
	keep := func(i int) bool { return (i/len(queues))%2 == 0 }

	var wg sync.WaitGroup
	var consumers []*client.Conn
	for qi, q := range queues {
		c := dial(t, s)
		consumers = append(consumers, c)
		// Credit for everything: the odd half stays acquired until the
		// session ends.
		con, err := c.Subscribe(ctx, q, client.SubscribeOptions{Credit: uint32(perQueue[qi])})
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range perQueue[qi] {
				d, err := con.Next(ctx)
				if err != nil {
					t.Errorf("queue %s: %v", q, err)
					return
				}
				var p, i int
				fmt.Sscanf(string(d.Payload), "%d-%d", &p, &i)
				if keep(i) {
					err := con.AcceptAsync(ctx, []uint64{d.Tag}, func(err error) {
						if err != nil {
							t.Errorf("accept %s: %v", d.Payload, err)
						}
					})
					if err != nil {
						t.Errorf("accept %s: %v", d.Payload, err)
						return
					}
				}
			}
		}()
	}
	for p := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := dial(t, s)
			for i := range perProducer {
				if err := c.PublishAsync(ctx, "", queues[i%len(queues)], []byte(payload(p, i)), client.PublishOptions{Persistent: true}, nil); err != nil {
					t.Error(err)
					return
				}
			}
			if err := c.Flush(ctx); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	for _, c := range consumers {
		if err := c.Flush(ctx); err != nil { // every accept completed
			t.Fatal(err)
		}
		_ = c.Close()
	}

	s = restart(t, s, dir)
	c := dial(t, s)
	for qi, q := range queues {
		var want []string
		for p := range producers {
			for i := qi; i < perProducer; i += len(queues) {
				if !keep(i) {
					want = append(want, payload(p, i))
				}
			}
		}
		con, err := c.Subscribe(ctx, q, client.SubscribeOptions{Credit: uint32(len(want) + 1), AckMode: client.AckNone})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		last := map[byte]string{}
		for range want {
			d := next(t, con, 5*time.Second)
			pl := string(d.Payload)
			if p := pl[0]; pl <= last[p] {
				t.Fatalf("queue %s after restart: %s after %s", q, pl, last[p])
			}
			last[pl[0]] = pl
			got = append(got, pl)
		}
		expectNone(t, con, 50*time.Millisecond)
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Fatalf("queue %s after restart holds %d messages, want the %d not accepted", q, len(got), len(want))
		}
	}
}
