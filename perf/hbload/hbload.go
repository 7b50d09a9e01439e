// Package hbload plays many brokers against a real controller group: it
// registers them, places replication groups over them (cluster init),
// heartbeats for each at the brokers' interval with its groups' log ends,
// and then stops one broker's heartbeats at a time, as a broker's death
// looks to the controller, timing until every group it mastered has a
// new master. It measures what seed 002 asks of a controller serving
// many brokers: the heartbeats per second it holds, their latency, and
// the election latency after a death at that scale.
package hbload

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/berthmq/berth/controlplane/ctlapi"
	"github.com/berthmq/berth/controlplane/ctlclient"
	"github.com/berthmq/berth/wire"
)

// Config is one run.
type Config struct {
	Endpoints []string      // the controller members' addresses
	Brokers   int           // brokers played
	Groups    uint32        // replication groups placed over them
	Replicas  uint32        // replicas per group
	Conns     int           // client connections the brokers share
	Interval  time.Duration // each broker's heartbeat interval
	Measure   time.Duration // the steady state measured, after a warm-up of 3 intervals
	Kills     int           // brokers whose heartbeats stop, one at a time
	// Timeout bounds the whole run, and each wait for new masters.
	Timeout time.Duration
}

// Result is what a run measured.
type Result struct {
	Heartbeats    int64         // answered in the measured window
	Failed        int64         // refused or timed out in the window
	PerSecond     float64       // Heartbeats / Measure
	Due           float64       // heartbeats per second the brokers were due to send
	HeartbeatP50  time.Duration // answer latency
	HeartbeatP99  time.Duration
	HeartbeatMax  time.Duration
	Failovers     []time.Duration // from a broker's last heartbeat to new masters for all its groups
	GroupsPerKill []int           // the groups each killed broker mastered
	RegisterTook  time.Duration
}

// Run plays cfg.Brokers brokers against the controller at cfg.Endpoints,
// whose cluster must not be initialised yet.
func Run(ctx context.Context, cfg Config) (Result, error) {
	var res Result
	if cfg.Brokers <= 0 || cfg.Groups == 0 || cfg.Replicas == 0 || cfg.Conns <= 0 || cfg.Interval <= 0 {
		return res, errors.New("hbload: brokers, groups, replicas, conns and interval must be positive")
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	cls := make([]*ctlclient.Client, cfg.Conns)
	for i := range cls {
		cls[i] = ctlclient.NewClient(cfg.Endpoints)
		defer cls[i].Close()
	}

	// Register, 64 at once.
	start := time.Now()
	ids := make([]uint32, cfg.Brokers)
	if err := parallel(ctx, cfg.Brokers, 64, func(i int) error {
		cl := cls[i%len(cls)]
		id, err := cl.ApplyBrokerID(ctx, 0)
		if err != nil {
			return fmt.Errorf("broker id: %w", err)
		}
		ids[i] = id
		// An address nobody dials: the controller only records it.
		return cl.RegisterBroker(ctx, id, []string{fmt.Sprintf("127.0.0.1:%d", 10000+i)}, uint16(wire.Current))
	}); err != nil {
		return res, err
	}
	res.RegisterTook = time.Since(start)

	// Heartbeats from every broker, before and after the placement (the
	// controller places groups over the live brokers).
	brokers := make([]*player, cfg.Brokers)
	for i, id := range ids {
		brokers[i] = &player{id: id, cl: cls[i%len(cls)], stop: make(chan struct{})}
	}
	hist := hdrhistogram.New(1, int64(10*time.Second/time.Microsecond), 3)
	var mu sync.Mutex
	var measuring atomic.Bool
	var answered, failed atomic.Int64
	var wg sync.WaitGroup
	for i, p := range brokers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Spread over the interval, as brokers started at random times.
			t := time.NewTimer(cfg.Interval * time.Duration(i) / time.Duration(len(brokers)))
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-p.stop:
					return
				case <-t.C:
				}
				t.Reset(cfg.Interval)
				hctx, hcancel := context.WithTimeout(ctx, cfg.Interval*4)
				sent := time.Now()
				_, err := p.cl.HeartbeatGrants(hctx, p.id, p.ends())
				took := time.Since(sent)
				hcancel()
				if err == nil {
					p.last.Store(sent.UnixNano())
				}
				if !measuring.Load() {
					continue
				}
				if err != nil {
					failed.Add(1)
					continue
				}
				answered.Add(1)
				mu.Lock()
				_ = hist.RecordValue(took.Microseconds())
				mu.Unlock()
			}
		}()
	}
	defer func() {
		for _, p := range brokers {
			p.close()
		}
		cancel()
		wg.Wait()
	}()
	time.Sleep(3 * cfg.Interval)

	info, err := cls[0].GetClusterInfo(ctx, ctlapi.ReadConsistent)
	if err != nil {
		return res, err
	}
	cc := info.Config
	cc.Groups, cc.Replicas = cfg.Groups, cfg.Replicas
	if err := cls[0].SetClusterConfig(ctx, cc); err != nil {
		return res, fmt.Errorf("cluster init: %w", err)
	}
	groups, err := readGroups(ctx, cls[0], cfg.Groups)
	if err != nil {
		return res, err
	}
	byID := map[uint32]*player{}
	for _, p := range brokers {
		byID[p.id] = p
	}
	all := make([]uint32, 0, len(groups))
	for _, g := range groups {
		all = append(all, g.ID)
		for _, b := range g.Replicas {
			if p := byID[b]; p != nil {
				p.addGroup(g.ID, g.Epoch)
			}
		}
	}
	// The first elections, which brokers ask for once their heartbeats
	// carry the groups' log ends.
	time.Sleep(3 * cfg.Interval)
	// Only the groups still without a master: another election of an
	// elected group would start a new epoch with the master alone in its
	// set.
	for unelected := all; len(unelected) > 0; {
		if _, err := cls[0].ElectMaster(ctx, unelected, 0); err != nil && ctx.Err() != nil {
			return res, fmt.Errorf("first elections: %w", err)
		}
		ectx, ecancel := context.WithTimeout(ctx, time.Second)
		groups, err = waitMasters(ectx, cls[0], cfg.Groups, nil)
		ecancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return res, err
		}
		gs, rerr := readGroups(ctx, cls[0], cfg.Groups)
		if rerr != nil {
			return res, rerr
		}
		unelected = unelected[:0]
		for _, g := range gs {
			if g.Master == 0 {
				unelected = append(unelected, g.ID)
			}
		}
	}
	// Each master grows its SyncStateSet to every replica, as a master
	// does once its followers caught up: only in-sync replicas are
	// elected after a death.
	killed := map[uint32]bool{}
	growSets := func(gs []ctlapi.Group) error {
		return parallel(ctx, len(gs), 64, func(i int) error {
			g := gs[i]
			var set []uint32
			for _, b := range g.Replicas {
				if !killed[b] {
					set = append(set, b)
				}
			}
			slices.Sort(set)
			if slices.Equal(set, g.SyncStateSet) {
				return nil
			}
			return cls[i%len(cls)].AlterSyncStateSet(ctx, g.ID, g.Master, g.Epoch, set)
		})
	}
	if err := growSets(groups); err != nil {
		return res, fmt.Errorf("sync state sets: %w", err)
	}
	time.Sleep(3 * cfg.Interval)

	measuring.Store(true)
	time.Sleep(cfg.Measure)
	measuring.Store(false)
	res.Heartbeats, res.Failed = answered.Load(), failed.Load()
	res.PerSecond = float64(res.Heartbeats) / cfg.Measure.Seconds()
	res.Due = float64(cfg.Brokers) / cfg.Interval.Seconds()
	res.HeartbeatP50 = time.Duration(hist.ValueAtQuantile(50)) * time.Microsecond
	res.HeartbeatP99 = time.Duration(hist.ValueAtQuantile(99)) * time.Microsecond
	res.HeartbeatMax = time.Duration(hist.Max()) * time.Microsecond

	// Deaths: a broker that masters groups stops heartbeating.
	for range cfg.Kills {
		groups, err := readGroups(ctx, cls[0], cfg.Groups)
		if err != nil {
			return res, err
		}
		masters := map[uint32][]uint32{}
		for _, g := range groups {
			if g.Master != 0 && !killed[g.Master] {
				masters[g.Master] = append(masters[g.Master], g.ID)
			}
		}
		// One whose every group keeps a live replica to elect (the
		// killed stay dead).
		var victim uint32
		for _, id := range slices.Sorted(maps.Keys(masters)) {
			ok := true
			for _, g := range groups {
				if g.Master != id {
					continue
				}
				live := 0
				for _, b := range g.Replicas {
					if b != id && !killed[b] {
						live++
					}
				}
				ok = ok && live > 0
			}
			if ok {
				victim = id
				break
			}
		}
		if victim == 0 {
			return res, errors.New("hbload: no live broker masters a group that another live broker replicates")
		}
		p := byID[victim]
		p.close()
		killed[victim] = true
		lastBeat := time.Unix(0, p.last.Load())
		moved, err := waitMasters(ctx, cls[0], cfg.Groups, func(g ctlapi.Group) bool {
			return !slices.Contains(masters[victim], g.ID) || (g.Master != 0 && g.Master != victim)
		})
		if err != nil {
			gs, _ := readGroups(context.Background(), cls[0], cfg.Groups)
			var stuck []string
			for _, g := range gs {
				if slices.Contains(masters[victim], g.ID) && (g.Master == 0 || g.Master == victim) {
					stuck = append(stuck, fmt.Sprintf("group %d master %d epoch %d set %v", g.ID, g.Master, g.Epoch, g.SyncStateSet))
				}
			}
			return res, fmt.Errorf("after broker %d stopped: %w (%s)", victim, err, strings.Join(stuck, "; "))
		}
		res.Failovers = append(res.Failovers, time.Since(lastBeat))
		res.GroupsPerKill = append(res.GroupsPerKill, len(masters[victim]))
		// The new masters take their caught-up followers back into the
		// set, as a broker's master does.
		var changed []ctlapi.Group
		for _, g := range moved {
			if slices.Contains(masters[victim], g.ID) {
				changed = append(changed, g)
			}
		}
		if err := growSets(changed); err != nil {
			return res, fmt.Errorf("sync state sets after broker %d stopped: %w", victim, err)
		}
	}
	return res, nil
}

// player is one broker played.
type player struct {
	id   uint32
	cl   *ctlclient.Client
	stop chan struct{}
	once sync.Once
	last atomic.Int64 // unix ns of the last answered heartbeat's send
	mu   sync.Mutex
	logs []ctlapi.GroupLogEnd
}

func (p *player) close() { p.once.Do(func() { close(p.stop) }) }

func (p *player) addGroup(g, epoch uint32) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.logs = append(p.logs, ctlapi.GroupLogEnd{Group: g, LogEnd: ctlapi.LogEnd{Epoch: epoch, Index: 1}})
}

// ends are the log ends a heartbeat reports: every group the broker
// holds, its log at the same end as the others' (nothing is written).
func (p *player) ends() []ctlapi.GroupLogEnd {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.logs)
}

// readGroups reads every group's record.
func readGroups(ctx context.Context, cl *ctlclient.Client, n uint32) ([]ctlapi.Group, error) {
	var out []ctlapi.Group
	for start := uint32(0); start < n; {
		gs, _, err := cl.GetGroups(ctx, ctlapi.ReadConsistent, start, 256)
		if err != nil {
			return nil, err
		}
		if len(gs) == 0 {
			break
		}
		out = append(out, gs...)
		start += uint32(len(gs))
	}
	return out, nil
}

// waitMasters waits until every group has a master (and, with ok, until
// ok holds for every group), polling the controller every 5 ms.
func waitMasters(ctx context.Context, cl *ctlclient.Client, n uint32, ok func(ctlapi.Group) bool) ([]ctlapi.Group, error) {
	for {
		gs, err := readGroups(ctx, cl, n)
		if err == nil && uint32(len(gs)) == n {
			done := true
			for _, g := range gs {
				if g.Master == 0 || (ok != nil && !ok(g)) {
					done = false
					break
				}
			}
			if done {
				return gs, nil
			}
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("hbload: groups without a new master: %w", ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// parallel runs f(0..n-1), at most width at once, and returns the first
// error.
func parallel(ctx context.Context, n, width int, f func(i int) error) error {
	var wg sync.WaitGroup
	var first atomic.Pointer[error]
	sem := make(chan struct{}, width)
	for i := range n {
		if first.Load() != nil || ctx.Err() != nil {
			break
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			if err := f(i); err != nil {
				first.CompareAndSwap(nil, &err)
			}
		}()
	}
	wg.Wait()
	if e := first.Load(); e != nil {
		return *e
	}
	return ctx.Err()
}
