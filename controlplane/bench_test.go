package controlplane

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthmq/berth/controlplane/ctlapi"
	"github.com/berthmq/berth/controlplane/ctlclient"
	"github.com/cockroachdb/pebble/v2"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// Benchmarks run three controllers on loopback in this process.
//
//	go test ./controlplane -run '^$' -bench . -benchtime 3s
//
// BenchmarkRestart's log size comes from CONTROLPLANE_RESTART_ENTRIES
// (default 200000).

const benchClients = 256

// runParallel splits b.N operations over benchClients goroutines sharing a
// few clients, and reports operations per second.
func runParallel(b *testing.B, addrs []string, op func(cl *ctlclient.Client, i int) error) {
	const clientConns = 16
	clients := make([]*ctlclient.Client, clientConns)
	for i := range clients {
		clients[i] = ctlclient.NewClient(addrs)
		defer clients[i].Close()
	}
	var next atomic.Int64
	var failed atomic.Int64
	var firstErr atomic.Value
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for g := 0; g < benchClients; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := clients[g%clientConns]
			for {
				i := next.Add(1) - 1
				if i >= int64(b.N) {
					return
				}
				if err := op(cl, int(i)); err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err)
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if f := failed.Load(); f > int64(b.N)/100 {
		b.Fatalf("%d of %d operations failed: %v", f, b.N, firstErr.Load())
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "ops/s")
}

// benchProcs gives the process one P per core for each of the three
// controllers, as three controller processes would have (and as the three
// etcd members of etcdcompare have). Pebble's fsyncs block in syscalls that
// keep their P; with three controllers' fsyncs on 2 Ps the other
// goroutines waited for the runtime to take a P back (measured at
// 4a5accf: 58-76k writes/s at GOMAXPROCS 2, 97-104k at 4, 94-111k at 6).
// CONTROLPLANE_BENCH_PROCS overrides it; GOMAXPROCS in the environment
// turns it off.
func benchProcs(b *testing.B) {
	if os.Getenv("GOMAXPROCS") != "" {
		return
	}
	want := 3 * runtime.NumCPU()
	if v, err := strconv.Atoi(os.Getenv("CONTROLPLANE_BENCH_PROCS")); err == nil && v > 0 {
		want = v
	}
	old := runtime.GOMAXPROCS(want)
	b.Cleanup(func() { runtime.GOMAXPROCS(old) })
	b.ReportMetric(float64(want), "procs")
}

func benchCluster(b *testing.B, tweak func(*Config)) *testCluster {
	benchProcs(b)
	c := newTestCluster(b, 3, func(cfg *Config) {
		cfg.TickInterval = 20 * time.Millisecond
		if tweak != nil {
			tweak(cfg)
		}
	})
	c.leader()
	return c
}

// BenchmarkWrite: write events/s from 256 concurrent clients. Each event is
// a SetAttribute with a 256-byte value.
func BenchmarkWrite(b *testing.B) {
	value := strings.Repeat("v", 256) // as the etcd comparison's puts
	for _, batching := range []bool{true, false} {
		b.Run(fmt.Sprintf("batching=%v", batching), func(b *testing.B) {
			b.ReportAllocs()
			c := benchCluster(b, func(cfg *Config) { cfg.DisableBatching = !batching })
			runParallel(b, c.addrList(), func(cl *ctlclient.Client, i int) error {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				return cl.SetAttribute(ctx, "k"+strconv.Itoa(i%1024), value)
			})
		})
	}
}

// BenchmarkRead: consistent reads/s from 256 concurrent clients.
func BenchmarkRead(b *testing.B) {
	for _, tc := range []struct {
		name  string
		lease bool
		mode  ctlapi.ReadMode
	}{
		{"readindex", false, ctlapi.ReadConsistent},
		{"lease", true, ctlapi.ReadConsistent},
		{"follower", false, ctlapi.ReadFollower},
	} {
		b.Run("mode="+tc.name, func(b *testing.B) {
			b.ReportAllocs()
			c := benchCluster(b, func(cfg *Config) { cfg.LeaseRead = tc.lease })
			cl := ctlclient.NewClient(c.addrList())
			ctx := ctxT(b, 10*time.Second)
			for k := 0; k < 64; k++ {
				if err := cl.SetAttribute(ctx, "k"+strconv.Itoa(k), strings.Repeat("v", 256)); err != nil {
					b.Fatal(err)
				}
			}
			cl.Close()
			runParallel(b, c.addrList(), func(cl *ctlclient.Client, i int) error {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				_, ok, err := cl.GetAttribute(ctx, tc.mode, "k"+strconv.Itoa(i%64))
				if err == nil && !ok {
					err = fmt.Errorf("key missing")
				}
				return err
			})
		})
	}
}

// BenchmarkFailover: with 10,000 groups all mastered by broker 1, the time
// from broker 1's last heartbeat until every group has a new master. The
// 500ms broker timeout is part of it; elect-ms is the time after the
// timeout: detection by the scan (every timeout/8) plus the elections.
func BenchmarkFailover(b *testing.B) {
	const groups = 10000
	const timeout = 500 * time.Millisecond
	b.ReportAllocs()
	c := benchCluster(b, func(cfg *Config) { cfg.BrokerTimeout = timeout })
	cl := ctlclient.NewClient(c.addrList())
	defer cl.Close()
	setupBrokers(b, cl, 3, groups)
	hb2 := startHeartbeats(cl, 2, groups, 100, 100*time.Millisecond)
	defer hb2.halt()
	hb3 := startHeartbeats(cl, 3, groups, 100, 100*time.Millisecond)
	defer hb3.halt()
	ids := make([]uint32, groups)
	for i := range ids {
		ids[i] = uint32(i)
	}
	var total, elect time.Duration
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		hb1 := startHeartbeats(cl, 1, groups, 100, 100*time.Millisecond)
		// Give every group broker 1 as master, with 1, 2 and 3 in sync.
		checkFor(b, 30*time.Second, 50*time.Millisecond, func() error {
			l := c.leader()
			for br := uint32(1); br <= 3; br++ {
				if !l.hb.candidate(br, 0, time.Now()).Alive {
					return fmt.Errorf("broker %d not seen", br)
				}
			}
			return nil
		})
		// Put 1, 2 and 3 in every group's SyncStateSet, move every master
		// to broker 1, and put 2 and 3 back in sync behind it.
		syncAll := func() {
			var wg sync.WaitGroup
			sem := make(chan struct{}, 256)
			for _, g := range allGroups(b, cl, ctlapi.ReadConsistent) {
				if g.Master == 0 || len(g.SyncStateSet) == 3 {
					continue
				}
				wg.Add(1)
				sem <- struct{}{}
				go func() {
					defer func() { <-sem; wg.Done() }()
					if err := cl.AlterSyncStateSet(ctxT(b, 10*time.Second), g.ID, g.Master, g.Epoch, []uint32{1, 2, 3}); err != nil {
						b.Error(err)
					}
				}()
			}
			wg.Wait()
		}
		syncAll()
		if _, err := cl.ElectMaster(ctxT(b, 30*time.Second), ids, 1); err != nil {
			b.Fatal(err)
		}
		syncAll()
		leader := c.leader()
		mastered := func() int {
			var n int
			leader.mu.RLock()
			n = len(leader.state.GroupsMasteredBy(1))
			leader.mu.RUnlock()
			return n
		}
		if n := mastered(); n != groups {
			b.Fatalf("broker 1 masters %d groups, want %d", n, groups)
		}
		b.StartTimer()
		hb1.halt()
		// The broker died right after its last heartbeat.
		died := time.Unix(0, hb1.last.Load())
		for mastered() != 0 {
			time.Sleep(time.Millisecond)
			if time.Since(died) > 30*time.Second {
				b.Fatalf("groups still mastered by the dead broker: %d", mastered())
			}
		}
		d := time.Since(died)
		total += d
		elect += d - timeout
	}
	b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "failover-ms")
	b.ReportMetric(float64(elect.Milliseconds())/float64(b.N), "elect-ms")
}

// buildLog writes a single-member log of n entries straight into pebble,
// one SetAttribute per entry over 1,000 keys. With snapshot set, it also
// writes a snapshot of the final state and compacts the log.
func buildLog(b *testing.B, dir string, n int, snapshot bool) {
	st, err := openStorage(dir, []uint64{1}, quietLogger())
	if err != nil {
		b.Fatal(err)
	}
	state := NewState()
	batch := st.db.NewBatch()
	var buf []byte
	for i := 0; i < n; i++ {
		idx := uint64(i + 2)
		ev := &ctlapi.SetAttribute{Key: "k" + strconv.Itoa(i%1000), Value: strconv.Itoa(i)}
		data := []byte{entryFormat}
		data = append(data, make([]byte, 20)...)
		data[20] = 1 // count; proposer 0 and seq 0 match no waiter
		evb := ctlapi.EncodeEvent(nil, ev)
		data = append(data, byte(len(evb)>>24), byte(len(evb)>>16), byte(len(evb)>>8), byte(len(evb)))
		data = append(data, evb...)
		if snapshot {
			state.Apply(ev)
		}
		buf, _ = proto.MarshalOptions{}.MarshalAppend(buf[:0], &pb.Entry{Term: proto.Uint64(1), Index: proto.Uint64(idx), Data: data})
		batch.Set(entryKey(idx), buf, nil)
		if batch.Len() > 4<<20 {
			if err := batch.Commit(pebble.NoSync); err != nil {
				b.Fatal(err)
			}
			batch = st.db.NewBatch()
		}
	}
	last := uint64(n + 1)
	hs, _ := proto.Marshal(&pb.HardState{Term: proto.Uint64(1), Vote: proto.Uint64(1), Commit: proto.Uint64(last)})
	batch.Set(keyHardState, hs, nil)
	if err := batch.Commit(pebble.Sync); err != nil {
		b.Fatal(err)
	}
	if snapshot {
		snap := &pb.Snapshot{Data: compressSnapshot(state.Encode()), Metadata: &pb.SnapshotMetadata{
			Index: proto.Uint64(last), Term: proto.Uint64(1), ConfState: &pb.ConfState{Voters: []uint64{1}}}}
		raw, _ := proto.Marshal(snap)
		wb := st.db.NewBatch()
		wb.Set(keySnapshot, raw, nil)
		wb.DeleteRange(entryKey(0), entryKey(last+1), nil)
		if err := wb.Commit(pebble.Sync); err != nil {
			b.Fatal(err)
		}
		if err := st.db.Compact(context.Background(), entryKey(0), entryKey(last+1), true); err != nil {
			b.Fatal(err)
		}
	}
	st.close()
}

func copyDir(b *testing.B, src, dst string) {
	if err := os.CopyFS(dst, os.DirFS(src)); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkRestart: time from Start until a single controller has applied
// a log of CONTROLPLANE_RESTART_ENTRIES entries, by replaying the log or
// from a snapshot.
func BenchmarkRestart(b *testing.B) {
	n := 200000
	if v := os.Getenv("CONTROLPLANE_RESTART_ENTRIES"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n <= 0 {
			b.Fatalf("bad CONTROLPLANE_RESTART_ENTRIES %q", v)
		}
	}
	for _, snapshot := range []bool{false, true} {
		b.Run(fmt.Sprintf("entries=%d/snapshot=%v", n, snapshot), func(b *testing.B) {
			b.ReportAllocs()
			base := filepath.Join(b.TempDir(), "base")
			buildLog(b, base, n, snapshot)
			var total time.Duration
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				dir := filepath.Join(b.TempDir(), strconv.Itoa(i))
				copyDir(b, base, dir)
				b.StartTimer()
				start := time.Now()
				node, err := Start(Config{ID: 1, Peers: map[uint64]string{1: "127.0.0.1:0"}, Dir: dir,
					Logger: quietLogger(), SnapshotEntries: -1})
				if err != nil {
					b.Fatal(err)
				}
				for node.Applied() < uint64(n+1) {
					time.Sleep(100 * time.Microsecond)
				}
				total += time.Since(start)
				b.StopTimer()
				var v string
				node.mu.RLock()
				v, _ = node.state.Attribute("k" + strconv.Itoa((n-1)%1000))
				node.mu.RUnlock()
				node.Stop()
				if v != strconv.Itoa(n-1) {
					b.Fatalf("restored state has %q for the last key, want %d", v, n-1)
				}
			}
			b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "restart-ms")
		})
	}
}
