// Package cluster runs a Berth cluster of real berthd processes on
// 127.0.0.1 for the cluster benchmarks, and reads its state the way an
// operator would: each broker's admin HTTP (/readyz, /v1/status,
// /v1/groups), and berthctl for "cluster init".
//
// Each broker embeds a member of the cluster's controller and runs the
// replication groups (-peer), as tools/cluster.sh starts them, but on free
// ports and in its own data directory under the caller's directory. The
// brokers run in their own process groups (perf/proc); Stop stops them
// all, and Kill/Restart crash and bring back one of them.
//
// A durable queue lives in group GroupOf(name, G), and only that group's
// master takes its publishes and delivers it; Router finds the master.
package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/berthmq/berth/perf/proc"
)

// Config says what cluster Start runs.
type Config struct {
	Berthd   string // berthd binary
	Berthctl string // berthctl binary, for "cluster init"
	Dir      string // each broker gets Dir/berthd-N
	Brokers  int    // default 3
	Groups   int    // replication groups, default 12
	Shards   int    // berthd -shards; 0 leaves berthd's default (one per core)
	// Args are more berthd flags for every broker, Env more environment
	// variables (NAME=value) for each.
	Args []string
	Env  []string
	// StartTimeout bounds each broker's start and the cluster's settling;
	// default 30 s.
	StartTimeout time.Duration
}

// Broker is one berthd of the cluster.
type Broker struct {
	N                        int // 1..Brokers, the order of Start
	ID                       uint32
	Client, Peer, Ctl, Admin string
	Dir                      string
	args                     []string
	mu                       sync.Mutex
	p                        *proc.Proc
}

// Running reports whether the broker's process is up (not killed or
// stopped).
func (b *Broker) Running() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.p != nil
}

// Cluster is the running brokers.
type Cluster struct {
	cfg     Config
	Brokers []*Broker
	Router  *Router
}

func (c *Config) defaults() {
	if c.Brokers <= 0 {
		c.Brokers = 3
	}
	if c.Groups <= 0 {
		c.Groups = 12
	}
	if c.StartTimeout <= 0 {
		c.StartTimeout = 30 * time.Second
	}
}

// Start runs the brokers, waits until each is ready, initialises the
// cluster with cfg.Groups groups and waits until every group has a master
// that serves it with every broker in its SyncStateSet. On error it stops
// what it started.
func Start(ctx context.Context, cfg Config) (*Cluster, error) {
	cfg.defaults()
	// Below the ephemeral range: a killed broker restarts on its ports.
	ports, err := proc.StablePorts(4 * cfg.Brokers)
	if err != nil {
		return nil, err
	}
	c := &Cluster{cfg: cfg}
	var peers []string
	for i := range cfg.Brokers {
		b := &Broker{N: i + 1,
			Client: fmt.Sprintf("127.0.0.1:%d", ports[4*i]), Peer: fmt.Sprintf("127.0.0.1:%d", ports[4*i+1]),
			Ctl: fmt.Sprintf("127.0.0.1:%d", ports[4*i+2]), Admin: fmt.Sprintf("127.0.0.1:%d", ports[4*i+3]),
			Dir: filepath.Join(cfg.Dir, fmt.Sprintf("berthd-%d", i+1))}
		peers = append(peers, fmt.Sprintf("%d=%s", b.N, b.Ctl))
		c.Brokers = append(c.Brokers, b)
	}
	for _, b := range c.Brokers {
		b.args = []string{"-data", filepath.Join(b.Dir, "data"), "-listen", b.Client, "-peer", b.Peer, "-admin", b.Admin,
			"-controller-id", fmt.Sprint(b.N), "-controller-peers", strings.Join(peers, ","), "-log-level", "warn"}
		if cfg.Shards > 0 {
			b.args = append(b.args, "-shards", fmt.Sprint(cfg.Shards))
		}
		b.args = append(b.args, cfg.Args...)
	}
	c.Router = &Router{Admins: c.admins()}
	ok := false
	defer func() {
		if !ok {
			c.Stop()
		}
	}()
	// The controller members wait for each other: start them all first.
	errs := make(chan error, len(c.Brokers))
	for _, b := range c.Brokers {
		go func() { errs <- c.start(ctx, b) }()
	}
	for range c.Brokers {
		if e := <-errs; e != nil {
			err = errors.Join(err, e)
		}
	}
	if err != nil {
		return nil, err
	}
	for _, b := range c.Brokers {
		if err := c.waitReady(ctx, b); err != nil {
			return nil, err
		}
	}
	if err := c.berthctl(ctx, "cluster", "init", "--groups", fmt.Sprint(cfg.Groups)); err != nil {
		return nil, err
	}
	if err := c.WaitSettled(ctx, cfg.StartTimeout); err != nil {
		return nil, err
	}
	ok = true
	return c, nil
}

// berthctl runs a berthctl command against the cluster's controller.
func (c *Cluster) berthctl(ctx context.Context, args ...string) error {
	var ctl []string
	for _, b := range c.Brokers {
		ctl = append(ctl, b.Ctl)
	}
	args = append([]string{"--controller", strings.Join(ctl, ","), "--timeout", "20s"}, args...)
	out, err := exec.CommandContext(ctx, c.cfg.Berthctl, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("cluster: berthctl %s: %v: %s", strings.Join(args[4:], " "), err, out)
	}
	return nil
}

// Elect forces a master election in group g that broker preferred wins
// if its log end ties with the best (berthctl elect --preferred).
func (c *Cluster) Elect(ctx context.Context, g, preferred uint32) error {
	return c.berthctl(ctx, "elect", "--preferred", fmt.Sprint(preferred), fmt.Sprint(g))
}

func (c *Cluster) admins() []string {
	var out []string
	for _, b := range c.Brokers {
		out = append(out, b.Admin)
	}
	return out
}

func (c *Cluster) start(ctx context.Context, b *Broker) error {
	if err := os.MkdirAll(b.Dir, 0o755); err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	p, err := proc.Start(ctx, "berthd", b.Dir, b.Admin, c.cfg.StartTimeout, c.cfg.Env, c.cfg.Berthd, b.args...)
	if err != nil {
		return fmt.Errorf("cluster: berthd-%d: %w", b.N, err)
	}
	b.mu.Lock()
	b.p = p
	b.mu.Unlock()
	return nil
}

// waitReady waits until b answers /readyz and knows its broker id.
func (c *Cluster) waitReady(ctx context.Context, b *Broker) error {
	deadline := time.Now().Add(c.cfg.StartTimeout)
	var last error
	for time.Now().Before(deadline) {
		var st struct {
			Ready      bool   `json:"ready"`
			BrokerID   uint32 `json:"broker_id"`
			Registered bool   `json:"broker_registered"`
		}
		last = GetJSON(ctx, b.Admin, "/v1/status", &st)
		if last == nil && st.Ready && st.Registered && st.BrokerID != 0 {
			b.ID = st.BrokerID
			return nil
		}
		if last == nil {
			last = fmt.Errorf("ready %v, registered %v, id %d", st.Ready, st.Registered, st.BrokerID)
		}
		if err := sleep(ctx, 50*time.Millisecond); err != nil {
			return err
		}
	}
	return fmt.Errorf("cluster: berthd-%d not ready after %v: %v; log: %s", b.N, c.cfg.StartTimeout, last, proc.Tail(filepath.Join(b.Dir, "berthd.log")))
}

// Stop stops every broker still running.
func (c *Cluster) Stop() {
	var wg sync.WaitGroup
	for _, b := range c.Brokers {
		b.mu.Lock()
		p := b.p
		b.p = nil
		b.mu.Unlock()
		if p != nil {
			wg.Add(1)
			go func() { defer wg.Done(); p.Stop() }()
		}
	}
	wg.Wait()
}

// Kill crashes b (SIGKILL to its process group) and returns when the
// signal was sent.
func (c *Cluster) Kill(b *Broker) (time.Time, error) {
	b.mu.Lock()
	p := b.p
	b.p = nil
	b.mu.Unlock()
	if p == nil {
		return time.Time{}, fmt.Errorf("cluster: berthd-%d is not running", b.N)
	}
	return p.Kill(), nil
}

// Signal sends sig to b's process group (SIGSTOP freezes it, as a hung
// or descheduled broker; SIGCONT thaws it) and returns when it was sent.
func (c *Cluster) Signal(b *Broker, sig syscall.Signal) (time.Time, error) {
	b.mu.Lock()
	p := b.p
	b.mu.Unlock()
	if p == nil {
		return time.Time{}, fmt.Errorf("cluster: berthd-%d is not running", b.N)
	}
	return p.Signal(sig)
}

// Restart starts b again on its data directory and ports, and waits until
// it is ready.
func (c *Cluster) Restart(ctx context.Context, b *Broker) error {
	if b.Running() {
		return fmt.Errorf("cluster: berthd-%d is running", b.N)
	}
	var err error
	// Another process may hold one of its ports for a moment: retry.
	for range 5 {
		if err = c.start(ctx, b); err == nil || !strings.Contains(err.Error(), "address already in use") {
			break
		}
		if serr := sleep(ctx, time.Second); serr != nil {
			return serr
		}
	}
	if err != nil {
		return err
	}
	return c.waitReady(ctx, b)
}

// ByID is the broker with controller broker id id, or nil.
func (c *Cluster) ByID(id uint32) *Broker {
	for _, b := range c.Brokers {
		if b.ID == id {
			return b
		}
	}
	return nil
}

// ControllerLeader reports whether b's controller member leads the
// controller group now.
func (c *Cluster) ControllerLeader(ctx context.Context, b *Broker) bool {
	var st struct {
		Controller struct {
			IsLeader bool `json:"is_leader"`
		} `json:"controller"`
	}
	return GetJSON(ctx, b.Admin, "/v1/status", &st) == nil && st.Controller.IsLeader
}

// WaitSettled waits until every group (or only those of only, if any)
// has a master that serves it, with every broker of the cluster in its
// SyncStateSet.
func (c *Cluster) WaitSettled(ctx context.Context, within time.Duration, only ...uint32) error {
	deadline := time.Now().Add(within)
	var last error
	for {
		last = c.settled(ctx, only)
		if last == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cluster: not settled after %v: %w", within, last)
		}
		if err := sleep(ctx, 50*time.Millisecond); err != nil {
			return err
		}
	}
}

func (c *Cluster) settled(ctx context.Context, only []uint32) error {
	view, err := c.Router.View(ctx)
	if err != nil {
		return err
	}
	for g := range c.cfg.Groups {
		if len(only) > 0 && !slices.Contains(only, uint32(g)) {
			continue
		}
		m, ok := view.Masters[uint32(g)]
		if !ok {
			return fmt.Errorf("group %d has no serving master; %s", g, c.Describe(ctx, uint32(g)))
		}
		if len(m.Set) != len(c.Brokers) {
			return fmt.Errorf("group %d: SyncStateSet %v", g, m.Set)
		}
	}
	return nil
}

// Describe is what each broker and the controller say of group g, for
// error messages.
func (c *Cluster) Describe(ctx context.Context, g uint32) string {
	var parts []string
	for _, b := range c.Brokers {
		var gs struct {
			Groups []GroupStatus `json:"groups"`
		}
		if err := GetJSON(ctx, b.Admin, "/v1/groups", &gs); err != nil {
			parts = append(parts, fmt.Sprintf("berthd-%d (id %d): %v", b.N, b.ID, err))
			continue
		}
		for _, st := range gs.Groups {
			if st.Group == g {
				parts = append(parts, fmt.Sprintf("berthd-%d (id %d): %s epoch %d master %d commit %d set %v", b.N, b.ID, st.Role, st.Epoch, st.Master, st.Commit, st.Set))
			}
		}
	}
	var ctl []string
	for _, b := range c.Brokers {
		ctl = append(ctl, b.Ctl)
	}
	out, err := exec.CommandContext(ctx, c.cfg.Berthctl, "--controller", strings.Join(ctl, ","), "groups").CombinedOutput()
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[0] == fmt.Sprint(g) {
			parts = append(parts, "controller: "+strings.Join(f, " "))
		}
	}
	if err != nil {
		parts = append(parts, fmt.Sprintf("berthctl groups: %v", err))
	}
	return strings.Join(parts, "; ")
}

// GroupOf is the replication group of queue name among n groups:
// fnv32a(name) mod n, as the broker places it.
func GroupOf(name string, n uint32) uint32 {
	h := fnv.New32a()
	h.Write([]byte(name))
	return h.Sum32() % n
}

// GroupStatus is a broker's view of one group, from /v1/groups.
type GroupStatus struct {
	Group  uint32   `json:"group"`
	Role   string   `json:"role"`
	Epoch  uint32   `json:"epoch"`
	Master uint32   `json:"master"`
	Commit uint64   `json:"commit"`
	Set    []uint32 `json:"sync_state_set"`
}

// MasterView is a group's master as it reports itself.
type MasterView struct {
	Broker uint32
	Addr   string // its client address
	Epoch  uint32
	Set    []uint32
}

// View is what the brokers that answered report.
type View struct {
	Masters map[uint32]MasterView // group -> the master with the highest epoch
	Addrs   map[uint32]string     // broker id -> client address
	Groups  int                   // highest group id seen + 1
}

// Router finds the master of a queue's group from the brokers' admin
// endpoints: a broker that serves a group as master says so in its
// /v1/groups, and its /v1/status gives its id and client address. It
// caches what it read; Forget drops the cache.
type Router struct {
	Admins []string
	// Groups is the cluster's group count; 0 takes the highest group id
	// the brokers report, plus one.
	Groups int

	mu   sync.Mutex
	view *View
}

// adminTimeout bounds one admin request.
const adminTimeout = 2 * time.Second

// View reads every broker's view now (brokers that do not answer are
// skipped) and caches it.
func (r *Router) View(ctx context.Context) (*View, error) {
	v := &View{Masters: map[uint32]MasterView{}, Addrs: map[uint32]string{}}
	var errs []error
	answered := 0
	for _, a := range r.Admins {
		var st struct {
			BrokerID uint32 `json:"broker_id"`
			Clients  string `json:"clients"`
		}
		if err := GetJSON(ctx, a, "/v1/status", &st); err != nil {
			errs = append(errs, err)
			continue
		}
		var gs struct {
			BrokerID uint32        `json:"broker_id"`
			Groups   []GroupStatus `json:"groups"`
		}
		if err := GetJSON(ctx, a, "/v1/groups", &gs); err != nil {
			errs = append(errs, err)
			continue
		}
		answered++
		v.Addrs[st.BrokerID] = st.Clients
		for _, g := range gs.Groups {
			v.Groups = max(v.Groups, int(g.Group)+1)
			if g.Role != "master" || g.Master != st.BrokerID {
				continue
			}
			if old, ok := v.Masters[g.Group]; ok && old.Epoch >= g.Epoch {
				continue
			}
			v.Masters[g.Group] = MasterView{Broker: st.BrokerID, Addr: st.Clients, Epoch: g.Epoch, Set: slices.Clone(g.Set)}
		}
	}
	if answered == 0 {
		return nil, fmt.Errorf("cluster: no broker answered: %w", errors.Join(errs...))
	}
	if r.Groups > 0 {
		v.Groups = r.Groups
	}
	r.mu.Lock()
	r.view = v
	r.mu.Unlock()
	return v, nil
}

// Forget drops the cached view, so the next Route reads the brokers again.
func (r *Router) Forget() {
	r.mu.Lock()
	r.view = nil
	r.mu.Unlock()
}

// Route is the client address of the master of queue's group (from the
// cached view, read first if there is none).
func (r *Router) Route(ctx context.Context, queue string) (string, error) {
	r.mu.Lock()
	v := r.view
	r.mu.Unlock()
	if v == nil {
		var err error
		if v, err = r.View(ctx); err != nil {
			return "", err
		}
	}
	if v.Groups == 0 {
		return "", errors.New("cluster: the brokers run no replication groups (is the cluster initialised?)")
	}
	g := GroupOf(queue, uint32(v.Groups))
	m, ok := v.Masters[g]
	if !ok {
		return "", fmt.Errorf("cluster: group %d of queue %s has no serving master", g, queue)
	}
	return m.Addr, nil
}

// GetJSON GETs http://admin/path and decodes its JSON into out.
func GetJSON(ctx context.Context, admin, path string, out any) error {
	ctx, cancel := context.WithTimeout(ctx, adminTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+admin+path, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s%s: %s: %s", admin, path, resp.Status, strings.TrimSpace(string(body)))
	}
	if err := json.Unmarshal(body, out); err != nil {
		return fmt.Errorf("GET %s%s: %w", admin, path, err)
	}
	return nil
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Shards is broker b's shard count, from its /v1/status.
func (c *Cluster) Shards(ctx context.Context, b *Broker) (int, error) {
	var st struct {
		Shards int `json:"shards"`
	}
	if err := GetJSON(ctx, b.Admin, "/v1/status", &st); err != nil {
		return 0, err
	}
	return st.Shards, nil
}

// Placement is where one queue of a spread lives.
type Placement struct {
	Queue  string
	Group  uint32
	Master uint32 // broker id
	Shard  int    // the group's shard on its master: group mod shards
}

// Spread picks a queue prefix, trying base, base1, base2, ... (at most
// tries of them), so that the queues prefix-0 .. prefix-(n-1) fall in
// distinct groups while n does not exceed the group count, and spread as
// evenly as it can find over the masters of view and over each master's
// shards (group g runs on shard g mod shards). It returns the prefix and
// where each queue lives.
func Spread(view *View, base string, n, shards, tries int) (string, []Placement, error) {
	if view.Groups == 0 || len(view.Masters) == 0 {
		return "", nil, errors.New("cluster: no groups with masters to spread queues over")
	}
	shards = max(shards, 1)
	var brokers []uint32
	for _, m := range view.Masters {
		if !slices.Contains(brokers, m.Broker) {
			brokers = append(brokers, m.Broker)
		}
	}
	ideal := func(count, buckets int) int {
		if count%buckets == 0 {
			return 0
		}
		return 1
	}
	best := ""
	var bestScore [3]int
	var bestPl []Placement
	for i := range max(tries, 1) {
		prefix := base
		if i > 0 {
			prefix = fmt.Sprintf("%s%d", base, i)
		}
		pl := make([]Placement, 0, n)
		groupsSeen := map[uint32]int{}
		perBroker := map[uint32]int{}
		perCell := map[[2]uint32]int{}
		for q := range n {
			name := fmt.Sprintf("%s-%d", prefix, q)
			g := GroupOf(name, uint32(view.Groups))
			m, ok := view.Masters[g]
			if !ok {
				return "", nil, fmt.Errorf("cluster: group %d has no serving master", g)
			}
			p := Placement{Queue: name, Group: g, Master: m.Broker, Shard: int(g) % shards}
			pl = append(pl, p)
			groupsSeen[g]++
			perBroker[p.Master]++
			perCell[[2]uint32{p.Master, uint32(p.Shard)}]++
		}
		dups := 0
		if n <= view.Groups {
			dups = n - len(groupsSeen)
		}
		spread := func(counts func(yield func(int) bool), buckets int) int {
			lo, hi, seen := int(^uint(0)>>1), 0, 0
			for c := range counts {
				lo, hi, seen = min(lo, c), max(hi, c), seen+1
			}
			if seen < buckets {
				lo = 0
			}
			return hi - lo
		}
		bs := spread(func(yield func(int) bool) {
			for _, c := range perBroker {
				if !yield(c) {
					return
				}
			}
		}, len(brokers))
		cs := spread(func(yield func(int) bool) {
			for _, c := range perCell {
				if !yield(c) {
					return
				}
			}
		}, len(brokers)*shards)
		score := [3]int{dups, bs, cs}
		if best == "" || slices.Compare(score[:], bestScore[:]) < 0 {
			best, bestScore, bestPl = prefix, score, pl
		}
		if score == [3]int{0, ideal(n, len(brokers)), ideal(n, len(brokers)*shards)} {
			break
		}
	}
	return best, bestPl, nil
}
