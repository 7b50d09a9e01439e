package controlplane

import (
	"container/heap"
	"context"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/berthmq/berth/controlplane/ctlapi"
)

// heartbeatShards splits the heartbeat table so that brokers heartbeating at
// once rarely meet on a lock.
const heartbeatShards = 16

// scanIntervalMax bounds the time between inactive-master scans.
const scanIntervalMax = 100 * time.Millisecond

// heartbeats is the leader's failure detector. It lives outside the state
// machine: its data reaches the log only inside ElectMaster events. Each
// shard keeps its brokers in a deadline heap, so finding the dead is
// O(dead · log n) per scan and never walks all brokers or groups.
type heartbeats struct {
	timeout time.Duration
	// grace is how long a new leader waits for a broker's first
	// heartbeat (Config.LeaderGrace).
	grace  time.Duration
	shards [heartbeatShards]hbShard
}

type hbShard struct {
	mu      sync.Mutex
	brokers map[uint32]*hbEntry
	heap    hbHeap // live brokers by deadline
}

type hbEntry struct {
	id       uint32
	deadline time.Time
	dead     bool
	// heard is set by a real heartbeat. A broker seeded by becomeLeader
	// is only timed; it is no election candidate until it reports its log
	// ends to this leader, so nobody wins on log ends it never reported.
	heard   bool
	conn    uint64               // service connection of the last heartbeat; 0 if in-process
	logEnds []ctlapi.GroupLogEnd // sorted by group
	data    uint64               // primaryData(logEnds), for primary elections
	index   int                  // position in heap; -1 when not in it
	// lost: the connection of its heartbeats closed and no scan has
	// counted it dead since. A heartbeat over a new connection (the
	// broker restarted at once) does not cancel that: the scan reports it
	// dead once, so the groups it mastered get a new epoch.
	lost bool
}

type hbHeap []*hbEntry

func (h hbHeap) Len() int           { return len(h) }
func (h hbHeap) Less(i, j int) bool { return h[i].deadline.Before(h[j].deadline) }
func (h hbHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i]; h[i].index = i; h[j].index = j }
func (h *hbHeap) Push(x any)        { e := x.(*hbEntry); e.index = len(*h); *h = append(*h, e) }
func (h *hbHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	e.index = -1
	return e
}

// newHeartbeats returns a failure detector; grace 0 means timeout.
func newHeartbeats(timeout, grace time.Duration) *heartbeats {
	if grace <= 0 || grace > timeout {
		grace = timeout
	}
	h := &heartbeats{timeout: timeout, grace: grace}
	for i := range h.shards {
		h.shards[i].brokers = map[uint32]*hbEntry{}
	}
	return h
}

func (h *heartbeats) shard(id uint32) *hbShard { return &h.shards[id%heartbeatShards] }

// becomeLeader forgets what an earlier term knew and gives every registered
// broker the grace to heartbeat to this leader. What the earlier leader
// knew of each broker (its last heartbeat, its connection closing) died
// with it, so a broker that died with it is noticed only by its silence
// here: after the grace, not after a whole timeout. A live broker that
// misses the grace only loses its masterships, under new epochs; the
// dead and the frozen alike are fenced by them.
func (h *heartbeats) becomeLeader(brokers []ctlapi.Broker, now time.Time) {
	for i := range h.shards {
		s := &h.shards[i]
		s.mu.Lock()
		s.brokers = map[uint32]*hbEntry{}
		s.heap = nil
		s.mu.Unlock()
	}
	for _, b := range brokers {
		h.seed(b.ID, now)
	}
}

// seed starts timing a broker this leader has not heard from yet: it has
// the grace to heartbeat.
func (h *heartbeats) seed(id uint32, now time.Time) {
	s := h.shard(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.brokers[id] != nil {
		return
	}
	e := &hbEntry{id: id, index: -1, deadline: now.Add(h.grace)}
	s.brokers[id] = e
	heap.Push(&s.heap, e)
}

// beat records a heartbeat. logEnds may be nil to keep the last reported.
func (h *heartbeats) beat(id uint32, logEnds []ctlapi.GroupLogEnd, now time.Time) {
	h.beatOn(id, logEnds, now, 0)
}

// disconnected makes brokers whose last heartbeat came over conn expire at
// the next scan: a broker's connection dropping is the fastest sign of its
// death. A broker that already heartbeats over another connection stays.
func (h *heartbeats) disconnected(conn uint64, ids []uint32, now time.Time) {
	for _, id := range ids {
		s := h.shard(id)
		s.mu.Lock()
		if e := s.brokers[id]; e != nil && e.conn == conn && e.index >= 0 {
			e.deadline = now
			e.lost = true
			heap.Fix(&s.heap, e.index)
		}
		s.mu.Unlock()
	}
}

func (h *heartbeats) beatOn(id uint32, logEnds []ctlapi.GroupLogEnd, now time.Time, conn uint64) {
	if logEnds != nil && !sort.SliceIsSorted(logEnds, func(i, j int) bool { return logEnds[i].Group < logEnds[j].Group }) {
		logEnds = slices.Clone(logEnds)
		sort.Slice(logEnds, func(i, j int) bool { return logEnds[i].Group < logEnds[j].Group })
	}
	data := primaryData(logEnds) // outside the lock: O(groups)
	s := h.shard(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.brokers[id]
	if e == nil {
		e = &hbEntry{id: id, index: -1}
		s.brokers[id] = e
	}
	if !e.lost {
		e.deadline = now.Add(h.timeout)
	}
	e.dead = false
	e.heard = true
	e.conn = conn
	if logEnds != nil {
		e.logEnds = logEnds
		e.data = data
	}
	if e.index >= 0 {
		heap.Fix(&s.heap, e.index)
	} else {
		heap.Push(&s.heap, e)
	}
}

// expired pops and returns the brokers whose deadline has passed.
func (h *heartbeats) expired(now time.Time) []uint32 {
	var out []uint32
	for i := range h.shards {
		s := &h.shards[i]
		s.mu.Lock()
		for len(s.heap) > 0 && s.heap[0].deadline.Before(now) {
			e := heap.Pop(&s.heap).(*hbEntry)
			e.dead, e.lost = true, false
			out = append(out, e.id)
		}
		s.mu.Unlock()
	}
	slices.Sort(out)
	return out
}

// candidate is broker id's entry in an election's heartbeat snapshot.
func (h *heartbeats) candidate(id, group uint32, now time.Time) ctlapi.Candidate {
	s := h.shard(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	c := ctlapi.Candidate{Broker: id}
	e := s.brokers[id]
	if e == nil {
		return c
	}
	c.Alive = e.heard && !e.dead && now.Before(e.deadline)
	if i, ok := slices.BinarySearchFunc(e.logEnds, group, func(g ctlapi.GroupLogEnd, t uint32) int {
		return int(int64(g.Group) - int64(t))
	}); ok {
		c.LogEnd = e.logEnds[i].LogEnd
	}
	return c
}

// electionsFor builds ElectMaster events for every group mastered by one of
// dead, at most electChunk groups per event.
func (n *Node) electionsFor(dead []uint32, now time.Time) []*ctlapi.ElectMaster {
	const electChunk = 2048
	var events []*ctlapi.ElectMaster
	cur := &ctlapi.ElectMaster{Unclean: n.cfg.UncleanElection}
	n.mu.RLock()
	var all []ctlapi.Broker
	if n.cfg.UncleanElection || n.state.Config().UncleanElection {
		all = n.state.Brokers()
	}
	for _, b := range dead {
		for _, gid := range n.state.GroupsMasteredBy(b) {
			g, _ := n.state.Group(gid)
			eg := ctlapi.ElectGroup{Group: gid, Epoch: g.Epoch}
			for _, id := range g.SyncStateSet {
				eg.Candidates = append(eg.Candidates, n.hb.candidate(id, gid, now))
			}
			for _, br := range all {
				if !slices.Contains(g.SyncStateSet, br.ID) && len(eg.Candidates) < ctlapi.CandidatesMax && inReplicas(&g, br.ID) {
					eg.Candidates = append(eg.Candidates, n.hb.candidate(br.ID, gid, now))
				}
			}
			if !slices.ContainsFunc(eg.Candidates, func(c ctlapi.Candidate) bool { return c.Broker == b }) {
				eg.Candidates = append(eg.Candidates, ctlapi.Candidate{Broker: b})
			}
			cur.Groups = append(cur.Groups, eg)
			if len(cur.Groups) == electChunk {
				events = append(events, cur)
				cur = &ctlapi.ElectMaster{Unclean: cur.Unclean}
			}
		}
	}
	n.mu.RUnlock()
	if len(cur.Groups) > 0 {
		events = append(events, cur)
	}
	return events
}

// scanLoop is the leader's inactive-master scan.
func (n *Node) scanLoop() {
	defer n.wg.Done()
	// The scan is incremental, so running it often is cheap; it bounds how
	// late a dead broker (or a dropped connection) is noticed.
	interval := min(max(n.cfg.BrokerTimeout/8, 5*time.Millisecond), scanIntervalMax)
	t := time.NewTicker(interval)
	defer t.Stop()
	var retry []uint32
	for {
		select {
		case <-n.stop:
			return
		case <-t.C:
		}
		if !n.isLdr.Load() {
			retry = nil
			continue
		}
		now := time.Now()
		// The primary's election runs alongside the groups' and is
		// decided afresh at every scan, so it keeps no retry list.
		primaryDone := n.scanPrimary(now)
		dead := append(n.hb.expired(now), retry...)
		retry = nil
		if len(dead) == 0 {
			if primaryDone != nil {
				<-primaryDone
			}
			continue
		}
		slices.Sort(dead)
		dead = slices.Compact(dead)
		events := n.electionsFor(dead, now)
		if len(events) > 0 {
			n.cfg.Logger.Info("controlplane: brokers silent or disconnected; electing new masters for their groups", "brokers", dead, "elections", len(events))
		}
		errs := make(chan error, len(events))
		for _, ev := range events {
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				t0 := time.Now()
				res, err := n.Propose(ctx, ev)
				n.cfg.Logger.Debug("controlplane: elections for silent brokers decided", "groups", len(ev.Groups), "elected", res.Value, "took", time.Since(t0), "err", err)
				errs <- err
			}()
		}
		failed := false
		for range events {
			if err := <-errs; err != nil {
				failed = true
			}
		}
		if failed {
			retry = dead // stale epochs make a repeated election harmless
		}
		if primaryDone != nil {
			<-primaryDone
		}
	}
}

// Heartbeat records a broker heartbeat. Only the leader takes heartbeats.
func (n *Node) Heartbeat(broker uint32, logEnds []ctlapi.GroupLogEnd) error {
	_, err := n.heartbeatOn(context.Background(), broker, logEnds, 0)
	return err
}

// heartbeatOn records a broker heartbeat and answers with the groups the
// broker masters (ctlapi.HeartbeatReply), read through a consistent read:
// a leader that was deposed, or was frozen and has not heard yet that it
// was, cannot confirm a master its successor replaced, and a new leader
// answers only once it applied what earlier leaders committed (their
// elections among it). A broker masters a group's deliveries only while
// such confirmations keep coming (group.Member.Granted).
func (n *Node) heartbeatOn(ctx context.Context, broker uint32, logEnds []ctlapi.GroupLogEnd, conn uint64) ([]ctlapi.MasterGrant, error) {
	if !n.isLdr.Load() {
		return nil, &ctlapi.NotLeaderError{Leader: n.leaderAddr()}
	}
	n.hb.beatOn(broker, logEnds, time.Now(), conn)
	var grants []ctlapi.MasterGrant
	err := n.Read(ctx, ctlapi.ReadConsistent, func(s *State) {
		for _, gid := range s.GroupsMasteredBy(broker) {
			if g, ok := s.Group(gid); ok {
				grants = append(grants, ctlapi.MasterGrant{Group: gid, Epoch: g.Epoch})
			}
		}
	})
	return grants, err
}

// ElectNow proposes elections for the given groups from the current
// heartbeat data; preferred, if not 0, wins ties. Brokers call it for
// groups without a master, admins to move a master.
func (n *Node) ElectNow(ctx context.Context, groups []uint32, preferred uint32) (ctlapi.Result, error) {
	if !n.isLdr.Load() {
		return ctlapi.Result{}, &ctlapi.NotLeaderError{Leader: n.leaderAddr()}
	}
	if res, ok := n.checkElect(groups, preferred); !ok {
		return res, nil // elect.go
	}
	const electChunk = 2048
	now := time.Now()
	var events []*ctlapi.ElectMaster
	n.mu.RLock()
	brokers := n.state.Brokers()
	for _, gid := range groups {
		g, ok := n.state.Group(gid)
		if !ok {
			continue
		}
		eg := ctlapi.ElectGroup{Group: gid, Epoch: g.Epoch, Preferred: preferred}
		for _, b := range brokers {
			if len(eg.Candidates) < ctlapi.CandidatesMax && inReplicas(&g, b.ID) {
				eg.Candidates = append(eg.Candidates, n.hb.candidate(b.ID, gid, now))
			}
		}
		if len(events) == 0 || len(events[len(events)-1].Groups) == electChunk {
			events = append(events, &ctlapi.ElectMaster{Unclean: n.cfg.UncleanElection})
		}
		last := events[len(events)-1]
		last.Groups = append(last.Groups, eg)
	}
	n.mu.RUnlock()
	var total ctlapi.Result
	for _, ev := range events {
		res, err := n.Propose(ctx, ev)
		if err != nil {
			return total, err
		}
		total.Value += res.Value
	}
	return total, nil
}

// Handover elects h.To master of h.Group in place of h.From, its live
// master, which asks for it (groups rebalance). It refuses, with a
// Result code and nothing proposed, unless From still masters the group
// in h.Epoch and To is a live member of its SyncStateSet. From's and To's
// log ends in the election are h.LogEnd, which From vouches for: it
// stopped taking proposals and saw To hold, durably, its whole log. Any
// member of the set holds every committed entry, so electing To loses
// nothing committed even if From were wrong about the rest. The other
// candidates' log ends come from the heartbeats, as in ElectNow. The
// reply's Value is 1 when the master moved.
func (n *Node) Handover(ctx context.Context, h ctlapi.Handover) (ctlapi.Result, error) {
	if !n.isLdr.Load() {
		return ctlapi.Result{}, &ctlapi.NotLeaderError{Leader: n.leaderAddr()}
	}
	now := time.Now()
	n.mu.RLock()
	g, ok := n.state.Group(h.Group)
	brokers := n.state.Brokers()
	n.mu.RUnlock()
	switch {
	case !ok:
		return fail(ctlapi.CodeNotFound, "group %d does not exist", h.Group), nil
	case g.Master != h.From || g.Epoch != h.Epoch:
		return fail(ctlapi.CodeStaleEpoch, "group %d is at master %d epoch %d, not %d/%d", h.Group, g.Master, g.Epoch, h.From, h.Epoch), nil
	case h.To == h.From || !slices.Contains(g.SyncStateSet, h.To) || !inReplicas(&g, h.To):
		return fail(ctlapi.CodeInvalid, "broker %d is not another member of group %d's SyncStateSet %v", h.To, h.Group, g.SyncStateSet), nil
	case !n.hb.candidate(h.To, h.Group, now).Alive:
		return fail(ctlapi.CodeInvalid, "broker %d is not alive", h.To), nil
	}
	eg := ctlapi.ElectGroup{Group: h.Group, Epoch: g.Epoch, Preferred: h.To}
	for _, b := range brokers {
		if len(eg.Candidates) >= ctlapi.CandidatesMax || !inReplicas(&g, b.ID) {
			continue
		}
		c := n.hb.candidate(b.ID, h.Group, now)
		if b.ID == h.From || b.ID == h.To {
			c.LogEnd = h.LogEnd
			c.Alive = true // From is asking; To was checked above
		}
		eg.Candidates = append(eg.Candidates, c)
	}
	return n.Propose(ctx, &ctlapi.ElectMaster{Unclean: n.cfg.UncleanElection, Groups: []ctlapi.ElectGroup{eg}})
}

// LogEnds reports, for each of groups, the brokers of its replica set as
// this leader's heartbeats last reported them: alive or not, and the
// group's log end (berthctl groups shows the lag from them). A group
// that does not exist gets no candidates.
func (n *Node) LogEnds(groups []uint32) ([][]ctlapi.Candidate, error) {
	if !n.isLdr.Load() {
		return nil, &ctlapi.NotLeaderError{Leader: n.leaderAddr()}
	}
	now := time.Now()
	n.mu.RLock()
	brokers := n.state.Brokers()
	gs := make([]ctlapi.Group, len(groups))
	found := make([]bool, len(groups))
	for i, id := range groups {
		gs[i], found[i] = n.state.Group(id)
	}
	n.mu.RUnlock()
	out := make([][]ctlapi.Candidate, len(groups))
	for i := range groups {
		if !found[i] {
			continue
		}
		for _, b := range brokers {
			if len(out[i]) < ctlapi.CandidatesMax && inReplicas(&gs[i], b.ID) {
				out[i] = append(out[i], n.hb.candidate(b.ID, groups[i], now))
			}
		}
	}
	return out, nil
}
