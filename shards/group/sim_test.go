package group

import (
	"fmt"
	"math/rand"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The simulation runs one group of three members, a controller and a
// network, all as plain values driven step by step by one seeded random
// source, so a schedule replays exactly from its seed. Faults: messages
// dropped, delayed and reordered; partitions, one-way or both ways,
// between any two of the members and the controller; a member killed
// (losing what its disk had not synced) and restarted; a member frozen
// (SIGSTOP) and thawed. Clients propose to whichever members think they
// are master. After the faults the network heals, every member runs, and
// the group must converge.
//
// Checked at every step: no two members apply different entries at one
// index; a completion names the entry the member applied there. At the
// end: every member applied the same log, every completed proposal is in
// it once, nothing is in it twice, and a proposal made after healing
// completes.

const (
	ctlID       MemberID = 100 // the controller's address on the simulated network
	hbTimeout            = 6   // ticks without a heartbeat before the controller counts a member dead
	maxDelay             = 4   // a message takes 1..maxDelay ticks
	faultTicks           = 400
	healTicks            = 300
	simReplicas          = 3
)

type simMsgKind uint8

const (
	smPeer simMsgKind = iota
	smHeartbeat
	smAlter
	smBecomeMaster
	smBecomeFollower
	smSetSet
	smAlterRefused
)

type simMsg struct {
	kind     simMsgKind
	from, to MemberID
	at       int // delivery tick
	seq      int // tie-break, for a deterministic order
	peer     Message
	epoch    uint32
	master   MemberID
	set      []MemberID
	logEpoch uint32
	logIndex uint64
	inc      int // the sender's incarnation (heartbeats)
}

type simDisk struct {
	written []Entry
	synced  int
	epoch   uint32
}

type simNode struct {
	id      MemberID
	m       *Member
	disk    simDisk
	up      bool // running (not killed)
	frozen  bool
	applied []string
	role    Role
	epoch   uint32
	serving bool // last seen Member.Serving
	inc     int  // incarnation: restarts so far
	// proposals this member took as master: index -> proposal id, for
	// its current life
	took map[uint64]string
	// reapplies counts the Readies that started the log again.
	reapplies int
}

type simCtl struct {
	epoch  uint32
	master MemberID
	set    []MemberID
	lastHB map[MemberID]int
	alive  map[MemberID]bool
	ends   map[MemberID][2]uint64 // epoch, index of the last heartbeat
	inc    map[MemberID]int       // incarnation in the last heartbeat
}

type sim struct {
	t        *testing.T
	seed     int64
	rng      *rand.Rand
	now      int
	nodes    map[MemberID]*simNode
	ids      []MemberID
	ctl      simCtl
	net      []simMsg
	seq      int
	cut      map[[2]MemberID]bool // directed: from, to
	dropP    float64
	history  map[uint64]string // index -> proposal id, set by the first apply
	complete map[string]uint64 // proposal id -> index
	nextProp int
	quiet    bool // no new proposals: the last ticks let everyone catch up
	trace    []string
}

func newSim(t *testing.T, seed int64) *sim {
	s := &sim{t: t, seed: seed, rng: rand.New(rand.NewSource(seed)), nodes: map[MemberID]*simNode{},
		cut: map[[2]MemberID]bool{}, history: map[uint64]string{}, complete: map[string]uint64{}}
	s.dropP = []float64{0, 0.02, 0.1}[s.rng.Intn(3)]
	for i := 1; i <= simReplicas; i++ {
		s.ids = append(s.ids, MemberID(i))
	}
	for _, id := range s.ids {
		n := &simNode{id: id, up: true, took: map[uint64]string{}}
		n.m = New(s.cfg(id), nil, 0)
		s.nodes[id] = n
	}
	s.ctl = simCtl{lastHB: map[MemberID]int{}, alive: map[MemberID]bool{}, ends: map[MemberID][2]uint64{}, inc: map[MemberID]int{}, set: slices.Clone(s.ids)}
	for _, id := range s.ids {
		s.ctl.alive[id] = true
	}
	return s
}

func (s *sim) cfg(id MemberID) Config {
	return Config{ID: id, Replicas: s.ids, LagTicks: 8, MaxBatch: 8, MaxUncommitted: 512}
}

func (s *sim) fail(format string, args ...any) {
	s.t.Helper()
	tail := s.trace
	if len(tail) > 40 {
		tail = tail[len(tail)-40:]
	}
	s.t.Fatalf("seed %d, tick %d: %s\n(replay: BERTH_GROUP_SEED=%d go test ./shards/group -run TestGroupSimulation)\nlast events:\n  %s",
		s.seed, s.now, fmt.Sprintf(format, args...), s.seed, strings.Join(tail, "\n  "))
}

func (s *sim) logf(format string, args ...any) {
	s.trace = append(s.trace, fmt.Sprintf("%4d ", s.now)+fmt.Sprintf(format, args...))
}

// send puts a message on the network unless the link is cut or it is
// dropped.
func (s *sim) send(m simMsg) {
	if s.cut[[2]MemberID{m.from, m.to}] || s.rng.Float64() < s.dropP {
		return
	}
	s.seq++
	m.at, m.seq = s.now+1+s.rng.Intn(maxDelay), s.seq
	s.net = append(s.net, m)
}

// deliver hands out the messages due now, in (due tick, send order).
func (s *sim) deliver() {
	slices.SortStableFunc(s.net, func(a, b simMsg) int {
		if a.at != b.at {
			return a.at - b.at
		}
		return a.seq - b.seq
	})
	var due []simMsg
	kept := s.net[:0]
	for _, m := range s.net {
		switch {
		case m.at > s.now:
			kept = append(kept, m)
		case m.to != ctlID && s.nodes[m.to].frozen:
			kept = append(kept, m) // held in the socket until it thaws
		default:
			due = append(due, m)
		}
	}
	s.net = kept
	for _, m := range due {
		if m.to == ctlID {
			s.ctlReceive(m)
			continue
		}
		n := s.nodes[m.to]
		if !n.up {
			continue
		}
		switch m.kind {
		case smPeer:
			n.m.Step(m.peer)
		case smBecomeMaster:
			n.m.BecomeMaster(m.epoch, m.set)
		case smBecomeFollower:
			n.m.BecomeFollower(m.epoch, m.master)
		case smSetSet:
			n.m.SetSyncStateSet(m.epoch, m.set)
		case smAlterRefused:
			n.m.AlterRefused(m.epoch)
		}
		s.process(n)
	}
}

// process carries out a member's Ready.
func (s *sim) process(n *simNode) {
	if r, e := n.m.Role(), n.m.Epoch(); r != n.role || e != n.epoch {
		s.logf("m%d: role %d epoch %d (was %d, %d), log %d, commit %d", n.id, r, e, n.role, n.epoch, n.m.LastIndex(), n.m.Commit())
		n.role, n.epoch = r, e
	}
	rd := n.m.Ready()
	if rd.Truncate {
		keep := int(rd.TruncateAfter)
		if keep < len(n.disk.written) {
			n.disk.written = n.disk.written[:keep]
			n.disk.synced = min(n.disk.synced, keep)
		}
	}
	for _, e := range rd.Persist {
		if int(e.Index) != len(n.disk.written)+1 {
			s.fail("member %d writes index %d after %d", n.id, e.Index, len(n.disk.written))
		}
		n.disk.written = append(n.disk.written, e)
	}
	n.disk.epoch = n.m.Epoch()
	for _, msg := range rd.Messages {
		s.send(simMsg{kind: smPeer, from: n.id, to: msg.To, peer: msg})
	}
	if rd.Reapply {
		n.applied = nil // as a broker drops a group's applied state
		n.reapplies++
	}
	for _, e := range rd.Apply {
		id := string(e.Data)
		if h, ok := s.history[e.Index]; ok && h != id {
			s.fail("member %d applies %q at %d where another applied %q", n.id, id, e.Index, h)
		}
		s.history[e.Index] = id
		if uint64(len(n.applied))+1 != e.Index {
			s.fail("member %d applies %d after %d", n.id, e.Index, len(n.applied))
		}
		n.applied = append(n.applied, id)
	}
	for _, c := range rd.Completed {
		id, ok := n.took[c.Index]
		if !ok {
			s.fail("member %d completes index %d it did not take", n.id, c.Index)
		}
		delete(n.took, c.Index)
		if c.Err != nil {
			s.logf("m%d: %s at %d: %v", n.id, id, c.Index, c.Err)
			continue
		}
		if s.history[c.Index] != id {
			s.fail("member %d completes %s at %d, but %q was applied there", n.id, id, c.Index, s.history[c.Index])
		}
		if prev, dup := s.complete[id]; dup {
			s.fail("%s completed twice (at %d and %d)", id, prev, c.Index)
		}
		s.complete[id] = c.Index
	}
	if rd.AlterSet != nil {
		s.send(simMsg{kind: smAlter, from: n.id, to: ctlID, epoch: rd.AlterSet.Epoch, set: rd.AlterSet.Set})
	}
	// A member that stops serving as master applies the committed log
	// again from the first entry (server/groups does the same): what it
	// applies must be the same history.
	if serving := n.m.Serving(); serving != n.serving {
		n.serving = serving
		if !serving {
			n.m.Reapply()
			s.process(n)
		}
	}
}

func (s *sim) ctlReceive(m simMsg) {
	c := &s.ctl
	switch m.kind {
	case smHeartbeat:
		c.lastHB[m.from] = s.now
		c.ends[m.from] = [2]uint64{uint64(m.logEpoch), m.logIndex}
		if m.inc != c.inc[m.from] {
			// A restarted broker registers anew: if it was master, its
			// mastership ended with its old process.
			c.inc[m.from] = m.inc
			if m.from == c.master {
				s.logf("ctl: master m%d restarted", m.from)
				c.alive[m.from] = true
				s.elect()
				return
			}
		}
		if !c.alive[m.from] {
			c.alive[m.from] = true
			s.logf("ctl: m%d alive", m.from)
		}
	case smAlter:
		ok := m.epoch == c.epoch && m.from == c.master && slices.Contains(m.set, c.master)
		for _, id := range m.set {
			ok = ok && slices.Contains(s.ids, id)
		}
		if !ok {
			s.send(simMsg{kind: smAlterRefused, from: ctlID, to: m.from, epoch: c.epoch})
			return
		}
		c.set = slices.Clone(m.set)
		s.logf("ctl: set %v in epoch %d", c.set, c.epoch)
		s.send(simMsg{kind: smSetSet, from: ctlID, to: m.from, epoch: c.epoch, set: c.set})
	}
}

// ctlTick: members silent too long are dead; a dead or missing master is
// replaced; every live member is told the current assignment again (a
// member polls the controller, and messages get lost).
func (s *sim) ctlTick() {
	c := &s.ctl
	for _, id := range s.ids {
		if c.alive[id] && s.now-c.lastHB[id] > hbTimeout {
			c.alive[id] = false
			s.logf("ctl: m%d silent, dead", id)
		}
	}
	if c.master == 0 || !c.alive[c.master] {
		s.elect()
	}
	for _, id := range s.ids {
		if !c.alive[id] || c.master == 0 {
			continue
		}
		if id == c.master {
			s.send(simMsg{kind: smBecomeMaster, from: ctlID, to: id, epoch: c.epoch, set: c.set})
			s.send(simMsg{kind: smSetSet, from: ctlID, to: id, epoch: c.epoch, set: c.set})
		} else {
			s.send(simMsg{kind: smBecomeFollower, from: ctlID, to: id, epoch: c.epoch, master: c.master})
		}
	}
}

// elect picks the live member of the SyncStateSet with the highest log
// end, under a new epoch; the new set is the live members of the old one.
func (s *sim) elect() {
	c := &s.ctl
	var cands []MemberID
	for _, id := range c.set {
		if c.alive[id] && id != c.master {
			cands = append(cands, id)
		}
	}
	if c.master != 0 && c.alive[c.master] {
		cands = append(cands, c.master)
	}
	if len(cands) == 0 {
		if c.master != 0 {
			s.logf("ctl: no live member in set %v: group unavailable", c.set)
		}
		c.master = 0
		return
	}
	best := cands[0]
	for _, id := range cands[1:] {
		a, b := c.ends[id], c.ends[best]
		if a[0] > b[0] || (a[0] == b[0] && a[1] > b[1]) {
			best = id
		}
	}
	c.epoch++
	c.master = best
	slices.Sort(cands)
	c.set = cands
	s.logf("ctl: m%d master of epoch %d, set %v", best, c.epoch, c.set)
}

// pending reports whether a member still waits for the outcome of pid.
func (s *sim) pending(pid string) bool {
	for _, id := range s.ids {
		for _, p := range s.nodes[id].took {
			if p == pid {
				return true
			}
		}
	}
	return false
}

// crash kills a member: what its disk did not sync is gone.
func (s *sim) crash(n *simNode) {
	n.up, n.frozen = false, false
	n.disk.written = n.disk.written[:n.disk.synced]
	n.applied, n.took = nil, nil
	n.serving = false
	s.ctl.alive[n.id] = false // the connection closes: the controller knows at once
	// What it had sent the controller dies with the connection.
	s.net = slices.DeleteFunc(s.net, func(m simMsg) bool { return m.from == n.id && m.to == ctlID })
	s.logf("m%d killed (synced %d)", n.id, n.disk.synced)
}

func (s *sim) restart(n *simNode) {
	n.up = true
	n.inc++
	n.m = New(s.cfg(n.id), n.disk.written, n.disk.epoch)
	n.took = map[uint64]string{}
	s.logf("m%d restarted with %d entries, epoch %d", n.id, len(n.disk.written), n.disk.epoch)
}

func (s *sim) propose() {
	for _, id := range s.ids {
		n := s.nodes[id]
		if !n.up || n.frozen || n.m.Role() != RoleMaster {
			continue
		}
		s.nextProp++
		pid := "p" + strconv.Itoa(s.nextProp)
		idx, err := n.m.Propose([]byte(pid))
		if err != nil {
			continue
		}
		if n.took == nil {
			n.took = map[uint64]string{}
		}
		n.took[idx] = pid
		s.process(n)
	}
}

// tick runs one step of time for everyone.
func (s *sim) tick(faults bool) {
	s.now++
	if faults {
		s.fault()
	}
	s.deliver()
	for _, id := range s.ids {
		n := s.nodes[id]
		if !n.up || n.frozen {
			continue
		}
		// The disk syncs now and then: everything written so far.
		if s.rng.Intn(3) == 0 && n.disk.synced < len(n.disk.written) {
			n.disk.synced = len(n.disk.written)
			n.m.Persisted(uint64(n.disk.synced))
		}
		n.m.Tick()
		s.process(n)
		e, i := n.m.LogEnd()
		s.send(simMsg{kind: smHeartbeat, from: id, to: ctlID, logEpoch: e, logIndex: i, inc: n.inc})
	}
	s.ctlTick()
	if !s.quiet && s.rng.Intn(2) == 0 {
		s.propose()
	}
}

func (s *sim) fault() {
	r := s.rng.Intn(1000)
	id := s.ids[s.rng.Intn(len(s.ids))]
	n := s.nodes[id]
	switch {
	case r < 6 && n.up:
		s.crash(n)
	case r < 30 && !n.up:
		s.restart(n)
	case r < 36 && n.up && !n.frozen:
		n.frozen = true
		s.logf("m%d frozen", id)
	case r < 60 && n.frozen:
		n.frozen = false
		s.logf("m%d thawed", id)
	case r < 70:
		all := append(slices.Clone(s.ids), ctlID)
		a, b := all[s.rng.Intn(len(all))], all[s.rng.Intn(len(all))]
		if a != b {
			s.cut[[2]MemberID{a, b}] = true
			if s.rng.Intn(2) == 0 {
				s.cut[[2]MemberID{b, a}] = true
			}
			s.logf("cut %d->%d", a, b)
		}
	case r < 85:
		clear(s.cut)
		s.logf("healed")
	}
}

func (s *sim) run() {
	for range faultTicks {
		s.tick(true)
	}
	// Heal: everyone runs, the network is whole and loses nothing.
	clear(s.cut)
	s.dropP = 0
	for _, id := range s.ids {
		n := s.nodes[id]
		n.frozen = false
		if !n.up {
			s.restart(n)
		}
	}
	s.logf("healing")
	// A client proposes until one proposal completes; a proposal whose
	// outcome is unknown (its master stepped down) is retried under a new
	// id, as the client library does.
	var final string
	for range healTicks {
		s.tick(false)
		if _, done := s.complete[final]; done {
			continue
		}
		if final != "" && !s.pending(final) {
			final = "" // failed with an unknown outcome: retry
		}
		if final != "" {
			continue
		}
		for _, id := range s.ids {
			n := s.nodes[id]
			if n.m.Role() != RoleMaster {
				continue
			}
			s.nextProp++
			pid := "final" + strconv.Itoa(s.nextProp)
			idx, err := n.m.Propose([]byte(pid))
			if err != nil {
				continue
			}
			n.took[idx] = pid
			final = pid
			s.process(n)
			break
		}
	}
	// Let the last commits reach everyone.
	s.quiet = true
	for range 50 {
		s.tick(false)
	}
	if _, ok := s.complete[final]; !ok {
		s.fail("no proposal made after healing completed (master %d, epoch %d, set %v)", s.ctl.master, s.ctl.epoch, s.ctl.set)
	}
	s.check()
}

func (s *sim) check() {
	var ref []string
	for _, id := range s.ids {
		n := s.nodes[id]
		if ref == nil || len(n.applied) > len(ref) {
			ref = n.applied
		}
	}
	for _, id := range s.ids {
		n := s.nodes[id]
		if !slices.Equal(n.applied, ref) {
			s.fail("member %d applied %d entries, another %d: they did not converge", id, len(n.applied), len(ref))
		}
	}
	if uint64(len(ref)) < uint64(len(s.history)) {
		s.fail("applied %d entries at the end, but %d indexes were applied before: committed entries lost", len(ref), len(s.history))
	}
	seen := map[string]bool{}
	for i, id := range ref {
		if seen[id] {
			s.fail("%s applied twice", id)
		}
		seen[id] = true
		if s.history[uint64(i+1)] != id {
			s.fail("index %d is %q now, %q was applied there before", i+1, id, s.history[uint64(i+1)])
		}
	}
	for id, idx := range s.complete {
		if !seen[id] || ref[idx-1] != id {
			s.fail("completed %s (index %d) is not in the final log", id, idx)
		}
	}
}

// TestGroupSimulation runs thousands of seeded schedules (fewer with
// -short). BERTH_GROUP_SEED=N replays one.
func TestGroupSimulation(t *testing.T) {
	seeds := 2000
	if testing.Short() {
		seeds = 200
	}
	if raceSeeds > 0 {
		seeds = raceSeeds
	}
	first := int64(1)
	if v := os.Getenv("BERTH_GROUP_SEED"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("BERTH_GROUP_SEED=%q: %v", v, err)
		}
		first, seeds = n, 1
	}
	var completed, elections, applied, reapplies int
	for seed := first; seed < first+int64(seeds); seed++ {
		s := newSim(t, seed)
		s.run()
		completed += len(s.complete)
		elections += int(s.ctl.epoch)
		applied += len(s.history)
		for _, id := range s.ids {
			reapplies += s.nodes[id].reapplies
		}
	}
	t.Logf("%d schedules: %d proposals completed, %d entries committed, %d elections, %d step-downs that reapplied the log", seeds, completed, applied, elections, reapplies)
	if completed == 0 || elections <= seeds || reapplies == 0 {
		t.Fatalf("the schedules exercised too little: %d completions, %d elections", completed, elections)
	}
}
