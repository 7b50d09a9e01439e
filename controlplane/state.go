package controlplane

import (
	"fmt"
	"maps"
	"slices"
	"sort"

	"github.com/berthmq/berth/controlplane/ctlapi"
)

// State is the controller state machine. It is pure: Apply depends only on
// the event and the current state, never on a clock, a heartbeat table or
// local configuration, so every controller that applies the same log ends in
// the same state. State is not safe for concurrent use; Node guards it.
type State struct {
	brokers      map[uint32]*ctlapi.Broker
	nextBrokerID uint32
	version      uint16 // lowest version among registered brokers; 0 if none
	groups       []ctlapi.Group
	// masterOf indexes groups by master so that a dead broker's groups are
	// found without scanning all groups. Derived; not in snapshots.
	masterOf  map[uint32]map[uint32]struct{}
	exchanges map[string]ctlapi.DeclareExchange
	queues    map[string]ctlapi.QueueOptions
	// bindings are indexed both ways so that deleting a queue or exchange
	// does not scan every binding.
	byExchange map[string]map[ctlapi.Binding]struct{}
	byQueue    map[string]map[ctlapi.Binding]struct{}
	config     ctlapi.ClusterConfig
	attrs      map[string]string
	// primary is the active-passive primary broker (0: none), primaryEpoch
	// the epoch every change of primary bumps (primary.go).
	primary, primaryEpoch uint32
	// controllers holds the address of each controller added by a
	// membership change, so a restarted member knows its peers.
	controllers map[uint64]string
	// users of the client port, by name (users.go).
	users map[string]ctlapi.User
}

func fail(code uint8, format string, args ...any) ctlapi.Result {
	return ctlapi.Result{Code: code, Msg: fmt.Sprintf(format, args...)}
}

// NewState returns an empty state machine.
func NewState() *State {
	return &State{
		brokers:      map[uint32]*ctlapi.Broker{},
		nextBrokerID: 1,
		masterOf:     map[uint32]map[uint32]struct{}{},
		exchanges:    map[string]ctlapi.DeclareExchange{},
		queues:       map[string]ctlapi.QueueOptions{},
		byExchange:   map[string]map[ctlapi.Binding]struct{}{},
		byQueue:      map[string]map[ctlapi.Binding]struct{}{},
		attrs:        map[string]string{},
		controllers:  map[uint64]string{},
		users:        map[string]ctlapi.User{},
	}
}

// Apply applies one event and returns its result.
func (s *State) Apply(ev ctlapi.Event) ctlapi.Result {
	switch ev := ev.(type) {
	case *ctlapi.ApplyBrokerID:
		return s.applyBrokerID(ev)
	case *ctlapi.RegisterBroker:
		return s.registerBroker(ev)
	case *ctlapi.ElectMaster:
		return s.electMaster(ev)
	case *ctlapi.AlterSyncStateSet:
		return s.alterSyncStateSet(ev)
	case *ctlapi.CleanBrokerData:
		return s.cleanBroker(ev.ID)
	case *ctlapi.DeclareExchange:
		return s.declareExchange(ev)
	case *ctlapi.DeclareQueue:
		return s.declareQueue(ev)
	case *ctlapi.Bind:
		return s.bind(ev)
	case *ctlapi.Unbind:
		return s.unbind(ctlapi.Binding(*ev))
	case *ctlapi.DeleteQueue:
		return s.deleteQueue(ev.Name)
	case *ctlapi.DeleteExchange:
		return s.deleteExchange(ev.Name)
	case *ctlapi.SetClusterConfig:
		return s.setClusterConfig(ev)
	case *ctlapi.ElectPrimary:
		return s.electPrimary(ev)
	case *ctlapi.AddUser, *ctlapi.SetUserCredentials, *ctlapi.SetPermissions, *ctlapi.RemoveUser:
		return s.applyUser(ev)
	case *ctlapi.SetAttribute:
		if ev.Value == "" {
			delete(s.attrs, ev.Key)
		} else {
			s.attrs[ev.Key] = ev.Value
		}
		return ctlapi.Result{}
	}
	return fail(ctlapi.CodeInvalid, "unknown event %T", ev)
}

func (s *State) applyBrokerID(ev *ctlapi.ApplyBrokerID) ctlapi.Result {
	id := ev.Requested
	if id == 0 {
		id = s.nextBrokerID
	} else if _, ok := s.brokers[id]; ok {
		return fail(ctlapi.CodeConflict, "broker id %d is taken", id)
	}
	if id == 0 || id == ^uint32(0) {
		return fail(ctlapi.CodeInvalid, "broker id space exhausted")
	}
	s.brokers[id] = &ctlapi.Broker{ID: id}
	if id >= s.nextBrokerID {
		s.nextBrokerID = id + 1
	}
	return ctlapi.Result{Value: uint64(id)}
}

func (s *State) registerBroker(ev *ctlapi.RegisterBroker) ctlapi.Result {
	b, ok := s.brokers[ev.ID]
	if !ok {
		return fail(ctlapi.CodeNotFound, "broker %d has no id; apply for one first", ev.ID)
	}
	b.Addrs = slices.Clone(ev.Addrs)
	b.Version = ev.Version
	s.recomputeVersion()
	return ctlapi.Result{Value: uint64(ev.ID)}
}

// recomputeVersion is O(brokers); brokers register rarely and are few.
func (s *State) recomputeVersion() {
	s.version = 0
	for _, b := range s.brokers {
		if b.Version != 0 && (s.version == 0 || b.Version < s.version) {
			s.version = b.Version
		}
	}
}

func (s *State) setMaster(g *ctlapi.Group, master uint32) {
	if g.Master != 0 {
		if m := s.masterOf[g.Master]; m != nil {
			delete(m, g.ID)
			if len(m) == 0 {
				delete(s.masterOf, g.Master)
			}
		}
	}
	g.Master = master
	if master != 0 {
		m := s.masterOf[master]
		if m == nil {
			m = map[uint32]struct{}{}
			s.masterOf[master] = m
		}
		m[g.ID] = struct{}{}
	}
}

func (s *State) electMaster(ev *ctlapi.ElectMaster) ctlapi.Result {
	unclean := ev.Unclean || s.config.UncleanElection
	var elected uint64
	for i := range ev.Groups {
		eg := &ev.Groups[i]
		if eg.Group >= uint32(len(s.groups)) {
			continue
		}
		g := &s.groups[eg.Group]
		if g.Epoch != eg.Epoch {
			continue // decided from a stale view; a newer election won
		}
		winner, logEnd, ok := decideMaster(g, eg, unclean, s.brokers)
		if !ok {
			continue
		}
		firstElection := g.Epoch == 0
		g.Epoch++
		g.ElectedLogEnd = logEnd
		s.setMaster(g, winner)
		if winner == 0 {
			// Fenced with no member of the set alive: the set still names
			// who holds every committed event, and one of them is elected
			// when it comes back (an empty set would leave the group
			// without a master for good, short of an unclean election).
		} else if firstElection {
			// An empty group: every live candidate holds all of it.
			g.SyncStateSet = eligible(g, eg, true, s.brokers)
		} else {
			// Followers rejoin the set through AlterSyncStateSet once the
			// new master sees them caught up.
			g.SyncStateSet = []uint32{winner}
		}
		elected++
	}
	return ctlapi.Result{Value: elected}
}

func candidateAlive(eg *ctlapi.ElectGroup, id uint32) bool {
	for _, c := range eg.Candidates {
		if c.Broker == id {
			return c.Alive
		}
	}
	return false
}

// eligible lists, sorted, the candidates allowed to become master.
func eligible(g *ctlapi.Group, eg *ctlapi.ElectGroup, unclean bool, brokers map[uint32]*ctlapi.Broker) []uint32 {
	var out []uint32
	for _, c := range eg.Candidates {
		if !c.Alive || brokers[c.Broker] == nil || slices.Contains(out, c.Broker) || !inReplicas(g, c.Broker) {
			continue
		}
		if g.Epoch == 0 || unclean || slices.Contains(g.SyncStateSet, c.Broker) {
			out = append(out, c.Broker)
		}
	}
	slices.Sort(out)
	return out
}

// decideMaster is the election rule. It reports ok=false when nothing should
// change. A live master keeps its group unless a preferred broker is named.
// Otherwise the eligible candidate with the highest log end wins; ties go to
// the preferred broker, else rotate by group id so masters spread out. With
// no eligible candidate the group is left without a master under a new epoch,
// which fences the dead one.
func decideMaster(g *ctlapi.Group, eg *ctlapi.ElectGroup, unclean bool, brokers map[uint32]*ctlapi.Broker) (uint32, ctlapi.LogEnd, bool) {
	if g.Master != 0 && candidateAlive(eg, g.Master) && brokers[g.Master] != nil &&
		(eg.Preferred == 0 || eg.Preferred == g.Master) {
		return 0, ctlapi.LogEnd{}, false
	}
	elig := eligible(g, eg, false, brokers)
	if len(elig) == 0 && unclean {
		elig = eligible(g, eg, true, brokers)
	}
	if len(elig) == 0 {
		if g.Master == 0 && g.Epoch > 0 {
			return 0, ctlapi.LogEnd{}, false // already fenced; nothing to do
		}
		if g.Master == 0 {
			return 0, ctlapi.LogEnd{}, false // never elected and nobody alive
		}
		return 0, ctlapi.LogEnd{}, true
	}
	var best ctlapi.LogEnd
	var top []uint32
	for _, id := range elig {
		var le ctlapi.LogEnd
		for _, c := range eg.Candidates {
			if c.Broker == id {
				le = c.LogEnd
				break
			}
		}
		switch {
		case len(top) == 0 || best.Less(le):
			best, top = le, append(top[:0], id)
		case le == best:
			top = append(top, id)
		}
	}
	if eg.Preferred != 0 && slices.Contains(top, eg.Preferred) {
		return eg.Preferred, best, true
	}
	// A placed group's ties go by its replica order, whose first broker
	// the placement chose so that first masters spread evenly.
	for _, id := range g.Replicas {
		if slices.Contains(top, id) {
			return id, best, true
		}
	}
	return top[int(g.ID)%len(top)], best, true
}

func (s *State) alterSyncStateSet(ev *ctlapi.AlterSyncStateSet) ctlapi.Result {
	if ev.Group >= uint32(len(s.groups)) {
		return fail(ctlapi.CodeNotFound, "group %d does not exist", ev.Group)
	}
	g := &s.groups[ev.Group]
	if g.Master != ev.Master || g.Epoch != ev.Epoch {
		return fail(ctlapi.CodeStaleEpoch, "group %d is at master %d epoch %d, not %d/%d", ev.Group, g.Master, g.Epoch, ev.Master, ev.Epoch)
	}
	if ev.From != nil {
		from := slices.Compact(slices.Sorted(slices.Values(ev.From)))
		if !slices.Equal(from, g.SyncStateSet) {
			return fail(ctlapi.CodeStaleEpoch, "group %d's SyncStateSet is %v, not %v as the request assumed", ev.Group, g.SyncStateSet, from)
		}
	}
	set := slices.Clone(ev.Set)
	slices.Sort(set)
	set = slices.Compact(set)
	if !slices.Contains(set, g.Master) {
		return fail(ctlapi.CodeInvalid, "SyncStateSet of group %d must hold its master", ev.Group)
	}
	for _, id := range set {
		if s.brokers[id] == nil {
			return fail(ctlapi.CodeNotFound, "broker %d is not registered", id)
		}
		if !inReplicas(g, id) {
			return fail(ctlapi.CodeInvalid, "broker %d is not a replica of group %d", id, ev.Group)
		}
	}
	g.SyncStateSet = set
	return ctlapi.Result{}
}

func (s *State) cleanBroker(id uint32) ctlapi.Result {
	if s.brokers[id] == nil {
		return fail(ctlapi.CodeNotFound, "broker %d is not registered", id)
	}
	delete(s.brokers, id)
	if p, _ := s.Primary(); p == id {
		s.clearPrimary()
	}
	// Admin operation: a full pass over the groups is acceptable here.
	for i := range s.groups {
		g := &s.groups[i]
		if g.Master == id {
			s.setMaster(g, 0)
			g.Epoch++
		}
		if j := slices.Index(g.SyncStateSet, id); j >= 0 {
			g.SyncStateSet = slices.Delete(slices.Clone(g.SyncStateSet), j, j+1)
		}
	}
	s.recomputeVersion()
	return ctlapi.Result{}
}

func (s *State) declareExchange(ev *ctlapi.DeclareExchange) ctlapi.Result {
	if old, ok := s.exchanges[ev.Name]; ok {
		if old != *ev {
			return fail(ctlapi.CodeConflict, "exchange %q exists with different settings", ev.Name)
		}
		return ctlapi.Result{}
	}
	s.exchanges[ev.Name] = *ev
	return ctlapi.Result{}
}

func (s *State) declareQueue(ev *ctlapi.DeclareQueue) ctlapi.Result {
	if old, ok := s.queues[ev.Name]; ok {
		if old != ev.Options {
			return fail(ctlapi.CodeConflict, "queue %q exists with different options", ev.Name)
		}
		return ctlapi.Result{}
	}
	s.queues[ev.Name] = ev.Options
	return ctlapi.Result{}
}

func addIndex(m map[string]map[ctlapi.Binding]struct{}, k string, b ctlapi.Binding) {
	set := m[k]
	if set == nil {
		set = map[ctlapi.Binding]struct{}{}
		m[k] = set
	}
	set[b] = struct{}{}
}

func delIndex(m map[string]map[ctlapi.Binding]struct{}, k string, b ctlapi.Binding) {
	if set := m[k]; set != nil {
		delete(set, b)
		if len(set) == 0 {
			delete(m, k)
		}
	}
}

func (s *State) bind(ev *ctlapi.Bind) ctlapi.Result {
	if _, ok := s.exchanges[ev.Exchange]; !ok {
		return fail(ctlapi.CodeNotFound, "exchange %q does not exist", ev.Exchange)
	}
	if _, ok := s.queues[ev.Queue]; !ok {
		return fail(ctlapi.CodeNotFound, "queue %q does not exist", ev.Queue)
	}
	b := ctlapi.Binding(*ev)
	addIndex(s.byExchange, b.Exchange, b)
	addIndex(s.byQueue, b.Queue, b)
	return ctlapi.Result{}
}

func (s *State) unbind(b ctlapi.Binding) ctlapi.Result {
	if _, ok := s.byQueue[b.Queue][b]; !ok {
		return fail(ctlapi.CodeNotFound, "binding %s->%s (%q) does not exist", b.Exchange, b.Queue, b.Key)
	}
	delIndex(s.byExchange, b.Exchange, b)
	delIndex(s.byQueue, b.Queue, b)
	return ctlapi.Result{}
}

func (s *State) deleteQueue(name string) ctlapi.Result {
	if _, ok := s.queues[name]; !ok {
		return fail(ctlapi.CodeNotFound, "queue %q does not exist", name)
	}
	for b := range s.byQueue[name] {
		delIndex(s.byExchange, b.Exchange, b)
	}
	delete(s.byQueue, name)
	delete(s.queues, name)
	return ctlapi.Result{}
}

func (s *State) deleteExchange(name string) ctlapi.Result {
	if _, ok := s.exchanges[name]; !ok {
		return fail(ctlapi.CodeNotFound, "exchange %q does not exist", name)
	}
	for b := range s.byExchange[name] {
		delIndex(s.byQueue, b.Queue, b)
	}
	delete(s.byExchange, name)
	delete(s.exchanges, name)
	return ctlapi.Result{}
}

func (s *State) setClusterConfig(ev *ctlapi.SetClusterConfig) ctlapi.Result {
	if ev.Groups == 0 || ev.Groups > ctlapi.GroupCountMax {
		return fail(ctlapi.CodeInvalid, "group count %d out of range", ev.Groups)
	}
	if s.config.Groups != 0 && s.config.Groups != ev.Groups {
		return fail(ctlapi.CodeConflict, "group count is fixed at %d", s.config.Groups)
	}
	replicas := s.config.Replicas
	if s.config.Groups == 0 {
		replicas = ev.Replicas
		if n := uint32(len(s.brokers)); replicas > n && n > 0 {
			return fail(ctlapi.CodeInvalid, "%d replicas per group asked, %d brokers registered", replicas, n)
		}
		s.groups = make([]ctlapi.Group, ev.Groups)
		for i := range s.groups {
			s.groups[i].ID = uint32(i)
		}
	}
	s.config = ctlapi.ClusterConfig{Groups: ev.Groups, Mode: ev.Mode, UncleanElection: ev.UncleanElection, Replicas: replicas}
	s.placeUnplaced()
	if s.config.Mode != ctlapi.ModeActivePassive {
		s.clearPrimary()
	}
	return ctlapi.Result{}
}

// placeUnplaced gives a replica set to every group without one, out of
// the brokers registered now (placement.go). Groups already placed never
// move: a broker that registers later holds no group until an operator
// moves groups to it. With no broker registered the groups stay unplaced
// until a later SetClusterConfig.
func (s *State) placeUnplaced() {
	var todo []uint32
	for i := range s.groups {
		if len(s.groups[i].Replicas) == 0 {
			todo = append(todo, uint32(i))
		}
	}
	if len(todo) == 0 || len(s.brokers) == 0 {
		return
	}
	brokers := slices.Sorted(maps.Keys(s.brokers))
	r := int(s.config.Replicas)
	if r == 0 {
		r = ctlapi.ReplicasDefault
	}
	// Placing the unplaced groups as if they were all the groups keeps
	// each pass even; at init they are.
	sets := Place(brokers, uint32(len(todo)), min(r, len(brokers)))
	for k, g := range todo {
		s.groups[g].Replicas = sets[k]
	}
}

// inReplicas reports whether broker id may hold group g: it is in g's
// replica set, or g is not placed.
func inReplicas(g *ctlapi.Group, id uint32) bool {
	return len(g.Replicas) == 0 || slices.Contains(g.Replicas, id)
}

// Read accessors. They return copies, so callers may keep them after the
// lock guarding the state is released.

// NextBrokerID returns the id ApplyBrokerID{0} would assign.
func (s *State) NextBrokerID() uint32 { return s.nextBrokerID }

// ClusterVersion is the lowest protocol version among registered brokers.
func (s *State) ClusterVersion() uint16 { return s.version }

// Config returns the cluster configuration.
func (s *State) Config() ctlapi.ClusterConfig { return s.config }

// Broker returns a registered broker.
func (s *State) Broker(id uint32) (ctlapi.Broker, bool) {
	b, ok := s.brokers[id]
	if !ok {
		return ctlapi.Broker{}, false
	}
	return ctlapi.Broker{ID: b.ID, Addrs: slices.Clone(b.Addrs), Version: b.Version}, true
}

// Brokers returns all registered brokers by id.
func (s *State) Brokers() []ctlapi.Broker {
	out := make([]ctlapi.Broker, 0, len(s.brokers))
	for _, id := range slices.Sorted(maps.Keys(s.brokers)) {
		b, _ := s.Broker(id)
		out = append(out, b)
	}
	return out
}

// Group returns one group.
func (s *State) Group(id uint32) (ctlapi.Group, bool) {
	if id >= uint32(len(s.groups)) {
		return ctlapi.Group{}, false
	}
	g := s.groups[id]
	g.SyncStateSet = slices.Clone(g.SyncStateSet)
	g.Replicas = slices.Clone(g.Replicas)
	return g, true
}

// GroupCount returns G.
func (s *State) GroupCount() int { return len(s.groups) }

// GroupsMasteredBy returns, sorted, the groups whose master is id.
func (s *State) GroupsMasteredBy(id uint32) []uint32 {
	return slices.Sorted(maps.Keys(s.masterOf[id]))
}

// Attribute returns a cluster attribute.
func (s *State) Attribute(key string) (string, bool) {
	v, ok := s.attrs[key]
	return v, ok
}

// Wiring returns the wiring sorted by name.
func (s *State) Wiring() ctlapi.Wiring {
	var w ctlapi.Wiring
	for _, n := range slices.Sorted(maps.Keys(s.exchanges)) {
		w.Exchanges = append(w.Exchanges, s.exchanges[n])
	}
	for _, n := range slices.Sorted(maps.Keys(s.queues)) {
		w.Queues = append(w.Queues, ctlapi.DeclareQueue{Name: n, Options: s.queues[n]})
	}
	for _, set := range s.byQueue {
		for b := range set {
			w.Bindings = append(w.Bindings, b)
		}
	}
	sort.Slice(w.Bindings, func(i, j int) bool {
		a, b := w.Bindings[i], w.Bindings[j]
		if a.Exchange != b.Exchange {
			return a.Exchange < b.Exchange
		}
		if a.Queue != b.Queue {
			return a.Queue < b.Queue
		}
		return a.Key < b.Key
	})
	return w
}

// applyMembership records the address book of the membership a change
// leads to. It is applied, like any event, in log order on every member.
func (s *State) applyMembership(book map[uint64]string) {
	s.controllers = maps.Clone(book)
}

// Controllers returns the controller addresses recorded by membership
// changes; empty if membership never changed.
func (s *State) Controllers() map[uint64]string { return maps.Clone(s.controllers) }
