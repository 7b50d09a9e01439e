package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/berthmq/berth/controlplane"
	"github.com/berthmq/berth/controlplane/ctlapi"
	"github.com/berthmq/berth/controlplane/ctlclient"
	"github.com/berthmq/berth/server/wiring"
	"github.com/berthmq/berth/shards"
	"github.com/berthmq/berth/wire"
)

// Roles a berthd node runs.
const (
	// RoleBroker serves clients; it embeds a controller member when one
	// is configured.
	RoleBroker = "broker"
	// RoleController runs only a controller member (and the admin HTTP):
	// no client listener, no shards.
	RoleController = "controller"
)

// ControllerWaitDefault bounds how long a broker that embeds a member of a
// 3- or 5-member controller waits at start for the group to elect a
// leader before it restores its wiring. The members of a group start
// independently; the first one up waits for a majority, so the wait
// covers the others starting some seconds later.
const ControllerWaitDefault = 30 * time.Second

// controllerWaitLog is the interval of the progress lines while waiting.
const controllerWaitLog = 5 * time.Second

// wiringTimeout bounds one wiring change or load through the controller,
// retries included.
const wiringTimeout = 10 * time.Second

// validateController checks the role and the controller settings: a
// group has 1, 3 or 5 members with distinct nonzero ids and addresses,
// ControllerID is one of them, and a controller needs a data directory.
func (c *Config) validateController() error {
	switch c.Role {
	case "", RoleBroker, RoleController:
	default:
		return configErrorf([]string{"role"}, "role %q: want %s or %s", c.Role, RoleBroker, RoleController)
	}
	if len(c.ControllerAddrs) > 0 {
		return c.validateControllerAddrs()
	}
	if c.ControllerJoin && len(c.ControllerPeers) < 2 {
		return configErrorf([]string{"controller-join", "controller-peers"}, "joining a controller group needs controller peers naming this node and at least one running member")
	}
	if len(c.ControllerPeers) == 0 {
		if c.ControllerID != 0 {
			return configErrorf([]string{"controller-id", "controller-peers"}, "controller id %d given without controller peers", c.ControllerID)
		}
		if c.Role == RoleController && c.ControllerAddr == "" {
			return configErrorf([]string{"role", "controller", "controller-peers"}, "role controller needs a controller address or controller peers")
		}
	} else {
		switch n := len(c.ControllerPeers); {
		case c.ControllerJoin:
			// This node and the members it knows: at most a full group of
			// 5 plus itself, when it replaces one of them.
			if n > controllerJoinPeersMax {
				return configErrorf([]string{"controller-peers", "controller-join"}, "a joining controller lists itself and at most %d members, not %d entries", controllerJoinPeersMax-1, n)
			}
		case n != 1 && n != 3 && n != 5:
			return configErrorf([]string{"controller-peers"}, "a controller group has 1, 3 or 5 members, not %d", n)
		}
		seen := map[string]uint64{}
		for _, id := range slices.Sorted(maps.Keys(c.ControllerPeers)) {
			addr := c.ControllerPeers[id]
			if id == 0 {
				return configErrorf([]string{"controller-peers"}, "controller ids start at 1")
			}
			if err := ctlapi.CheckControllerAddr(addr); err != nil {
				return configErrorf([]string{"controller-peers"}, "controller %d: %w", id, err)
			}
			if other, ok := seen[addr]; ok {
				return configErrorf([]string{"controller-peers"}, "controllers %d and %d share the address %s", other, id, addr)
			}
			seen[addr] = id
		}
		if _, ok := c.ControllerPeers[c.ControllerID]; !ok {
			return configErrorf([]string{"controller-id", "controller-peers"}, "controller id %d is not one of the peers %v", c.ControllerID, slices.Sorted(maps.Keys(c.ControllerPeers)))
		}
	}
	if c.DataDir == "" && (c.Role == RoleController || len(c.ControllerPeers) > 0) {
		return configErrorf([]string{"data", "role", "controller-peers"}, "a controller needs a data directory")
	}
	return nil
}

// controllerJoinPeersMax bounds ControllerPeers of a joining member.
const controllerJoinPeersMax = 6

// controllerAddrsMax bounds ControllerAddrs: a group's members, 5 at
// most, and one more while a member is being replaced.
const controllerAddrsMax = 6

// validateControllerAddrs checks ControllerAddrs: a broker's, with a data
// directory, without a member of its own, distinct host:port addresses.
func (c *Config) validateControllerAddrs() error {
	keys := []string{"controller-addrs"}
	switch {
	case c.Role == RoleController:
		return configErrorf(append(keys, "role"), "a controller-only node runs a member: give it controller peers, not controller addresses")
	case len(c.ControllerPeers) > 0 || c.ControllerID != 0 || c.ControllerJoin:
		return configErrorf(append(keys, "controller-peers", "controller-id"), "controller addresses are for a broker that runs no controller member: give either them or controller peers, not both")
	case c.ControllerAddr != "":
		return configErrorf(append(keys, "controller"), "controller addresses are for a broker that runs no controller member: they exclude the in-process controller's address %s", c.ControllerAddr)
	case len(c.ControllerAddrs) > controllerAddrsMax:
		return configErrorf(keys, "%d controller addresses: a controller group has at most 5 members", len(c.ControllerAddrs))
	case c.DataDir == "":
		return configErrorf(append(keys, "data"), "a broker of a controller group needs a data directory (its journal and broker id)")
	}
	seen := map[string]bool{}
	for _, addr := range c.ControllerAddrs {
		if err := ctlapi.CheckControllerAddr(addr); err != nil {
			return configErrorf(keys, "controller address %q: %w", addr, err)
		}
		if seen[addr] {
			return configErrorf(keys, "controller address %s given twice", addr)
		}
		seen[addr] = true
	}
	return nil
}

// controllerEmbedded reports whether Start runs a controller member.
func (c *Config) controllerEmbedded() bool {
	if c.Role == RoleController {
		return true
	}
	return c.DataDir != "" && len(c.ControllerAddrs) == 0 && (c.ControllerAddr != "" || len(c.ControllerPeers) > 0)
}

// controllerRemote reports whether the broker uses a controller group it
// runs no member of (ControllerAddrs).
func (c *Config) controllerRemote() bool {
	return c.Role != RoleController && c.DataDir != "" && len(c.ControllerAddrs) > 0
}

// connectController makes the client of the controller group at
// ControllerAddrs, which this broker runs no member of, and waits
// (bounded by ControllerWait) until the group answers a consistent read,
// so that the wiring restored next is the controller's. It returns the
// wiring log over the client.
func (s *Server) connectController() (*controllerWiring, error) {
	cfg := s.cfg
	s.ctlClient = ctlclient.NewClientAuth(slices.Clone(cfg.ControllerAddrs), s.peerAuth)
	cfg.Logger.Info("server: using a controller group this broker runs no member of", "addrs", cfg.ControllerAddrs)
	start := time.Now()
	nextLog := start.Add(controllerWaitLog)
	for {
		ctx, cancel := context.WithTimeout(s.regCtx, time.Second)
		_, err := s.ctlClient.GetClusterInfo(ctx, ctlapi.ReadConsistent)
		cancel()
		if err == nil {
			cfg.Logger.Info("server: controller group answers", "waited", time.Since(start).Round(time.Millisecond))
			break
		}
		if time.Since(start) > cfg.ControllerWait {
			return nil, fmt.Errorf("server: the controller group at %s did not answer within %v (last error: %w); start its members, or check -controller-addrs", strings.Join(cfg.ControllerAddrs, ","), cfg.ControllerWait, err)
		}
		if now := time.Now(); now.After(nextLog) {
			cfg.Logger.Warn("server: waiting for the controller group to answer", "addrs", cfg.ControllerAddrs, "waited", now.Sub(start).Round(time.Second), "err", err)
			nextLog = now.Add(controllerWaitLog)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return &controllerWiring{cl: s.ctlClient, timeout: wiringTimeout, stop: s.regCtx}, nil
}

// startController starts this node's controller member and returns the
// wiring log over it. With 3 or 5 members it waits (bounded by
// ControllerWait) for the group to elect a leader; wait=false skips that
// (a controller-only node has nothing to restore).
func (s *Server) startController(wait bool) (*controllerWiring, error) {
	cfg := s.cfg
	s.arm(stopController) // stopController copes with a member not started
	dir := filepath.Join(cfg.DataDir, "controller")
	if len(cfg.ControllerPeers) <= 1 {
		addr := cfg.ControllerAddr
		if len(cfg.ControllerPeers) == 1 {
			addr = cfg.ControllerPeers[cfg.ControllerID]
		}
		n, err := controlplane.StartSingleAuth(dir, addr, s.peerAuth, cfg.Logger)
		if err != nil {
			return nil, fmt.Errorf("server: controller: %w", err)
		}
		s.ctl = n
		s.boot.ctl.Store(n)
		watchController(n, cfg.Logger)
		return &controllerWiring{n: n, timeout: wiringTimeout, stop: s.regCtx}, nil
	}
	n, err := controlplane.Start(controlplane.Config{ID: cfg.ControllerID, Peers: maps.Clone(cfg.ControllerPeers), Dir: dir, LeaseRead: cfg.ControllerLeaseRead,
		Join: cfg.ControllerJoin, Auth: s.peerAuth, Logger: cfg.Logger,
		BrokerTimeout: cfg.ControllerBrokerTimeout, LeaderGrace: cfg.ControllerLeaderGrace})
	if err != nil {
		return nil, fmt.Errorf("server: controller: %w", err)
	}
	s.ctl = n
	s.boot.ctl.Store(n)
	watchController(n, cfg.Logger)
	addrs := make([]string, 0, len(cfg.ControllerPeers))
	for _, id := range slices.Sorted(maps.Keys(cfg.ControllerPeers)) {
		addrs = append(addrs, cfg.ControllerPeers[id])
	}
	s.ctlClient = ctlclient.NewClientAuth(addrs, s.peerAuth)
	cfg.Logger.Info("server: controller member started", "id", cfg.ControllerID, "addr", n.Addr(), "members", len(addrs), "join", cfg.ControllerJoin)
	if cfg.ControllerJoin {
		// A joining member hears from no leader until an operator adds
		// it, which may be long after this start: waiting here would fail
		// the start of a node doing what it was told. A broker reads its
		// wiring through the client instead, from the running members in
		// its peer list (retried up to wiringTimeout). After a restart of
		// a member that joined, the wait is skipped the same way.
		cfg.Logger.Info("server: joining controller member; it takes part once the group adds it", "id", cfg.ControllerID,
			"command", fmt.Sprintf("berthctl members add %d=%s", cfg.ControllerID, cfg.ControllerPeers[cfg.ControllerID]))
		wait = false
	}
	if wait {
		if err := waitControllerLeader(n, cfg.ControllerWait, len(addrs), cfg.Logger); err != nil {
			return nil, err // Start's abort stops the member
		}
	}
	return &controllerWiring{cl: s.ctlClient, timeout: wiringTimeout, stop: s.regCtx}, nil
}

// waitControllerLeader waits up to wait for n to know a leader, logging
// progress every few seconds.
func waitControllerLeader(n *controlplane.Node, wait time.Duration, members int, log *slog.Logger) error {
	start := time.Now()
	nextLog := start.Add(controllerWaitLog)
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for n.Leader() == 0 {
		now := time.Now()
		if now.Sub(start) >= wait {
			return fmt.Errorf("server: the controller group elected no leader within %v: at least %d of its %d members must be running and reach each other", wait, members/2+1, members)
		}
		if now.After(nextLog) {
			log.Info("server: waiting for the controller group to elect a leader", "waited", now.Sub(start).Round(time.Second), "limit", wait, "majority", members/2+1)
			nextLog = now.Add(controllerWaitLog)
		}
		<-t.C
	}
	log.Info("server: controller group has a leader", "leader", n.Leader(), "waited", time.Since(start).Round(time.Millisecond))
	return nil
}

// startControllerOnly runs a controller member, with no client listener
// and no shards; Start has started the admin HTTP.
func startControllerOnly(s *Server) error {
	if _, err := s.startController(false); err != nil {
		return err
	}
	if s.cfg.AdminAddr != "" && adminAuthRequired(s.cfg.AdminAddr, s.cfg.AdminToken) {
		// The admin HTTP's basic auth checks the controller's users. The
		// watch reads them once a leader answers; start does not wait.
		s.regWG.Add(1)
		go s.watchUsers(0)
	}
	s.log.Info("berth: controller started", "controller", s.ctl.Addr(), "id", s.ctl.ID(), "admin", s.AdminAddr())
	return nil
}

// controllerWiring records durable wiring in the controller. It implements
// wiring.Log. With a one-member controller it calls the in-process
// node (always the leader); with 3 or 5 members it goes through a client
// that finds the leader from any member and follows redirects.
type controllerWiring struct {
	n       *controlplane.Node // one member, in-process
	cl      *ctlclient.Client  // 3 or 5 members
	timeout time.Duration
	// stop ends the calls when the broker stops (its registration's
	// context): a wiring sync waiting for a controller without a leader
	// held Close for the whole timeout.
	stop context.Context
}

// ctx is a call's context: the timeout, and ended by the broker's stop.
func (w *controllerWiring) ctx() (context.Context, context.CancelFunc) {
	if w.stop == nil {
		return context.WithTimeout(context.Background(), w.timeout)
	}
	return context.WithTimeout(w.stop, w.timeout)
}

// wiringRetryDelay spaces retries of a wiring call while the controller
// group has no reachable leader.
const wiringRetryDelay = 50 * time.Millisecond

func (w *controllerWiring) propose(ev ctlapi.Event) error {
	ctx, cancel := w.ctx()
	defer cancel()
	if w.cl == nil {
		res, err := w.n.Propose(ctx, ev)
		if err != nil {
			return shards.Errorf(wire.CodeInternal, "controller: %v", err)
		}
		return resultError(res.Err())
	}
	// Through the group: retry until the timeout while the leader is
	// unknown or moving. Every wiring event may be applied twice with the
	// same outcome (declares and binds are idempotent), except that a
	// delete or unbind repeated after an ambiguous attempt finds nothing:
	// that counts as done.
	ambiguous := false
	for {
		_, err := w.cl.Propose(ctx, ev)
		var re *ctlapi.ResultError
		switch {
		case err == nil:
			return nil
		case errors.As(err, &re):
			if ambiguous && re.Code == ctlapi.CodeNotFound && isRemoval(ev) {
				return nil
			}
			return resultError(err)
		case errors.Is(err, ctlapi.ErrBadRequest):
			return shards.Errorf(wire.CodeInternal, "controller: %v", err)
		case errors.Is(err, ctlapi.ErrLeaderChanged):
			ambiguous = true
		}
		select {
		case <-ctx.Done():
			return shards.Errorf(wire.CodeInternal, "controller: no answer within %v: %v", w.timeout, err)
		case <-time.After(wiringRetryDelay):
		}
	}
}

func isRemoval(ev ctlapi.Event) bool {
	switch ev.(type) {
	case *ctlapi.DeleteQueue, *ctlapi.DeleteExchange, *ctlapi.Unbind:
		return true
	}
	return false
}

// resultError maps the state machine's refusal to a wire error code.
func resultError(err error) error {
	if err == nil {
		return nil
	}
	var re *ctlapi.ResultError
	code := wire.CodeInternal
	msg := err.Error()
	if errors.As(err, &re) {
		msg = re.Msg
		switch re.Code {
		case ctlapi.CodeNotFound:
			code = wire.CodeNotFound
		case ctlapi.CodeConflict:
			code = wire.CodePreconditionFailed
		case ctlapi.CodeInvalid:
			code = wire.CodeInvalid
		}
	}
	return shards.Errorf(code, "controller: %s", msg)
}

var exchangeKinds = [...]string{wiring.KindDirect: "direct", wiring.KindFanout: "fanout", wiring.KindTopic: "topic"}

func (w *controllerWiring) DeclareExchange(name string, kind uint8, opts wiring.ExchangeOptions) error {
	return w.propose(&ctlapi.DeclareExchange{Name: name, Type: exchangeKinds[kind], Durable: opts.Durable})
}

func (w *controllerWiring) DeclareQueue(name string, opts shards.QueueOptions) error {
	return w.propose(&ctlapi.DeclareQueue{Name: name, Options: opts})
}

func (w *controllerWiring) Bind(exchange, queue, key string) error {
	return w.propose(&ctlapi.Bind{Exchange: exchange, Queue: queue, Key: key})
}

func (w *controllerWiring) Unbind(exchange, queue, key string) error {
	return w.propose(&ctlapi.Unbind{Exchange: exchange, Queue: queue, Key: key})
}

func (w *controllerWiring) DeleteQueue(name string) error {
	return w.propose(&ctlapi.DeleteQueue{Name: name})
}

func (w *controllerWiring) DeleteExchange(name string) error {
	return w.propose(&ctlapi.DeleteExchange{Name: name})
}

// Load reads the wiring by a linearizable read, so it sees every change
// the controller committed.
func (w *controllerWiring) Load() (*wiring.Snapshot, error) {
	ctx, cancel := w.ctx()
	defer cancel()
	var cw ctlapi.Wiring
	if w.cl == nil {
		if err := w.n.Read(ctx, ctlapi.ReadConsistent, func(st *controlplane.State) { cw = st.Wiring() }); err != nil {
			return nil, err
		}
	} else {
		// A follower read: any member answers once it has applied up to
		// the leader's commit index, so it is as fresh as a read at the
		// leader. Retried while the group has no reachable leader.
		for {
			var err error
			cw, err = w.cl.GetWiring(ctx, ctlapi.ReadFollower)
			if err == nil {
				break
			}
			select {
			case <-ctx.Done():
				return nil, fmt.Errorf("controller: load wiring: %w", err)
			case <-time.After(wiringRetryDelay):
			}
		}
	}
	snap := &wiring.Snapshot{}
	for _, x := range cw.Exchanges {
		kind := -1
		for k, name := range exchangeKinds {
			if name == x.Type {
				kind = k
			}
		}
		if kind < 0 {
			continue // a kind this broker does not serve
		}
		snap.Exchanges = append(snap.Exchanges, wiring.WiringExchange{Name: x.Name, Kind: uint8(kind), Options: wiring.ExchangeOptions{Durable: x.Durable}})
	}
	for _, q := range cw.Queues {
		snap.Queues = append(snap.Queues, wiring.WiringQueue{Name: q.Name, Options: q.Options})
	}
	for _, b := range cw.Bindings {
		snap.Bindings = append(snap.Bindings, wiring.Binding{Exchange: b.Exchange, Queue: b.Queue, Key: b.Key})
	}
	return snap, nil
}

// watchController logs the controller member's fatal error, if it stops on
// one: durable wiring changes fail from then on, and the operator must know
// why.
func watchController(n *controlplane.Node, log *slog.Logger) {
	go func() {
		<-n.Done()
		if err := n.Err(); err != nil {
			log.Error("server: controller member stopped on a fatal error; durable wiring changes will fail", "id", n.ID(), "err", err)
		}
	}()
}

// controllerStatus is the embedded controller member's raft status, for
// /v1/status.
func (s *Server) controllerStatus() map[string]any {
	n := s.boot.ctl.Load() // the admin HTTP may ask while Start runs
	st := n.Status()
	return map[string]any{
		"id": st.ID, "addr": n.Addr(), "leader": st.Leader, "is_leader": n.IsLeader(),
		"term": st.Term, "applied": st.Applied, "snapshot_index": st.SnapshotIndex,
		"first_index": st.FirstIndex, "last_index": st.LastIndex,
	}
}
