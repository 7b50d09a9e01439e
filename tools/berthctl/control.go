package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"math"
	"net"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/berthmq/berth/controlplane/ctlapi"
	"github.com/berthmq/berth/controlplane/ctlclient"
	"github.com/berthmq/berth/wire"
)

const (
	// groupsPageMax is how many groups one GetGroups call asks for while
	// paging; the controller caps a reply at its own limit anyway.
	groupsPageMax = 1024
	// appliedWaitMax bounds the applied-index probe: WaitChange long-polls
	// up to about two seconds when the log has nothing applied yet.
	appliedWaitMax = 500 * time.Millisecond
)

func dialController(e *env) (*ctlclient.Client, error) {
	addrs, err := e.controllerAddrs()
	if err != nil {
		return nil, err
	}
	return e.controllerClient(addrs)
}

// readModeFlag registers --read on commands that read controller state.
func readModeFlag(fs *flag.FlagSet) *string {
	return fs.String("read", "consistent", "controller read `mode`: consistent, follower or unsafe")
}

func parseReadMode(s string) (ctlapi.ReadMode, error) {
	switch s {
	case "consistent":
		return ctlapi.ReadConsistent, nil
	case "follower":
		return ctlapi.ReadFollower, nil
	case "unsafe":
		return ctlapi.ReadUnsafe, nil
	}
	return 0, usageErrorf("--read must be consistent, follower or unsafe, got %q", s)
}

func modeName(m uint8) string {
	switch m {
	case ctlapi.ModeActiveActive:
		return "active-active"
	case ctlapi.ModeActivePassive:
		return "active-passive"
	}
	return fmt.Sprintf("unknown(%d)", m)
}

func overflowName(o uint8) string {
	switch o {
	case wire.OverflowDropHead:
		return "drop-head"
	case wire.OverflowRejectPublish:
		return "reject-publish"
	}
	return fmt.Sprintf("unknown(%d)", o)
}

// parseBrokerID reads a broker id; 0 means "none" to the controller, so
// it is refused.
func parseBrokerID(what, s string) (uint32, error) {
	v, err := strconv.ParseUint(s, 10, 32)
	if err != nil || v == 0 {
		return 0, usageErrorf("%s must be a broker id from 1 to %d, got %q", what, uint32(math.MaxUint32), s)
	}
	return uint32(v), nil
}

// parseGroupID reads a group id; groups are numbered from 0.
func parseGroupID(s string) (uint32, error) {
	v, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		return 0, usageErrorf("GROUP must be a group number from 0, got %q", s)
	}
	return uint32(v), nil
}

// controllerStatus is what the controller client exposes about the
// controller group. The client has no membership call, so members are the
// addresses given and the leader it found.
type controllerStatus struct {
	Addrs           []string     `json:"addrs"`
	Leader          string       `json:"leader"`
	AppliedIndex    uint64       `json:"applied_index"`
	Groups          uint32       `json:"groups"`
	Mode            string       `json:"mode"`
	UncleanElection bool         `json:"unclean_election"`
	Version         uint16       `json:"version"`
	Brokers         []brokerJSON `json:"brokers"`
}

type brokerJSON struct {
	ID      uint32   `json:"id"`
	Addrs   []string `json:"addrs"`
	Version uint16   `json:"version"`
}

func fetchControllerStatus(ctx context.Context, e *env, mode ctlapi.ReadMode) (controllerStatus, error) {
	var st controllerStatus
	addrs, err := e.controllerAddrs()
	if err != nil {
		return st, err
	}
	st.Addrs = addrs
	c, err := e.controllerClient(addrs)
	if err != nil {
		return st, err
	}
	defer c.Close()
	info, err := c.GetClusterInfo(ctx, mode)
	if err != nil {
		return st, fmt.Errorf("controller: cluster info: %w", err)
	}
	st.Groups, st.Mode, st.UncleanElection, st.Version = info.Config.Groups, modeName(info.Config.Mode), info.Config.UncleanElection, info.Version
	brokers, err := c.GetBrokers(ctx, mode)
	if err != nil {
		return st, fmt.Errorf("controller: brokers: %w", err)
	}
	sort.Slice(brokers, func(i, j int) bool { return brokers[i].ID < brokers[j].ID })
	st.Brokers = make([]brokerJSON, 0, len(brokers))
	for _, b := range brokers {
		st.Brokers = append(st.Brokers, brokerJSON{ID: b.ID, Addrs: b.Addrs, Version: b.Version})
	}
	// WaitChange(0) returns at once with the leader's applied index
	// whenever anything was applied, which is the case once a leader is up.
	wctx, cancel := context.WithTimeout(ctx, appliedWaitMax)
	defer cancel()
	applied, err := c.WaitChange(wctx, 0)
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return st, fmt.Errorf("controller: applied index: %w", err)
	}
	st.AppliedIndex = applied
	st.Leader = c.Leader()
	return st, nil
}

func statusCmd(fs *flag.FlagSet) func(context.Context, *env, []string) error {
	readMode := readModeFlag(fs)
	return func(ctx context.Context, e *env, args []string) error {
		if len(args) != 0 {
			return usageErrorf("status takes no arguments, got %q", args)
		}
		mode, err := parseReadMode(*readMode)
		if err != nil {
			return err
		}
		cst, cerr := fetchControllerStatus(ctx, e, mode)
		var u *usageError
		if errors.As(cerr, &u) {
			return cerr
		}
		raw, bst, berr := fetchBrokerStatus(ctx, e)
		if e.json {
			out := map[string]any{}
			if cerr != nil {
				out["controller_error"] = cerr.Error()
			} else {
				out["controller"] = cst
			}
			if berr != nil {
				out["broker_error"] = berr.Error()
			} else {
				out["broker"] = raw
			}
			if err := writeJSON(e.stdout, out); err != nil {
				return err
			}
		} else {
			fmt.Fprintln(e.stdout, "controller:")
			if cerr != nil {
				fmt.Fprintf(e.stdout, "  unavailable: %v\n", cerr)
			} else {
				tw := newTable(e.stdout)
				fmt.Fprintf(tw, "  addresses\t%s\n", strings.Join(cst.Addrs, ","))
				fmt.Fprintf(tw, "  leader\t%s\n", cst.Leader)
				fmt.Fprintf(tw, "  applied index\t%d\n", cst.AppliedIndex)
				fmt.Fprintf(tw, "  groups\t%d\n", cst.Groups)
				fmt.Fprintf(tw, "  mode\t%s\n", cst.Mode)
				fmt.Fprintf(tw, "  unclean election\t%t\n", cst.UncleanElection)
				fmt.Fprintf(tw, "  version\t%d\n", cst.Version)
				fmt.Fprintf(tw, "  brokers\t%d\n", len(cst.Brokers))
				for _, b := range cst.Brokers {
					fmt.Fprintf(tw, "    broker %d\t%s (protocol %d)\n", b.ID, strings.Join(b.Addrs, ","), b.Version)
				}
				if err := tw.Flush(); err != nil {
					return err
				}
			}
			fmt.Fprintln(e.stdout, "broker:")
			if berr != nil {
				fmt.Fprintf(e.stdout, "  unavailable: %v\n", berr)
			} else if err := printBrokerStatus(e.stdout, "  ", bst); err != nil {
				return err
			}
		}
		switch {
		case cerr != nil && berr != nil:
			return errors.Join(cerr, berr)
		case cerr != nil:
			return cerr
		case berr != nil:
			return berr
		}
		return nil
	}
}

// wiringJSON is the controller's wiring in a stable, lower-case shape.
type wiringJSON struct {
	Exchanges []exchangeJSON `json:"exchanges"`
	Queues    []queueJSON    `json:"queues"`
	Bindings  []bindingJSON  `json:"bindings"`
}

type exchangeJSON struct {
	Name    string `json:"name"`
	Type    string `json:"type"`
	Durable bool   `json:"durable"`
}

type queueJSON struct {
	Name               string `json:"name"`
	Durable            bool   `json:"durable"`
	Exclusive          bool   `json:"exclusive,omitempty"`
	AutoDelete         bool   `json:"auto_delete,omitempty"`
	TTLMs              uint64 `json:"ttl_ms,omitempty"`
	MaxLength          uint64 `json:"max_length,omitempty"`
	MaxLengthBytes     uint64 `json:"max_length_bytes,omitempty"`
	Overflow           string `json:"overflow"`
	DeadLetterExchange string `json:"dead_letter_exchange,omitempty"`
	DeadLetterKey      string `json:"dead_letter_key,omitempty"`
	MaxDeliveries      uint32 `json:"max_deliveries,omitempty"`
	MaxPriority        uint8  `json:"max_priority,omitempty"`
}

type bindingJSON struct {
	Exchange string `json:"exchange"`
	Queue    string `json:"queue"`
	Key      string `json:"key"`
}

func toWiringJSON(w ctlapi.Wiring) wiringJSON {
	out := wiringJSON{Exchanges: []exchangeJSON{}, Queues: []queueJSON{}, Bindings: []bindingJSON{}}
	for _, x := range w.Exchanges {
		out.Exchanges = append(out.Exchanges, exchangeJSON{Name: x.Name, Type: x.Type, Durable: x.Durable})
	}
	for _, q := range w.Queues {
		o := q.Options
		out.Queues = append(out.Queues, queueJSON{
			Name: q.Name, Durable: o.Durable, Exclusive: o.Exclusive, AutoDelete: o.AutoDelete,
			TTLMs: o.MessageTTLMs, MaxLength: o.MaxLength, MaxLengthBytes: o.MaxLengthBytes,
			Overflow: overflowName(o.Overflow), DeadLetterExchange: o.DeadLetterExchange,
			DeadLetterKey: o.DeadLetterKey, MaxDeliveries: o.MaxDeliveries, MaxPriority: o.MaxPriority,
		})
	}
	for _, b := range w.Bindings {
		out.Bindings = append(out.Bindings, bindingJSON{Exchange: b.Exchange, Queue: b.Queue, Key: b.Key})
	}
	sort.Slice(out.Exchanges, func(i, j int) bool { return out.Exchanges[i].Name < out.Exchanges[j].Name })
	sort.Slice(out.Queues, func(i, j int) bool { return out.Queues[i].Name < out.Queues[j].Name })
	sort.Slice(out.Bindings, func(i, j int) bool {
		a, b := out.Bindings[i], out.Bindings[j]
		if a.Exchange != b.Exchange {
			return a.Exchange < b.Exchange
		}
		if a.Queue != b.Queue {
			return a.Queue < b.Queue
		}
		return a.Key < b.Key
	})
	return out
}

// queueOptionsText is the non-default options of a queue, for the table.
func queueOptionsText(q queueJSON) string {
	var parts []string
	add := func(cond bool, s string) {
		if cond {
			parts = append(parts, s)
		}
	}
	add(q.Exclusive, "exclusive")
	add(q.AutoDelete, "auto-delete")
	add(q.TTLMs != 0, fmt.Sprintf("ttl=%dms", q.TTLMs))
	add(q.MaxLength != 0, fmt.Sprintf("max-length=%d", q.MaxLength))
	add(q.MaxLengthBytes != 0, fmt.Sprintf("max-length-bytes=%d", q.MaxLengthBytes))
	add(q.MaxLength != 0 || q.MaxLengthBytes != 0, "overflow="+q.Overflow)
	add(q.DeadLetterExchange != "", "dlx="+q.DeadLetterExchange)
	add(q.DeadLetterKey != "", "dl-key="+q.DeadLetterKey)
	add(q.MaxDeliveries != 0, fmt.Sprintf("max-deliveries=%d", q.MaxDeliveries))
	add(q.MaxPriority != 0, fmt.Sprintf("max-priority=%d", q.MaxPriority))
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, " ")
}

func wiringCmd(fs *flag.FlagSet) func(context.Context, *env, []string) error {
	readMode := readModeFlag(fs)
	return func(ctx context.Context, e *env, args []string) error {
		if len(args) != 0 {
			return usageErrorf("wiring takes no arguments, got %q", args)
		}
		mode, err := parseReadMode(*readMode)
		if err != nil {
			return err
		}
		c, err := dialController(e)
		if err != nil {
			return err
		}
		defer c.Close()
		w, err := c.GetWiring(ctx, mode)
		if err != nil {
			return fmt.Errorf("controller: wiring: %w", err)
		}
		out := toWiringJSON(w)
		if e.json {
			return writeJSON(e.stdout, out)
		}
		// One table per section: the sections have different columns.
		tw := newTable(e.stdout)
		fmt.Fprintln(tw, "EXCHANGE\tTYPE\tDURABLE")
		for _, x := range out.Exchanges {
			fmt.Fprintf(tw, "%s\t%s\t%t\n", displayName(x.Name), x.Type, x.Durable)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		fmt.Fprintln(e.stdout)
		tw = newTable(e.stdout)
		fmt.Fprintln(tw, "QUEUE\tDURABLE\tOPTIONS")
		for _, q := range out.Queues {
			fmt.Fprintf(tw, "%s\t%t\t%s\n", displayName(q.Name), q.Durable, queueOptionsText(q))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		fmt.Fprintln(e.stdout)
		tw = newTable(e.stdout)
		fmt.Fprintln(tw, "BINDING-EXCHANGE\tQUEUE\tKEY")
		for _, b := range out.Bindings {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", displayName(b.Exchange), displayName(b.Queue), displayName(b.Key))
		}
		return tw.Flush()
	}
}

type groupJSON struct {
	ID           uint32   `json:"id"`
	Master       uint32   `json:"master"`
	Epoch        uint32   `json:"epoch"`
	SyncStateSet []uint32 `json:"sync_state_set"`
	Replicas     []uint32 `json:"replicas"` // the first is the first master the controller placed
	ElectedEpoch uint32   `json:"elected_log_end_epoch"`
	ElectedIndex uint64   `json:"elected_log_end_index"`
	// Lag: each replica other than the master, from the controller
	// leader's last heartbeats (withLag); absent when not read.
	Lag []replicaLag `json:"lag,omitempty"`
}

// replicaLag is how many entries of the group log a replica lacks that
// its master holds, as their last heartbeats (every 200 ms by default)
// reported their durable log ends.
type replicaLag struct {
	Broker  uint32 `json:"broker"`
	Alive   bool   `json:"alive"`
	Entries uint64 `json:"entries"`
}

// withLag fills in the groups' lag from the controller leader's
// heartbeats. A controller that cannot tell (an older version, no
// leader) leaves it out, with a note on stderr.
func withLag(ctx context.Context, e *env, c *ctlclient.Client, gs []groupJSON) {
	ids := make([]uint32, len(gs))
	for i, g := range gs {
		ids[i] = g.ID
	}
	ends, err := c.LogEnds(ctx, ids)
	if err != nil {
		fmt.Fprintf(e.stderr, "lag not shown: %v\n", err)
		return
	}
	for i := range gs {
		g := &gs[i]
		var master *ctlapi.Candidate
		for j := range ends[i] {
			if ends[i][j].Broker == g.Master {
				master = &ends[i][j]
			}
		}
		if master == nil {
			continue
		}
		g.Lag = []replicaLag{}
		for _, r := range ends[i] {
			if r.Broker == g.Master {
				continue
			}
			var behind uint64
			if r.LogEnd.Index < master.LogEnd.Index {
				behind = master.LogEnd.Index - r.LogEnd.Index
			}
			g.Lag = append(g.Lag, replicaLag{Broker: r.Broker, Alive: r.Alive, Entries: behind})
		}
	}
}

func toGroupJSON(g ctlapi.Group) groupJSON {
	set := g.SyncStateSet
	if set == nil {
		set = []uint32{}
	}
	replicas := g.Replicas
	if replicas == nil {
		replicas = []uint32{}
	}
	return groupJSON{ID: g.ID, Master: g.Master, Epoch: g.Epoch, SyncStateSet: set, Replicas: replicas,
		ElectedEpoch: g.ElectedLogEnd.Epoch, ElectedIndex: g.ElectedLogEnd.Index}
}

func printGroups(e *env, total uint32, gs []groupJSON) error {
	if e.json {
		return writeJSON(e.stdout, map[string]any{"total": total, "groups": gs})
	}
	tw := newTable(e.stdout)
	fmt.Fprintln(tw, "GROUP\tMASTER\tEPOCH\tSYNC-STATE-SET\tREPLICAS\tELECTED-LOG-END\tLAG")
	for _, g := range gs {
		master := "-"
		if g.Master != 0 {
			master = strconv.FormatUint(uint64(g.Master), 10)
		}
		list := func(ids []uint32) string {
			out := make([]string, len(ids))
			for i, id := range ids {
				out[i] = strconv.FormatUint(uint64(id), 10)
			}
			return "[" + strings.Join(out, " ") + "]"
		}
		lag := "-"
		if g.Lag != nil {
			parts := make([]string, len(g.Lag))
			for i, l := range g.Lag {
				if l.Alive {
					parts[i] = fmt.Sprintf("%d:%d", l.Broker, l.Entries)
				} else {
					parts[i] = fmt.Sprintf("%d:dead", l.Broker)
				}
			}
			lag = "[" + strings.Join(parts, " ") + "]"
		}
		fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%s\t%d/%d\t%s\n", g.ID, master, g.Epoch, list(g.SyncStateSet), list(g.Replicas), g.ElectedEpoch, g.ElectedIndex, lag)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "%d of %d groups shown\n", len(gs), total)
	return nil
}

func groupsCmd(fs *flag.FlagSet) func(context.Context, *env, []string) error {
	readMode := readModeFlag(fs)
	start := fs.Uint("start", 0, "first group `ID` of the page (groups are numbered from 0)")
	count := fs.Uint("count", 0, "most groups to show; 0 pages through all")
	return func(ctx context.Context, e *env, args []string) error {
		mode, err := parseReadMode(*readMode)
		if err != nil {
			return err
		}
		if *start > math.MaxUint32 || *count > math.MaxUint32 {
			return usageErrorf("--start and --count must fit in 32 bits")
		}
		c, err := dialController(e)
		if err != nil {
			return err
		}
		defer c.Close()
		if len(args) > 0 {
			// Named groups: one consistent read each, as the replicas see it.
			var gs []groupJSON
			for _, a := range args {
				id, err := parseGroupID(a)
				if err != nil {
					return err
				}
				var g ctlapi.Group
				if mode == ctlapi.ReadUnsafe {
					g, err = c.GetSyncStateSet(ctx, id)
				} else {
					g, err = c.GetReplicaInfo(ctx, mode, id)
				}
				if err != nil {
					return fmt.Errorf("controller: group %d: %w", id, err)
				}
				gs = append(gs, toGroupJSON(g))
			}
			withLag(ctx, e, c, gs)
			return printGroups(e, uint32(len(gs)), gs)
		}
		gs := []groupJSON{}
		next, want := uint32(*start), uint32(*count)
		var total uint32
		for {
			page := uint32(groupsPageMax)
			if want != 0 {
				page = min(page, want-uint32(len(gs)))
			}
			got, g, err := c.GetGroups(ctx, mode, next, page)
			if err != nil {
				return fmt.Errorf("controller: groups from %d: %w", next, err)
			}
			total = g
			for _, x := range got {
				gs = append(gs, toGroupJSON(x))
			}
			next += uint32(len(got))
			if len(got) == 0 || next >= total || (want != 0 && uint32(len(gs)) >= want) {
				break
			}
		}
		withLag(ctx, e, c, gs)
		return printGroups(e, total, gs)
	}
}

func electCmd(fs *flag.FlagSet) func(context.Context, *env, []string) error {
	preferred := fs.String("preferred", "", "broker `ID` that wins ties")
	return func(ctx context.Context, e *env, args []string) error {
		if len(args) == 0 {
			return usageErrorf("elect needs at least one GROUP")
		}
		var pref uint32
		if *preferred != "" {
			p, err := parseBrokerID("--preferred", *preferred)
			if err != nil {
				return err
			}
			pref = p
		}
		groups := make([]uint32, 0, len(args))
		for _, a := range args {
			id, err := parseGroupID(a)
			if err != nil {
				return err
			}
			groups = append(groups, id)
		}
		c, err := dialController(e)
		if err != nil {
			return err
		}
		defer c.Close()
		// The masters before, to tell a new master from the same one
		// elected again under a new epoch: the controller counts both.
		before := make(map[uint32]uint32, len(groups))
		for _, id := range groups {
			if g, err := c.GetReplicaInfo(ctx, ctlapi.ReadConsistent, id); err == nil {
				before[id] = g.Master
			}
		}
		epochs, err := c.ElectMaster(ctx, groups, pref)
		if err != nil {
			// A refusal (no such group, a preferred broker that is not
			// registered or not a replica) elected nothing.
			return fmt.Errorf("controller: elect: %w", err)
		}
		// Show the outcome: an election that moved nothing is worth seeing
		// next to the masters that stayed.
		after := make([]groupJSON, 0, len(groups))
		var moved uint64
		for _, id := range groups {
			g, err := c.GetReplicaInfo(ctx, ctlapi.ReadConsistent, id)
			if err != nil {
				return fmt.Errorf("controller: elected %d groups, then reading group %d: %w", epochs, id, err)
			}
			if m, ok := before[id]; ok && g.Master != m {
				moved++
			}
			after = append(after, toGroupJSON(g))
		}
		if e.json {
			return writeJSON(e.stdout, map[string]any{"new_masters": moved, "new_epochs": epochs, "groups": after})
		}
		fmt.Fprintf(e.stdout, "%d of %d groups got a new master", moved, len(groups))
		if epochs > moved {
			fmt.Fprintf(e.stdout, "; %d kept theirs under a new epoch", epochs-moved)
		}
		fmt.Fprintln(e.stdout)
		return printGroups(e, uint32(len(after)), after)
	}
}

func cleanBrokerCmd(fs *flag.FlagSet) func(context.Context, *env, []string) error {
	return func(ctx context.Context, e *env, args []string) error {
		if len(args) != 1 {
			return usageErrorf("clean-broker needs exactly one broker ID")
		}
		id, err := parseBrokerID("ID", args[0])
		if err != nil {
			return err
		}
		c, err := dialController(e)
		if err != nil {
			return err
		}
		defer c.Close()
		if err := c.CleanBrokerData(ctx, id); err != nil {
			return fmt.Errorf("controller: clean broker %d: %w", id, err)
		}
		if e.json {
			return writeJSON(e.stdout, map[string]any{"cleaned": id})
		}
		fmt.Fprintf(e.stdout, "broker %d removed from the controller\n", id)
		return nil
	}
}

type primaryJSON struct {
	Mode    string   `json:"mode"`
	Primary uint32   `json:"primary"` // 0: none
	Epoch   uint32   `json:"epoch"`
	Addrs   []string `json:"addrs"`
	Changed *bool    `json:"changed,omitempty"` // set by "primary elect"
}

func printPrimary(e *env, p ctlclient.PrimaryInfo, changed *bool) error {
	addrs := p.Addrs
	if addrs == nil {
		addrs = []string{}
	}
	out := primaryJSON{Mode: modeName(p.Mode), Primary: p.Broker, Epoch: p.Epoch, Addrs: addrs, Changed: changed}
	if e.json {
		return writeJSON(e.stdout, out)
	}
	if changed != nil && !*changed {
		fmt.Fprintln(e.stdout, "the primary did not change")
	}
	primary := "none"
	if p.Broker != 0 {
		primary = strconv.FormatUint(uint64(p.Broker), 10)
	}
	tw := newTable(e.stdout)
	fmt.Fprintln(tw, "MODE\tPRIMARY\tEPOCH\tADDRS")
	fmt.Fprintf(tw, "%s\t%s\t%d\t%s\n", out.Mode, primary, p.Epoch, strings.Join(addrs, ","))
	return tw.Flush()
}

// primaryCmd shows the primary broker of an active-passive cluster, or with
// "elect ID" hands the role to that broker.
func primaryCmd(fs *flag.FlagSet) func(context.Context, *env, []string) error {
	readMode := readModeFlag(fs)
	return func(ctx context.Context, e *env, args []string) error {
		mode, err := parseReadMode(*readMode)
		if err != nil {
			return err
		}
		var target uint32
		switch {
		case len(args) == 0:
		case args[0] == "elect" && len(args) == 2:
			if target, err = parseBrokerID("ID", args[1]); err != nil {
				return err
			}
		case args[0] == "elect":
			return usageErrorf("primary elect needs exactly one broker ID")
		default:
			return usageErrorf("unknown primary subcommand %q (want none or \"elect ID\")", args[0])
		}
		c, err := dialController(e)
		if err != nil {
			return err
		}
		defer c.Close()
		var changed *bool
		if target != 0 {
			moved, err := c.ElectPrimary(ctx, target)
			if err != nil {
				return fmt.Errorf("controller: elect primary %d: %w", target, err)
			}
			changed = &moved
			mode = ctlapi.ReadConsistent // show the outcome, not an older view
		}
		p, err := c.GetPrimaryInfo(ctx, mode)
		if err != nil {
			return fmt.Errorf("controller: primary: %w", err)
		}
		return printPrimary(e, p, changed)
	}
}

type memberJSON struct {
	ID     uint64 `json:"id"`
	Addr   string `json:"addr"`
	Leader bool   `json:"leader"`
}

// membersMax bounds the IDs one members add or remove takes: the
// controller refuses more in one change.
const membersMax = 5

// parseMemberAdds reads ID=ADDR arguments.
func parseMemberAdds(args []string) (map[uint64]string, error) {
	if len(args) == 0 {
		return nil, usageErrorf("members add needs at least one ID=ADDR")
	}
	if len(args) > membersMax {
		return nil, usageErrorf("members add takes at most %d ID=ADDR, got %d", membersMax, len(args))
	}
	add := make(map[uint64]string, len(args))
	for _, a := range args {
		idText, addr, ok := strings.Cut(a, "=")
		if !ok {
			return nil, usageErrorf("members add: %q: want ID=HOST:PORT", a)
		}
		id, err := parseControllerID(idText)
		if err != nil {
			return nil, err
		}
		host, port, err := net.SplitHostPort(addr)
		if err != nil || host == "" {
			return nil, usageErrorf("members add: %q: want ID=HOST:PORT", a)
		}
		if p, err := strconv.ParseUint(port, 10, 16); err != nil || p == 0 {
			return nil, usageErrorf("members add: %q: port must be 1..65535", a)
		}
		if _, dup := add[id]; dup {
			return nil, usageErrorf("members add: controller %d given twice", id)
		}
		add[id] = addr
	}
	return add, nil
}

// parseControllerID reads a controller's raft id; ids start at 1.
func parseControllerID(s string) (uint64, error) {
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil || v == 0 {
		return 0, usageErrorf("controller ID must be a positive integer, got %q", s)
	}
	return v, nil
}

// membersCmd lists the controller group's members, or adds or removes some
// in one joint-consensus change on the leader and then lists the outcome.
func membersCmd(fs *flag.FlagSet) func(context.Context, *env, []string) error {
	return func(ctx context.Context, e *env, args []string) error {
		var add map[uint64]string
		var remove []uint64
		switch {
		case len(args) == 0:
		case args[0] == "add":
			var err error
			if add, err = parseMemberAdds(args[1:]); err != nil {
				return err
			}
		case args[0] == "remove":
			if len(args) == 1 {
				return usageErrorf("members remove needs at least one controller ID")
			}
			if len(args) > 1+membersMax {
				return usageErrorf("members remove takes at most %d IDs, got %d", membersMax, len(args)-1)
			}
			for _, a := range args[1:] {
				id, err := parseControllerID(a)
				if err != nil {
					return err
				}
				if slices.Contains(remove, id) {
					return usageErrorf("members remove: controller %d given twice", id)
				}
				remove = append(remove, id)
			}
		default:
			return usageErrorf("unknown members subcommand %q (want none, \"add ID=ADDR...\" or \"remove ID...\")", args[0])
		}
		c, err := dialController(e)
		if err != nil {
			return err
		}
		defer c.Close()
		if add != nil || remove != nil {
			if err := c.ChangeMembership(ctx, add, remove); err != nil {
				return fmt.Errorf("controller: change members: %w", err)
			}
		}
		members, leader, err := c.MemberList(ctx)
		if err != nil {
			return fmt.Errorf("controller: members: %w", err)
		}
		out := make([]memberJSON, 0, len(members))
		for _, id := range slices.Sorted(maps.Keys(members)) {
			out = append(out, memberJSON{ID: id, Addr: members[id], Leader: id == leader})
		}
		if e.json {
			return writeJSON(e.stdout, map[string]any{"leader": leader, "members": out})
		}
		tw := newTable(e.stdout)
		fmt.Fprintln(tw, "ID\tADDRESS\tLEADER")
		for _, m := range out {
			mark := ""
			if m.Leader {
				mark = "*"
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\n", m.ID, m.Addr, mark)
		}
		return tw.Flush()
	}
}
