// Command failover-bench measures, on a 3-broker Berth cluster of real
// processes on 127.0.0.1, what a publishing client sees when a broker
// crashes:
//
//   - master kill: a client publishes steadily (--rate msgs/s, at most
//     --window uncompleted) to one replicated queue at its group's master.
//     The master's process group gets SIGKILL; the client finds the new
//     master from the surviving brokers' admin endpoints (/v1/groups), as
//     an application without automatic failover would, and publishes
//     there. Measured: from the kill to the first publish completed by
//     another broker. Then the killed broker is restarted on its data and
//     the run waits until it is back in the group's SyncStateSet (and
//     every group has all brokers in sync again) before the next kill.
//   - follower kill: the same steady publishing; a follower of the
//     queue's group gets SIGKILL. Measured: the longest gap between two
//     consecutive publish completions from 1 s before the kill to
//     --observe after it (the commit stall), and, for scale, the longest
//     gap in the second before the kill alone.
//
// Every kill is of a whole broker, so it takes its controller member too;
// each line says whether that member led the controller, which adds a
// controller election to the failover.
//
// --freeze makes each master kill a freeze instead: SIGSTOP to the
// master's process group, a silent failure that only the controller's
// heartbeat timeout finds, and SIGCONT after the measurement (the thawed
// broker, fenced by the new epoch, must rejoin as a follower).
//
// --leader-master moves the queue's group master onto the controller
// leader before each master kill (a forced election, not measured), so
// that every kill takes both: the case where the new controller leader
// must find out about the dead master on its own.
//
// The last lines are
//
//	failover master-kill, controller leader spared n=<n> p50=<d> p99=<d> max=<d>
//	failover master-kill, master led the controller n=<n> p50=<d> p99=<d> max=<d>
//	failover master-kill n=<n> p50=<d> p99=<d> max=<d>
//	stall follower-kill n=<n> p50=<d> max=<d>
//
// Every broker runs in its own process group and is stopped when the run
// ends, fails or is interrupted; every wait is bounded.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/perf/bench"
	"github.com/berthmq/berth/perf/cluster"
)

const (
	killsMax = 1000
	// failoverTimeout bounds the wait for the first publish on a new
	// master; rejoinTimeout the wait for a restarted broker to be in sync.
	failoverTimeout = 60 * time.Second
	rejoinTimeout   = 90 * time.Second
	// steadyBefore is how long publishing must have gone on before a kill.
	steadyBefore = time.Second
	dialTimeout  = time.Second
	// otherGroupsWait is how long a restart waits for the groups no
	// queue of the run is in to be settled before it reports them.
	otherGroupsWait = 5 * time.Second
	retryPause      = 5 * time.Millisecond
)

type config struct {
	berthd, berthctl string
	kills            int
	followerKills    int
	groups           int
	shards           int
	queue            string
	rate             float64
	size             int
	window           int
	observe          time.Duration
	timeout          time.Duration
	berthdFlags      []string
	logs             string
	spareLeader      bool
	leaderMaster     bool
	restartDelay     time.Duration
	// freeze: master "kills" are SIGSTOP, thawed by SIGCONT after the
	// measurement instead of a restart.
	freeze bool
	// clientHeartbeat is the heartbeat interval the publisher asks of
	// the brokers (0: the broker's default). A frozen broker is found by
	// the client after three missed heartbeats.
	clientHeartbeat time.Duration
}

func parse(args []string, stderr io.Writer) (*config, error) {
	fs := flag.NewFlagSet("failover-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := &config{}
	fs.StringVar(&c.berthd, "berthd", "bin/berthd", "berthd binary")
	fs.StringVar(&c.berthctl, "berthctl", "bin/berthctl", "berthctl binary (cluster init)")
	fs.IntVar(&c.kills, "kills", 20, "kill -9 of the queue's group master, this many times")
	fs.IntVar(&c.followerKills, "follower-kills", 5, "kill -9 of a follower of the queue's group, this many times")
	fs.IntVar(&c.groups, "groups", 12, "replication groups (berthctl cluster init --groups)")
	fs.IntVar(&c.shards, "shards", 0, "berthd -shards; 0 leaves berthd's default")
	fs.StringVar(&c.queue, "queue", "failover-bench", "the replicated queue published to")
	rate := fs.String("rate", "2000", "steady publish rate in msgs/s (k suffix allowed)")
	size := fs.String("size", "128", "message size in bytes")
	fs.IntVar(&c.window, "window", 64, "most uncompleted publishes")
	fs.DurationVar(&c.restartDelay, "restart-delay", 0, "how long a killed broker stays down after the measurement (the first publish on the new master, or --observe) before its restart")
	fs.DurationVar(&c.observe, "observe", 3*time.Second, "follower kill: how long after the kill to look for the longest gap")
	fs.DurationVar(&c.timeout, "timeout", 30*time.Minute, "bound on the whole run")
	flags := fs.String("berthd-flags", "", "more berthd flags for every broker, space-separated (e.g. \"-controller-heartbeat-ms 200\")")
	fs.StringVar(&c.logs, "logs", "", "copy the brokers' logs into this directory when the run ends")
	fs.BoolVar(&c.spareLeader, "spare-controller-leader", false, "master kills: publish to one of three queues (each mastered by another broker) chosen so that the broker killed does not lead the controller; measures the data plane's failover without a controller election")
	fs.BoolVar(&c.leaderMaster, "leader-master", false, "master kills: first move the queue's group master onto the broker that leads the controller (a forced election, not measured), so every kill takes the group master and the controller leader at once")
	fs.BoolVar(&c.freeze, "freeze", false, "master kills freeze the master (SIGSTOP to its process group: a silent failure, found by the controller's heartbeat timeout) and thaw it (SIGCONT) after the measurement, instead of kill -9 and a restart")
	fs.DurationVar(&c.clientHeartbeat, "client-heartbeat", 0, "heartbeat interval the publishing client asks of the brokers (0: the broker's default); a client finds a frozen broker after three missed heartbeats")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var err error
	if c.rate, err = bench.ParseRate(*rate); err != nil {
		return nil, err
	}
	if c.size, err = bench.ParseSize(*size); err != nil {
		return nil, err
	}
	c.berthdFlags = strings.Fields(*flags)
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	check(c.kills >= 0 && c.kills <= killsMax, "--kills %d not in 0..%d", c.kills, killsMax)
	check(c.followerKills >= 0 && c.followerKills <= killsMax, "--follower-kills %d not in 0..%d", c.followerKills, killsMax)
	check(c.kills+c.followerKills > 0, "nothing to do: --kills and --follower-kills are 0")
	check(c.groups >= 1 && c.groups <= 1<<16, "--groups %d not in 1..65536", c.groups)
	check(c.shards >= 0 && c.shards <= 256, "--shards %d not in 0..256", c.shards)
	check(c.queue != "" && !strings.ContainsAny(c.queue, " \t\n"), "--queue %q must be a name without spaces", c.queue)
	check(c.rate >= 1 && c.rate <= 1e6, "--rate %v not in 1..1M msgs/s", c.rate)
	check(c.size >= 1 && c.size <= 1<<20, "--size %d not in 1..1MiB", c.size)
	check(c.window >= 1 && c.window <= 1<<16, "--window %d not in 1..65536", c.window)
	check(c.observe >= 100*time.Millisecond && c.observe <= time.Minute, "--observe %v not in 100ms..1m", c.observe)
	check(c.timeout > 0, "--timeout must be positive")
	check(!(c.spareLeader && c.leaderMaster), "--spare-controller-leader and --leader-master exclude each other")
	check(c.clientHeartbeat >= 0 && c.clientHeartbeat <= time.Minute, "--client-heartbeat %v not in 0..1m", c.clientHeartbeat)
	check(c.restartDelay >= 0 && c.restartDelay <= time.Minute, "--restart-delay %v not in 0..1m", c.restartDelay)
	return c, errors.Join(errs...)
}

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	c, err := parse(args, stderr)
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(stderr, "failover-bench:", err)
		}
		return 2
	}
	for _, bin := range []*string{&c.berthd, &c.berthctl} {
		if strings.Contains(*bin, "/") {
			if abs, err := filepath.Abs(*bin); err == nil {
				*bin = abs
			}
		}
	}
	work, err := os.MkdirTemp("", "failover-bench-")
	if err != nil {
		fmt.Fprintln(stderr, "failover-bench:", err)
		return 1
	}
	defer os.RemoveAll(work)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()

	fmt.Fprintf(stdout, "failover-bench: 3 brokers, %d groups, queue %s (group %d), %d B at %.0f msgs/s, window %d, berthd flags %q\n",
		c.groups, c.queue, cluster.GroupOf(c.queue, uint32(c.groups)), c.size, c.rate, c.window, c.berthdFlags)
	cl, err := cluster.Start(ctx, cluster.Config{Berthd: c.berthd, Berthctl: c.berthctl, Dir: work, Groups: c.groups,
		Shards: c.shards, Args: c.berthdFlags, StartTimeout: 30 * time.Second})
	if err != nil {
		fmt.Fprintln(stderr, "failover-bench:", err)
		return 1
	}
	defer func() {
		cl.Stop()
		if c.logs != "" {
			copyLogs(work, c.logs)
		}
	}()
	res, err := measure(ctx, c, cl, stdout)
	if err != nil {
		fmt.Fprintln(stderr, "failover-bench:", err)
	}
	fmt.Fprintln(stdout)
	for _, l := range summary(res) {
		fmt.Fprintln(stdout, l)
	}
	if err != nil {
		return 1
	}
	return 0
}

// results are the run's samples.
type results struct {
	failovers []time.Duration // every counted master kill
	notLeader []time.Duration // those whose broker did not lead the controller
	leader    []time.Duration // those whose broker led the controller
	stalls    []time.Duration // follower kills
	// elected: from each counted master kill to a surviving broker
	// reporting itself master of the group under a newer epoch.
	elected []time.Duration
}

// summary is the closing lines: failovers of the kills whose broker did
// not lead the controller, of those whose broker did, of all kills, and
// the follower kill stalls.
func summary(r results) []string {
	failovers, notLeader, leader, stalls := r.failovers, r.notLeader, r.leader, r.stalls
	return []string{
		fmt.Sprintf("failover master-kill, controller leader spared n=%d p50=%s p99=%s max=%s", len(notLeader),
			ms(quantile(notLeader, 0.50)), ms(quantile(notLeader, 0.99)), ms(quantile(notLeader, 1))),
		fmt.Sprintf("failover master-kill, master led the controller n=%d p50=%s p99=%s max=%s", len(leader),
			ms(quantile(leader, 0.50)), ms(quantile(leader, 0.99)), ms(quantile(leader, 1))),
		fmt.Sprintf("failover master-kill n=%d p50=%s p99=%s max=%s", len(failovers),
			ms(quantile(failovers, 0.50)), ms(quantile(failovers, 0.99)), ms(quantile(failovers, 1))),
		fmt.Sprintf("new master named n=%d p50=%s p99=%s max=%s", len(r.elected),
			ms(quantile(r.elected, 0.50)), ms(quantile(r.elected, 0.99)), ms(quantile(r.elected, 1))),
		fmt.Sprintf("stall follower-kill n=%d p50=%s max=%s", len(stalls), ms(quantile(stalls, 0.50)), ms(quantile(stalls, 1))),
	}
}

// quantile is the nearest-rank q-quantile of ds, or -1 when there are none.
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return -1
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func ms(d time.Duration) string {
	if d < 0 {
		return "n/a"
	}
	return fmt.Sprintf("%dms", d.Round(time.Millisecond).Milliseconds())
}

// completion is one completed publish: when, and which broker took it.
type completion struct {
	at   time.Time
	addr string
}

// publisher publishes steadily to one queue at its group's master and
// records every completion.
type publisher struct {
	c      *config
	cl     *cluster.Cluster
	errOut io.Writer

	mu    sync.Mutex
	done  []completion
	fails int
	queue string // published to; setQueue changes it
	// reroute asks the loop to look the master up again (it moved).
	reroute atomic.Bool
}

func (p *publisher) setQueue(q string) {
	p.mu.Lock()
	p.queue = q
	p.mu.Unlock()
}

func (p *publisher) queueName() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.queue
}

func (p *publisher) record(at time.Time, addr string, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		p.fails++
		return
	}
	p.done = append(p.done, completion{at, addr})
}

// since returns the completions at or after t, and drops those older than
// keep (the publisher runs for the whole benchmark).
func (p *publisher) since(t, keep time.Time) []completion {
	p.mu.Lock()
	defer p.mu.Unlock()
	i, _ := slices.BinarySearchFunc(p.done, keep, func(c completion, t time.Time) int { return c.at.Compare(t) })
	p.done = p.done[i:]
	j, _ := slices.BinarySearchFunc(p.done, t, func(c completion, t time.Time) int { return c.at.Compare(t) })
	return slices.Clone(p.done[j:])
}

// loop publishes until ctx ends. A publish error or a lost session sends
// it back to the admin endpoints for the master; it then dials that
// broker and goes on.
func (p *publisher) loop(ctx context.Context) {
	payload := make([]byte, p.c.size)
	gap := time.Duration(float64(time.Second) / p.c.rate)
	var conn *client.Conn
	var addr string
	var sem chan struct{}
	var broken chanFlag
	defer func() {
		if conn != nil {
			conn.Close()
		}
	}()
	next := time.Now()
	queue := ""
	for ctx.Err() == nil {
		switched := p.reroute.Swap(false)
		if q := p.queueName(); q != queue {
			queue, switched = q, true
		}
		if conn == nil || broken.isSet() || switched {
			a, err := p.route(ctx, queue)
			if err != nil {
				pause(ctx, retryPause)
				continue
			}
			if conn != nil && a == addr && !connDead(conn) {
				// The same broker still says it is the master: keep the
				// session (and after a failure, try again shortly).
				if !switched {
					pause(ctx, retryPause)
				}
			} else {
				if conn != nil {
					conn.Close()
					conn = nil
				}
				dctx, cancel := context.WithTimeout(ctx, dialTimeout)
				nc, err := client.DialConfig(dctx, client.Config{Name: "failover-bench", Window: max(p.c.window, client.WindowDefault), Heartbeat: p.c.clientHeartbeat}, a)
				cancel()
				if err != nil {
					pause(ctx, retryPause)
					continue
				}
				conn, addr = nc, a
			}
			sem = make(chan struct{}, p.c.window)
			broken = newFlag()
			next = time.Now()
		}
		next = next.Add(gap)
		if d := time.Until(next); d > 0 {
			pause(ctx, d)
		}
		select {
		case sem <- struct{}{}:
		case <-broken.ch:
			continue
		case <-ctx.Done():
			return
		}
		at, mySem, myBroken := addr, sem, broken
		err := conn.PublishAsync(ctx, "", queue, payload, client.PublishOptions{Persistent: true}, func(err error) {
			p.record(time.Now(), at, err)
			if err != nil {
				myBroken.set()
			}
			<-mySem
		})
		if err != nil {
			<-sem
			broken.set()
		}
	}
}

// routeTimeout bounds the publisher's question to each broker for the
// queue's master: a frozen broker must not hold the reroute up for the
// admin client's whole timeout.
const (
	routeTimeout = 300 * time.Millisecond
	routeSettle  = 20 * time.Millisecond
)

// route asks every broker at once which one masters queue's group, and
// takes the answer with the highest epoch among those that came within
// routeTimeout (or within routeSettle of the first claim).
func (p *publisher) route(ctx context.Context, queue string) (string, error) {
	g := cluster.GroupOf(queue, uint32(p.c.groups))
	rctx, cancel := context.WithTimeout(ctx, routeTimeout)
	defer cancel()
	type answer struct {
		addr  string
		epoch uint32
	}
	answers := make(chan answer, len(p.cl.Brokers))
	for _, b := range p.cl.Brokers {
		go func() {
			var gs struct {
				Groups []cluster.GroupStatus `json:"groups"`
			}
			a := answer{}
			if cluster.GetJSON(rctx, b.Admin, "/v1/groups", &gs) == nil {
				for _, s := range gs.Groups {
					if s.Group == g && s.Role == "master" && s.Master == b.ID {
						a = answer{b.Client, s.Epoch}
					}
				}
			}
			answers <- a
		}()
	}
	// Once some broker claims the group, the others get routeSettle more
	// to answer with a newer epoch: a frozen broker never answers, and
	// waiting out routeTimeout for it at each try would add to every
	// failover measured.
	best := answer{}
	var settle <-chan time.Time
wait:
	for range p.cl.Brokers {
		select {
		case a := <-answers:
			if a.addr != "" && (best.addr == "" || a.epoch > best.epoch) {
				best = a
				if settle == nil {
					settle = time.After(routeSettle)
				}
			}
		case <-settle:
			break wait
		}
	}
	if best.addr == "" {
		return "", fmt.Errorf("no broker reports itself master of group %d", g)
	}
	return best.addr, nil
}

func connDead(c *client.Conn) bool {
	select {
	case <-c.Done():
		return true
	default:
		return c.Err() != nil
	}
}

// chanFlag is a one-way flag with a channel to wait on.
type chanFlag struct {
	once *sync.Once
	ch   chan struct{}
}

func newFlag() chanFlag { return chanFlag{once: new(sync.Once), ch: make(chan struct{})} }

func (f chanFlag) set() {
	if f.once != nil {
		f.once.Do(func() { close(f.ch) })
	}
}

func (f chanFlag) isSet() bool {
	if f.ch == nil {
		return false
	}
	select {
	case <-f.ch:
		return true
	default:
		return false
	}
}

func pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// measure declares the queue, starts the publisher and does the kills.
func measure(ctx context.Context, c *config, cl *cluster.Cluster, out io.Writer) (r results, err error) {
	queues := []string{c.queue}
	if c.spareLeader {
		view, err := cl.Router.View(ctx)
		if err != nil {
			return r, err
		}
		prefix, _, err := cluster.Spread(view, c.queue, len(cl.Brokers), 1, 20000)
		if err != nil {
			return r, err
		}
		queues = queues[:0]
		for i := range cl.Brokers {
			queues = append(queues, fmt.Sprintf("%s-%d", prefix, i))
		}
	}
	if c.spareLeader {
		fmt.Fprintf(out, "queues %v: each kill's queue is one whose master does not lead the controller\n", queues)
	}
	for _, q := range queues {
		addr, err := cl.Router.Route(ctx, q)
		if err == nil {
			dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			var conn *client.Conn
			if conn, err = client.Dial(dctx, addr); err == nil {
				err = conn.DeclareQueue(dctx, q, client.QueueOptions{Durable: true})
				conn.Close()
			}
			cancel()
		}
		if err != nil {
			return r, fmt.Errorf("declare %s: %w", q, err)
		}
	}
	var qgroups []uint32
	for _, q := range queues {
		qgroups = append(qgroups, cluster.GroupOf(q, uint32(c.groups)))
	}
	pctx, stopPub := context.WithCancel(ctx)
	p := &publisher{c: c, cl: cl, queue: queues[0]}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); p.loop(pctx) }()
	defer func() { stopPub(); wg.Wait() }()
	g := cluster.GroupOf(queues[0], uint32(c.groups))

	for i := range c.kills {
		if err := steady(ctx, cl, p, qgroups); err != nil {
			return r, fmt.Errorf("master kill %d: %w", i+1, err)
		}
		view, err := cl.Router.View(ctx)
		if err != nil {
			return r, err
		}
		if c.spareLeader {
			// Publish to a queue whose master does not lead the controller.
			q, err := spared(ctx, cl, view, queues, p.queueName(), i)
			if err != nil {
				return r, fmt.Errorf("master kill %d: %w", i+1, err)
			}
			if q != p.queueName() {
				p.setQueue(q)
				if err := steady(ctx, cl, p, qgroups); err != nil {
					return r, fmt.Errorf("master kill %d: %w", i+1, err)
				}
			}
			g = cluster.GroupOf(q, uint32(c.groups))
			// spared may have moved a group: read the masters again.
			if view, err = cl.Router.View(ctx); err != nil {
				return r, err
			}
		}
		if c.leaderMaster {
			if view, err = onLeader(ctx, cl, g); err != nil {
				return r, fmt.Errorf("master kill %d: %w", i+1, err)
			}
			// Publish at the master moved to, not through the broker
			// that forwards to it.
			p.reroute.Store(true)
			if err := steady(ctx, cl, p, qgroups); err != nil {
				return r, fmt.Errorf("master kill %d: %w", i+1, err)
			}
		}
		m := cl.ByID(view.Masters[g].Broker)
		if m == nil {
			return r, fmt.Errorf("master kill %d: no broker for group %d's master", i+1, g)
		}
		leader := cl.ControllerLeader(ctx, m)
		epoch := view.Masters[g].Epoch
		var t0 time.Time
		if c.freeze {
			t0, err = cl.Signal(m, syscall.SIGSTOP)
		} else {
			t0, err = cl.Kill(m)
		}
		if err != nil {
			return r, err
		}
		named := make(chan time.Duration, 1)
		go func() { named <- newMasterAfter(ctx, cl, m, g, epoch, t0) }()
		how, again := "killed", "restart"
		if c.freeze {
			how, again = "frozen", "thaw"
		}
		first, by, err := firstElsewhere(ctx, p, t0, m.Client)
		if err != nil && c.freeze {
			cl.Signal(m, syscall.SIGCONT)
		}
		if err != nil {
			return r, fmt.Errorf("master kill %d: %w", i+1, err)
		}
		d := first.Sub(t0)
		elected := <-named
		// The sample counts only if the client was publishing to the
		// killed master: its last completion before the kill was there.
		before := lastBefore(p.since(t0.Add(-steadyBefore), t0.Add(-steadyBefore)), t0)
		counted := before == m.Client
		if counted {
			r.failovers = append(r.failovers, d)
		}
		pause(ctx, c.restartDelay)
		rejoin, err := restart(ctx, cl, m, g, queues, qgroups, out, c.freeze)
		if err != nil {
			return r, fmt.Errorf("master kill %d: %w", i+1, err)
		}
		if !counted {
			fmt.Fprintf(out, "master kill %2d: broker %d killed, but the client's last publish before the kill completed at %s, not there: not counted\n", i+1, m.ID, before)
			continue
		}
		if leader {
			r.leader = append(r.leader, d)
		} else {
			r.notLeader = append(r.notLeader, d)
		}
		byID := uint32(0)
		for _, b := range cl.Brokers {
			if b.Client == by {
				byID = b.ID
			}
		}
		r.elected = append(r.elected, elected)
		fmt.Fprintf(out, "master kill %2d: broker %d (controller leader %v), group %d epoch %d, %s at %s: a new master named after %s, first publish completed by broker %d after %s; back in sync %s after %s\n",
			i+1, m.ID, leader, g, epoch, how, t0.UTC().Format("15:04:05.000"), ms(elected), byID, ms(d), ms(rejoin), again)
	}
	for i := range c.followerKills {
		if err := steady(ctx, cl, p, qgroups); err != nil {
			return r, fmt.Errorf("follower kill %d: %w", i+1, err)
		}
		view, err := cl.Router.View(ctx)
		if err != nil {
			return r, err
		}
		master := view.Masters[g].Broker
		// Take the followers in turn.
		var followers []*cluster.Broker
		for _, b := range cl.Brokers {
			if b.ID != master {
				followers = append(followers, b)
			}
		}
		f := followers[i%len(followers)]
		leader := cl.ControllerLeader(ctx, f)
		t0, err := cl.Kill(f)
		if err != nil {
			return r, err
		}
		pause(ctx, c.observe)
		cs := p.since(t0.Add(-steadyBefore), t0.Add(-steadyBefore))
		before, around, after := gaps(cs, t0, t0.Add(c.observe))
		r.stalls = append(r.stalls, around)
		pause(ctx, c.restartDelay)
		rejoin, err := restart(ctx, cl, f, g, queues, qgroups, out, false)
		if err != nil {
			return r, fmt.Errorf("follower kill %d: %w", i+1, err)
		}
		fmt.Fprintf(out, "follower kill %d: broker %d (controller leader %v), group %d master %d: longest gap between completions %s (in the second before: %s), %d completed in the %s after; back in sync %s after restart\n",
			i+1, f.ID, leader, g, master, ms(around), ms(before), after, c.observe, ms(rejoin))
	}
	return r, nil
}

// newMasterAfter polls the brokers other than m until one reports itself
// master of group g under an epoch above epoch, and returns how long after
// t0 it first saw that (-1 if not within failoverTimeout).
func newMasterAfter(ctx context.Context, cl *cluster.Cluster, m *cluster.Broker, g, epoch uint32, t0 time.Time) time.Duration {
	for time.Since(t0) < failoverTimeout && ctx.Err() == nil {
		for _, b := range cl.Brokers {
			if b == m {
				continue
			}
			var gs struct {
				Groups []cluster.GroupStatus `json:"groups"`
			}
			if cluster.GetJSON(ctx, b.Admin, "/v1/groups", &gs) != nil {
				continue
			}
			for _, s := range gs.Groups {
				if s.Group == g && s.Role == "master" && s.Epoch > epoch {
					return time.Since(t0)
				}
			}
		}
		pause(ctx, 5*time.Millisecond)
	}
	return -1
}

// lastBefore is the broker address of the last completion of cs at or
// before t ("" if none).
func lastBefore(cs []completion, t time.Time) string {
	addr := ""
	for _, c := range cs {
		if c.at.After(t) {
			break
		}
		addr = c.addr
	}
	return addr
}

// gaps is the longest gap between consecutive completions of cs (sorted)
// before kill, and over the whole span up to end (a span with no
// completion after the kill counts up to end); and how many completed
// after the kill.
func gaps(cs []completion, kill, end time.Time) (before, around time.Duration, after int) {
	var prev time.Time
	for _, c := range cs {
		if c.at.After(end) {
			break
		}
		if !prev.IsZero() {
			g := c.at.Sub(prev)
			around = max(around, g)
			if !c.at.After(kill) {
				before = max(before, g)
			}
		}
		if c.at.After(kill) {
			after++
		}
		prev = c.at
	}
	if !prev.IsZero() && end.Sub(prev) > around {
		around = end.Sub(prev)
	}
	return before, around, after
}

// steady waits, bounded, until the queues' groups are settled and publishes
// complete again: one within 100 ms of the start of a steadyBefore span,
// and the span over.
func steady(ctx context.Context, cl *cluster.Cluster, p *publisher, groups []uint32) error {
	if err := cl.WaitSettled(ctx, rejoinTimeout, groups...); err != nil {
		return err
	}
	deadline := time.Now().Add(failoverTimeout)
	for {
		start := time.Now()
		pause(ctx, steadyBefore)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if cs := p.since(start, start.Add(-steadyBefore)); len(cs) > 0 && cs[0].at.Sub(start) < 100*time.Millisecond {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("publishes do not complete")
		}
	}
}

// firstElsewhere waits for the first completion after t0 by a broker
// other than the one at dead.
func firstElsewhere(ctx context.Context, p *publisher, t0 time.Time, dead string) (time.Time, string, error) {
	deadline := t0.Add(failoverTimeout)
	for time.Now().Before(deadline) {
		for _, c := range p.since(t0, t0.Add(-steadyBefore)) {
			if c.addr != dead {
				return c.at, c.addr, nil
			}
		}
		pause(ctx, time.Millisecond)
		if ctx.Err() != nil {
			return time.Time{}, "", ctx.Err()
		}
	}
	return time.Time{}, "", fmt.Errorf("no publish completed by another broker within %v of the kill", failoverTimeout)
}

// restart starts b again (thaw: sends it SIGCONT) and waits until it is
// in group g's SyncStateSet
// at the group's master; it returns how long that took from the restart.
// Then it purges the queues at their masters, so that the queues, and
// what a restarted broker has to catch up on, stay small over the run.
//
// Groups other than the queues' that have no serving master a while after
// the restart are reported on out (a broker fault this run does not
// measure, but should not hide), not waited for.
func restart(ctx context.Context, cl *cluster.Cluster, b *cluster.Broker, g uint32, queues []string, qgroups []uint32, out io.Writer, thaw bool) (time.Duration, error) {
	d, err := rejoin(ctx, cl, b, g, thaw)
	if err != nil {
		return d, err
	}
	if err := cl.WaitSettled(ctx, rejoinTimeout, qgroups...); err != nil {
		return d, err
	}
	if err := cl.WaitSettled(ctx, otherGroupsWait); err != nil {
		fmt.Fprintf(out, "warning: after broker %d's restart: %v\n", b.ID, err)
	}
	for _, q := range queues {
		var err error
		// A broker slow to answer its admin endpoint on the loaded
		// machine drops out of one view: retry a few times.
		for range 20 {
			if err = purge(ctx, cl, q); err == nil || ctx.Err() != nil {
				break
			}
			pause(ctx, 100*time.Millisecond)
		}
		if err != nil {
			return d, fmt.Errorf("purge %s: %w", q, err)
		}
	}
	return d, nil
}

func purge(ctx context.Context, cl *cluster.Cluster, q string) error {
	cl.Router.Forget()
	addr, err := cl.Router.Route(ctx, q)
	if err != nil {
		return err
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := client.Dial(pctx, addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	return conn.Purge(pctx, q)
}

// spared is a queue of queues whose group's master does not lead the
// controller, the i-th such in turn.
//
// When every queue's master leads the controller, it moves one queue's
// group by a forced election preferring another broker; that happens
// before the kill and is not measured.
func spared(ctx context.Context, cl *cluster.Cluster, view *cluster.View, queues []string, current string, i int) (string, error) {
	var ok []string
	for _, q := range queues {
		m, found := view.Masters[cluster.GroupOf(q, uint32(view.Groups))]
		if b := cl.ByID(m.Broker); found && b != nil && !cl.ControllerLeader(ctx, b) {
			ok = append(ok, q)
		}
	}
	if len(ok) > 0 {
		return ok[i%len(ok)], nil
	}
	// Every master sits on the controller leader (masters stay where
	// failovers put them): move the group of a queue not published to
	// now, whose members are level, to another broker.
	for _, q := range queues {
		if q == current {
			continue
		}
		g := cluster.GroupOf(q, uint32(view.Groups))
		m := view.Masters[g]
		for _, b := range cl.Brokers {
			if b.ID == m.Broker || cl.ControllerLeader(ctx, b) {
				continue
			}
			if err := cl.Elect(ctx, g, b.ID); err != nil {
				return "", err
			}
			deadline := time.Now().Add(rejoinTimeout)
			for time.Now().Before(deadline) {
				if v, err := cl.Router.View(ctx); err == nil && v.Masters[g].Broker == b.ID {
					return q, cl.WaitSettled(ctx, rejoinTimeout)
				}
				pause(ctx, 20*time.Millisecond)
				if ctx.Err() != nil {
					return "", ctx.Err()
				}
			}
			return "", fmt.Errorf("group %d: the election preferring broker %d did not move its master there", g, b.ID)
		}
	}
	return "", fmt.Errorf("every queue's master leads the controller (queues %v), and none could be moved", queues)
}

// onLeader moves group g's master onto the broker that leads the
// controller, by a forced election preferring it, unless it is there
// already, and returns the view that shows it there.
func onLeader(ctx context.Context, cl *cluster.Cluster, g uint32) (*cluster.View, error) {
	deadline := time.Now().Add(rejoinTimeout)
	for time.Now().Before(deadline) {
		var leader *cluster.Broker
		for _, b := range cl.Brokers {
			if cl.ControllerLeader(ctx, b) {
				leader = b
			}
		}
		view, err := cl.Router.View(ctx)
		if err == nil && leader != nil {
			if view.Masters[g].Broker == leader.ID {
				if err := cl.WaitSettled(ctx, rejoinTimeout, g); err != nil {
					return nil, err
				}
				// Settled, and still both? (The controller may have moved.)
				if v, err := cl.Router.View(ctx); err == nil && v.Masters[g].Broker == leader.ID && cl.ControllerLeader(ctx, leader) {
					return v, nil
				}
				continue
			}
			// Level members first: the preferred broker wins only a tie
			// of log ends, and each lost try costs the group an epoch.
			if err := cl.WaitSettled(ctx, rejoinTimeout, g); err != nil {
				return nil, err
			}
			if err := cl.Elect(ctx, g, leader.ID); err != nil {
				return nil, err
			}
		}
		pause(ctx, 200*time.Millisecond)
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
	return nil, fmt.Errorf("group %d: its master could not be moved onto the controller leader within %v", g, rejoinTimeout)
}

func rejoin(ctx context.Context, cl *cluster.Cluster, b *cluster.Broker, g uint32, thaw bool) (time.Duration, error) {
	t0 := time.Now()
	if thaw {
		if _, err := cl.Signal(b, syscall.SIGCONT); err != nil {
			return 0, err
		}
	} else if err := cl.Restart(ctx, b); err != nil {
		return 0, err
	}
	for time.Since(t0) < rejoinTimeout {
		if view, err := cl.Router.View(ctx); err == nil {
			if m, ok := view.Masters[g]; ok && slices.Contains(m.Set, b.ID) {
				return time.Since(t0), nil
			}
		}
		pause(ctx, 10*time.Millisecond)
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
	}
	return 0, fmt.Errorf("broker %d not back in group %d's SyncStateSet %v after its restart", b.ID, g, rejoinTimeout)
}

// copyLogs copies every *.log under dir into to, named by their path.
func copyLogs(dir, to string) {
	_ = os.MkdirAll(to, 0o755)
	_ = filepath.Walk(dir, func(path string, info os.FileInfo, err error) error {
		if err != nil || info.IsDir() || !strings.HasSuffix(path, ".log") {
			return nil
		}
		rel, _ := filepath.Rel(dir, path)
		if b, err := os.ReadFile(path); err == nil {
			_ = os.WriteFile(filepath.Join(to, strings.ReplaceAll(rel, "/", "_")), b, 0o644)
		}
		return nil
	})
}
