package controlplane

import (
	"context"
	"fmt"
	"math/rand"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthmq/berth/controlplane/ctlapi"
	"github.com/berthmq/berth/controlplane/ctlclient"
)

// heartbeater sends heartbeats for one broker until stopped.
type heartbeater struct {
	stop chan struct{}
	done chan struct{}
	last atomic.Int64 // unix nanos of the last heartbeat the leader took
}

func startHeartbeats(cl *ctlclient.Client, broker uint32, groups uint32, index uint64, every time.Duration) *heartbeater {
	h := &heartbeater{stop: make(chan struct{}), done: make(chan struct{})}
	ends := make([]ctlapi.GroupLogEnd, groups)
	for g := range ends {
		ends[g] = ctlapi.GroupLogEnd{Group: uint32(g), LogEnd: ctlapi.LogEnd{Epoch: 1, Index: index}}
	}
	go func() {
		defer close(h.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			if cl.Heartbeat(ctx, broker, ends) == nil { // a missed beat is what the detector is for
				h.last.Store(time.Now().UnixNano())
			}
			cancel()
			select {
			case <-h.stop:
				return
			case <-t.C:
			}
		}
	}()
	return h
}

func (h *heartbeater) halt() { close(h.stop); <-h.done }

func setupBrokers(t testing.TB, cl *ctlclient.Client, brokers int, groups uint32) {
	t.Helper()
	ctx := ctxT(t, 20*time.Second)
	if err := cl.SetClusterConfig(ctx, ctlapi.ClusterConfig{Groups: groups}); err != nil {
		t.Fatal(err)
	}
	for b := 1; b <= brokers; b++ {
		id, err := cl.ApplyBrokerID(ctx, uint32(b))
		if err != nil || id != uint32(b) {
			t.Fatalf("broker id %d: %d %v", b, id, err)
		}
		if err := cl.RegisterBroker(ctx, id, []string{fmt.Sprintf("127.0.0.1:%d", 7400+b)}, 0x0100); err != nil {
			t.Fatal(err)
		}
	}
}

func allGroups(t testing.TB, cl *ctlclient.Client, mode ctlapi.ReadMode) []ctlapi.Group {
	t.Helper()
	gs, total, err := cl.GetGroups(ctxT(t, 10*time.Second), mode, 0, ctlapi.GroupsPerReplyMax)
	if err != nil || uint32(len(gs)) != total {
		t.Fatalf("groups: %d of %d, %v", len(gs), total, err)
	}
	return gs
}

func TestBrokerDeathElectsNewMasters(t *testing.T) {
	// Heartbeats every 50 ms; 1 s is wide enough for a loaded machine under
	// -race. The new leader's grace is the whole timeout too: these
	// heartbeaters find a new leader only through the client's redirects,
	// which under -race on a loaded machine took longer than the default
	// third of it, and the live brokers lost their masterships.
	c := newTestCluster(t, 3, func(cfg *Config) { cfg.BrokerTimeout, cfg.LeaderGrace = time.Second, time.Second })
	c.leader()
	cl := ctlclient.NewClient(c.addrList())
	defer cl.Close()
	const groups = 60
	setupBrokers(t, cl, 3, groups)
	var hbs []*heartbeater
	for b := uint32(1); b <= 3; b++ {
		hbs = append(hbs, startHeartbeats(cl, b, groups, 0, 50*time.Millisecond))
	}
	ids := make([]uint32, groups)
	for i := range ids {
		ids[i] = uint32(i)
	}
	// Wait for all three brokers to be seen alive, then elect the first
	// masters; ties spread them over the brokers.
	checkFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		l := c.leader()
		for b := uint32(1); b <= 3; b++ {
			if !l.hb.candidate(b, 0, time.Now()).Alive {
				return fmt.Errorf("broker %d not seen yet", b)
			}
		}
		return nil
	})
	checkFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		elected, err := cl.ElectMaster(ctxT(t, 5*time.Second), ids, 0)
		if err != nil {
			return err
		}
		gs := allGroups(t, cl, ctlapi.ReadConsistent)
		for _, g := range gs {
			if g.Master == 0 || len(g.SyncStateSet) != 3 {
				return fmt.Errorf("group %+v not fully elected (elected %d this round)", g, elected)
			}
		}
		return nil
	})
	// Broker 3 moves furthest ahead in every group, broker 1 least.
	for i, h := range hbs {
		h.halt()
		hbs[i] = startHeartbeats(cl, uint32(i+1), groups, uint64(10*(i+1)), 50*time.Millisecond)
	}
	defer func() {
		for _, h := range hbs[1:] {
			h.halt()
		}
	}()
	before := allGroups(t, cl, ctlapi.ReadConsistent)
	var ofOne []uint32
	for _, g := range before {
		if g.Master == 1 {
			ofOne = append(ofOne, g.ID)
		}
	}
	if len(ofOne) != groups/3 {
		t.Fatalf("broker 1 masters %d groups, want %d", len(ofOne), groups/3)
	}
	// Group ofOne[0] keeps only broker 1 in sync: with unclean election off
	// it must be left without a master rather than lose data.
	g0 := before[ofOne[0]]
	if err := cl.AlterSyncStateSet(ctxT(t, 5*time.Second), g0.ID, 1, g0.Epoch, []uint32{1}); err != nil {
		t.Fatal(err)
	}

	hbs[0].halt() // broker 1 dies
	// The controller leader also dies; the next one must still notice.
	c.stop(c.leader().ID())
	checkFor(t, 15*time.Second, 20*time.Millisecond, func() error {
		for _, g := range allGroups(t, cl, ctlapi.ReadConsistent) {
			if g.Master == 1 {
				return fmt.Errorf("group %d still mastered by dead broker 1", g.ID)
			}
		}
		return nil
	})
	after := allGroups(t, cl, ctlapi.ReadFollower)
	for i, g := range after {
		old := before[i]
		switch {
		case g.ID == g0.ID:
			if g.Master != 0 || g.Epoch != old.Epoch+1 {
				t.Fatalf("group %d with no in-sync survivor: %+v (unclean election is off)", g.ID, g)
			}
		case old.Master == 1:
			if g.Master != 3 || g.Epoch != old.Epoch+1 || g.ElectedLogEnd.Index != 30 {
				t.Fatalf("group %d: want broker 3 (highest log end) at epoch %d, got %+v", g.ID, old.Epoch+1, g)
			}
		default:
			if g.Master != old.Master || g.Epoch != old.Epoch {
				t.Fatalf("group %d changed although its master lives: %+v -> %+v", g.ID, old, g)
			}
		}
	}
	// Unclean election, once allowed, takes a live broker for the orphan.
	if err := cl.SetClusterConfig(ctxT(t, 5*time.Second), ctlapi.ClusterConfig{Groups: groups, UncleanElection: true}); err != nil {
		t.Fatal(err)
	}
	if n, err := cl.ElectMaster(ctxT(t, 5*time.Second), []uint32{g0.ID}, 0); err != nil || n != 1 {
		t.Fatalf("unclean election: %d %v", n, err)
	}
	if g, err := cl.GetReplicaInfo(ctxT(t, 5*time.Second), ctlapi.ReadConsistent, g0.ID); err != nil || g.Master != 3 {
		t.Fatalf("orphan after unclean election: %+v %v", g, err)
	}
}

func TestHeartbeatShardsExpireIncrementally(t *testing.T) {
	h := newHeartbeats(time.Second, 0)
	t0 := time.Unix(1000, 0)
	var wg sync.WaitGroup
	for b := uint32(1); b <= 64; b++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h.beat(b, []ctlapi.GroupLogEnd{{Group: 2, LogEnd: ctlapi.LogEnd{Epoch: 1, Index: uint64(b)}}, {Group: 1}}, t0.Add(time.Duration(b)*time.Millisecond))
		}()
	}
	wg.Wait()
	if dead := h.expired(t0.Add(time.Second)); len(dead) != 0 {
		t.Fatalf("expired early: %v", dead)
	}
	dead := h.expired(t0.Add(time.Second + 10500*time.Microsecond))
	if len(dead) != 10 || dead[0] != 1 || dead[9] != 10 {
		t.Fatalf("expired %v, want brokers 1..10", dead)
	}
	if again := h.expired(t0.Add(time.Second + 10500*time.Microsecond)); len(again) != 0 {
		t.Fatalf("reported twice: %v", again)
	}
	now := t0.Add(time.Second + 20*time.Millisecond)
	if c := h.candidate(5, 2, now); c.Alive || c.LogEnd.Index != 5 {
		t.Fatalf("dead broker candidate %+v", c)
	}
	if c := h.candidate(40, 2, now); !c.Alive || c.LogEnd.Index != 40 {
		t.Fatalf("live broker candidate %+v", c)
	}
	h.beat(5, nil, now)
	if c := h.candidate(5, 2, now); !c.Alive || c.LogEnd.Index != 5 {
		t.Fatalf("revived broker lost its log ends: %+v", c)
	}
}

// TestRestartedBrokerCountedDeadOnce: a broker whose connection closed
// and that heartbeats again at once over a new one (it restarted within
// one scan) is still reported dead once, so the groups it mastered get a
// new epoch; then it is alive again.
func TestRestartedBrokerCountedDeadOnce(t *testing.T) {
	h := newHeartbeats(time.Minute, 0)
	t0 := time.Unix(1000, 0)
	ends := []ctlapi.GroupLogEnd{{Group: 1, LogEnd: ctlapi.LogEnd{Epoch: 2, Index: 7}}}
	h.beatOn(3, ends, t0, 10)
	h.beatOn(4, ends, t0, 11)
	h.disconnected(10, []uint32{3}, t0.Add(time.Millisecond))
	h.beatOn(3, ends, t0.Add(2*time.Millisecond), 12) // the restarted process
	now := t0.Add(3 * time.Millisecond)
	if c := h.candidate(3, 1, now); c.Alive {
		t.Fatalf("a broker whose connection closed is a candidate before the scan: %+v", c)
	}
	if dead := h.expired(now); !slices.Equal(dead, []uint32{3}) {
		t.Fatalf("expired %v, want [3]", dead)
	}
	h.beatOn(3, ends, now, 12)
	if c := h.candidate(3, 1, now); !c.Alive {
		t.Fatalf("a broker heartbeating after the scan is not alive: %+v", c)
	}
	if dead := h.expired(now.Add(time.Second)); len(dead) != 0 {
		t.Fatalf("reported dead again: %v", dead)
	}
	// A connection closing that is not the one the broker heartbeats on
	// changes nothing.
	h.disconnected(99, []uint32{4}, now)
	if dead := h.expired(now.Add(time.Second)); len(dead) != 0 {
		t.Fatalf("an old connection's close killed broker 4: %v", dead)
	}
}

// masteredByBroker1 registers brokers 1 to 3 in 8 groups, heartbeats for
// each over its own client (every 50 ms, log ends level), and elects broker
// 1 master of every group once the leader heard all three. Broker 1's
// heartbeats and client are the caller's to stop; the others stop at the
// test's end.
func masteredByBroker1(t *testing.T, c *testCluster) (*ctlclient.Client, map[uint32]*ctlclient.Client, []*heartbeater) {
	t.Helper()
	admin := ctlclient.NewClient(c.addrList())
	t.Cleanup(admin.Close)
	const groups = 8
	setupBrokers(t, admin, 3, groups)
	clients := map[uint32]*ctlclient.Client{}
	var hbs []*heartbeater
	for b := uint32(1); b <= 3; b++ {
		clients[b] = ctlclient.NewClient(c.addrList())
		hbs = append(hbs, startHeartbeats(clients[b], b, groups, 5, 50*time.Millisecond))
	}
	t.Cleanup(func() {
		for _, h := range hbs[1:] {
			h.halt()
		}
		clients[2].Close()
		clients[3].Close()
	})
	ids := []uint32{0, 1, 2, 3, 4, 5, 6, 7}
	// Elect only once the leader heard all three, or the first election
	// would settle on the brokers it had heard so far.
	checkFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		l := c.leader()
		for b := uint32(1); b <= 3; b++ {
			if !l.hb.candidate(b, 0, time.Now()).Alive {
				return fmt.Errorf("broker %d not seen yet", b)
			}
		}
		return nil
	})
	checkFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if _, err := admin.ElectMaster(ctxT(t, 5*time.Second), ids, 1); err != nil {
			return err
		}
		for _, g := range allGroups(t, admin, ctlapi.ReadConsistent) {
			if g.Master != 1 || len(g.SyncStateSet) != 3 {
				return fmt.Errorf("group %+v", g)
			}
		}
		return nil
	})
	return admin, clients, hbs
}

// TestBrokerDisconnectElectsWithoutTimeout: a broker's heartbeat connection
// dropping makes its groups move at the next scan, long before the broker
// timeout.
func TestBrokerDisconnectElectsWithoutTimeout(t *testing.T) {
	c := newTestCluster(t, 3, func(cfg *Config) { cfg.BrokerTimeout = time.Minute })
	c.leader()
	admin, clients, hbs := masteredByBroker1(t, c)
	start := time.Now()
	hbs[0].halt()
	clients[1].Close() // the broker process dies: its connection drops
	checkFor(t, 20*time.Second, 20*time.Millisecond, func() error {
		for _, g := range allGroups(t, admin, ctlapi.ReadConsistent) {
			if g.Master == 1 || g.Master == 0 {
				return fmt.Errorf("group %d master %d", g.ID, g.Master)
			}
		}
		return nil
	})
	if d := time.Since(start); d > 15*time.Second {
		t.Fatalf("took %v: the disconnect did not count", d)
	}
}

// TestNewLeaderGrace: a new leader counts dead, after the grace and not
// after the whole broker timeout, a broker that has not heartbeated to it;
// a broker that has keeps the full timeout.
func TestNewLeaderGrace(t *testing.T) {
	h := newHeartbeats(time.Minute, 100*time.Millisecond)
	t0 := time.Unix(1000, 0)
	h.becomeLeader([]ctlapi.Broker{{ID: 1}, {ID: 2}, {ID: 3}}, t0)
	ends := []ctlapi.GroupLogEnd{{Group: 0, LogEnd: ctlapi.LogEnd{Epoch: 1, Index: 4}}}
	h.beatOn(1, ends, t0.Add(10*time.Millisecond), 7)
	h.beatOn(3, ends, t0.Add(90*time.Millisecond), 8)
	if dead := h.expired(t0.Add(99 * time.Millisecond)); len(dead) != 0 {
		t.Fatalf("dead within the grace: %v", dead)
	}
	if c := h.candidate(2, 0, t0.Add(50*time.Millisecond)); c.Alive {
		t.Fatalf("a broker not heard by this leader is a candidate: %+v", c)
	}
	if dead := h.expired(t0.Add(101 * time.Millisecond)); !slices.Equal(dead, []uint32{2}) {
		t.Fatalf("expired %v after the grace, want [2]", dead)
	}
	if dead := h.expired(t0.Add(59 * time.Second)); len(dead) != 0 {
		t.Fatalf("brokers that heartbeated expired before their timeout: %v", dead)
	}
	// The silent broker comes back: alive again, on the full timeout.
	h.beatOn(2, ends, t0.Add(time.Second), 9)
	if c := h.candidate(2, 0, t0.Add(30*time.Second)); !c.Alive {
		t.Fatalf("a broker heartbeating after the grace is not alive: %+v", c)
	}
	// Grace 0 or past the timeout means the timeout.
	if g := newHeartbeats(time.Second, 0).grace; g != time.Second {
		t.Fatalf("grace %v", g)
	}
	if g := newHeartbeats(time.Second, time.Hour).grace; g != time.Second {
		t.Fatalf("grace %v", g)
	}
}

// TestLeaderDeathWithMasterElectsWithinGrace: the controller leader stops
// together with a broker that masters every group (one process held both).
// The new leader never saw that broker's connection close, and the broker
// timeout is a minute: the groups move because the broker did not
// heartbeat to the new leader within its grace. The other brokers, which
// heartbeat on, keep being candidates and win.
func TestLeaderDeathWithMasterElectsWithinGrace(t *testing.T) {
	c := newTestCluster(t, 3, func(cfg *Config) {
		cfg.BrokerTimeout = time.Minute
		cfg.LeaderGrace = 500 * time.Millisecond
	})
	old := c.leader()
	admin, clients, hbs := masteredByBroker1(t, c)
	// Broker 1 and the controller leader die at once.
	hbs[0].halt()
	clients[1].Close()
	c.stop(old.ID())
	start := time.Now()
	checkFor(t, 20*time.Second, 20*time.Millisecond, func() error {
		for _, g := range allGroups(t, admin, ctlapi.ReadConsistent) {
			if g.Master == 1 || g.Master == 0 {
				return fmt.Errorf("group %d master %d epoch %d", g.ID, g.Master, g.Epoch)
			}
		}
		return nil
	})
	t.Logf("groups moved %v after the leader stopped", time.Since(start).Round(time.Millisecond))
	// Brokers 2 and 3 heartbeated to the new leader through it all: the
	// grace did not count them dead.
	l := c.leader()
	for b := uint32(2); b <= 3; b++ {
		if cd := l.hb.candidate(b, 0, time.Now()); !cd.Alive {
			t.Fatalf("broker %d, heartbeating, is not alive at the new leader: %+v", b, cd)
		}
	}
}

// TestHeartbeatsSimulation drives the failure detector through seeded
// schedules of leader changes, heartbeats (over changing connections),
// dropped connections and scans, with a shuffled clock, and checks it
// against what the leader has seen in its term:
//   - nobody is reported dead who heartbeated within the timeout before the
//     scan, over a connection that has not dropped since (no false death),
//     or who was not heard in this term yet but the term is younger than
//     the grace;
//   - whoever was not heard in the term is reported once the grace passed,
//     whoever heartbeated once the timeout passed since, whoever's
//     connection dropped at the next scan (no death missed);
//   - nobody is reported twice without a heartbeat in between.
func TestHeartbeatsSimulation(t *testing.T) {
	const brokers = 6
	schedules := 2000
	if testing.Short() {
		schedules = 200
	}
	type seen struct {
		heard    bool      // heartbeated in this term
		last     time.Time // its last heartbeat in this term
		conn     uint64
		dropped  bool // its heartbeat connection dropped since it was last reported
		dropAt   time.Time
		reported bool // reported dead since its last heartbeat (or the term start)
	}
	for seed := int64(1); seed <= int64(schedules); seed++ {
		r := rand.New(rand.NewSource(seed))
		timeout := time.Duration(200+r.Intn(800)) * time.Millisecond
		grace := time.Duration(10+r.Intn(int(timeout/time.Millisecond))) * time.Millisecond
		h := newHeartbeats(timeout, grace)
		grace = min(grace, timeout) // as newHeartbeats takes it
		now := time.Unix(1000, 0)
		var term time.Time
		leader := false
		var model [brokers + 1]seen
		ends := []ctlapi.GroupLogEnd{{Group: 0, LogEnd: ctlapi.LogEnd{Epoch: 1, Index: 1}}}
		nextConn := uint64(1)
		var trace []string
		for step := 0; step < 200; step++ {
			now = now.Add(time.Duration(r.Intn(int(grace/time.Millisecond)+1)) * time.Millisecond)
			b := uint32(1 + r.Intn(brokers))
			switch k := r.Intn(20); {
			case k == 0 || !leader:
				var all []ctlapi.Broker
				for id := uint32(1); id <= brokers; id++ {
					all = append(all, ctlapi.Broker{ID: id})
				}
				h.becomeLeader(all, now)
				trace = append(trace, fmt.Sprintf("%d leader", step))
				term, leader = now, true
				for id := range model {
					model[id] = seen{}
				}
			case k <= 9:
				if r.Intn(4) == 0 {
					nextConn++
					model[b].conn = nextConn
				} else if model[b].conn == 0 {
					nextConn++
					model[b].conn = nextConn
				}
				h.beatOn(b, ends, now, model[b].conn)
				trace = append(trace, fmt.Sprintf("%d beat %d conn %d", step, b, model[b].conn))
				if !model[b].dropped {
					model[b].reported = false
				}
				model[b].heard, model[b].last = true, now
			case k <= 11:
				if model[b].heard && model[b].conn != 0 {
					h.disconnected(model[b].conn, []uint32{b}, now)
					trace = append(trace, fmt.Sprintf("%d drop %d conn %d", step, b, model[b].conn))
					if !model[b].reported {
						// (A connection closes once; a repeated close
						// here moves the deadline to the last.)
						model[b].dropped, model[b].dropAt = true, now
					}
				}
			default:
				dead := h.expired(now)
				trace = append(trace, fmt.Sprintf("%d scan %v", step, dead))
				for id := uint32(1); id <= brokers; id++ {
					m := &model[id]
					got := slices.Contains(dead, id)
					var due bool
					switch {
					case m.reported:
						if got {
							t.Fatalf("seed %d step %d: broker %d reported dead twice without a heartbeat in between", seed, step, id)
						}
						continue
					case m.dropped:
						// Due at the first scan after the drop.
						due = m.dropAt.Before(now)
					case m.heard:
						due = m.last.Add(timeout).Before(now)
					default:
						due = term.Add(grace).Before(now)
					}
					if got != due {
						t.Log(strings.Join(trace, "\n"))
						t.Fatalf("seed %d step %d: broker %d reported dead %v, want %v (heard %v last %v dropped %v, term %v, now %v, timeout %v grace %v)",
							seed, step, id, got, due, m.heard, m.last.Sub(term), m.dropped, term.Sub(time.Unix(1000, 0)), now.Sub(term), timeout, grace)
					}
					if got {
						m.reported, m.dropped = true, false
					}
				}
			}
		}
	}
}
