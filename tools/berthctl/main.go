// Command berthctl is Berth's admin CLI: cluster status, replication
// groups, queues and wiring, declares and deletes, forced elections and
// broker cleanup, controller membership.
//
// It talks to three endpoints: the controller (status, wiring, groups,
// elections, cleanup), the broker's admin HTTP (status, queue depths) and
// the broker's client port (declares, binds, deletes, purges, and
// publish, consume and get). Declares go
// through the broker, not straight to the controller, so the broker applies
// them itself and records durable wiring in the controller on its own path.
//
// Usage:
//
//	berthctl [global flags] COMMAND [flags] [args]
//
// Global flags may also follow the command. Exit status: 0 on success,
// 1 when an operation failed, 2 for bad usage.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"time"
)

const (
	exitOK    = 0
	exitFail  = 1
	exitUsage = 2
)

// globals are the flags every command takes.
type globals struct {
	controller string
	admin      string
	broker     string
	json       bool
	timeout    time.Duration
	user       string
	password   string
	security
}

func (g *globals) register(fs *flag.FlagSet) {
	fs.StringVar(&g.controller, "controller", "127.0.0.1:7402", "controller addresses, comma-separated: `ADDR[,ADDR...]`")
	fs.StringVar(&g.admin, "admin", "127.0.0.1:7480", "broker admin HTTP `ADDR`; HTTPS when --tls-ca is given, unless ADDR starts with http:// or https://")
	fs.StringVar(&g.broker, "broker", "127.0.0.1:7400", "broker client `ADDR`")
	fs.BoolVar(&g.json, "json", false, "machine-readable JSON output")
	fs.DurationVar(&g.timeout, "timeout", 5*time.Second, "bound on the whole command; for publish, consume and get, on each wait for the broker")
	fs.StringVar(&g.user, "user", "", "log in to the broker (SCRAM-SHA-256) and the admin HTTP (basic auth) as this user; none = the default user, loopback only (env BERTH_USER)")
	fs.StringVar(&g.password, "password", "", "the user's password; default: the BERTH_PASSWORD environment variable")
	g.security.register(fs)
}

// controllerAddrs splits --controller; an empty entry is a typo worth
// reporting rather than dialling "".
func (g *globals) controllerAddrs() ([]string, error) {
	var out []string
	for _, a := range strings.Split(g.controller, ",") {
		a = strings.TrimSpace(a)
		if a == "" {
			return nil, usageErrorf("--controller %q has an empty address", g.controller)
		}
		out = append(out, a)
	}
	return out, nil
}

// env is what a command runs with.
type env struct {
	globals
	stdin          io.Reader
	stdout, stderr io.Writer
}

// command is one subcommand. setup registers its flags; exec runs it with
// the positional arguments left after flag parsing.
type command struct {
	name    string
	args    string // positional synopsis for usage
	summary string
	setup   func(fs *flag.FlagSet) func(ctx context.Context, e *env, args []string) error
}

// usageError is bad input from the command line: exit 2 and the usage.
type usageError struct{ msg string }

func (u *usageError) Error() string { return u.msg }

func usageErrorf(format string, a ...any) error {
	return &usageError{msg: fmt.Sprintf(format, a...)}
}

func commands() []command {
	return []command{
		{"status", "", "controller leader, cluster info, brokers, applied index; broker status", statusCmd},
		{"queues", "", "queues on the broker: depth, unacked, consumers", queuesCmd},
		{"wiring", "", "exchanges, queues and bindings recorded in the controller", wiringCmd},
		{"cluster", "[init]", "the cluster's group count and mode; init sets them (--groups G)", clusterCmd},
		{"groups", "[GROUP...]", "replication groups: master, epoch, SyncStateSet", groupsCmd},
		{"declare-queue", "NAME", "declare a queue on the broker", declareQueueCmd},
		{"declare-exchange", "NAME", "declare an exchange on the broker", declareExchangeCmd},
		{"bind", "EXCHANGE QUEUE [KEY]", "bind a queue to an exchange", bindCmd(true)},
		{"unbind", "EXCHANGE QUEUE [KEY]", "remove a binding", bindCmd(false)},
		{"delete-queue", "NAME", "delete a queue and its messages", deleteQueueCmd},
		{"delete-exchange", "NAME", "delete an exchange and its bindings", deleteExchangeCmd},
		{"purge", "NAME", "remove every ready message of a queue", purgeCmd},
		{"publish", "(QUEUE | --exchange EX [--key K]) BODY|-", "publish messages to a queue or an exchange; - reads standard input", publishCmd},
		{"consume", "QUEUE", "print the messages of a queue as they arrive, and settle them", consumeCmd},
		{"get", "QUEUE", "print one message of a queue; by default it goes back to the queue", getCmd},
		{"elect", "GROUP...", "force a master election for groups", electCmd},
		{"clean-broker", "ID", "remove a broker and everything pointing at it from the controller", cleanBrokerCmd},
		{"primary", "[elect ID]", "the primary broker of an active-passive cluster; elect hands it to broker ID", primaryCmd},
		{"members", "[add ID=ADDR... | remove ID...]", "controller group members and the leader; add or remove controllers (joint consensus)", membersCmd},
		{"users", "[list | add NAME | passwd NAME | permissions NAME | remove NAME]", "client users in the controller; add and passwd read the password from standard input; permissions replaces the --configure, --write and --read patterns", usersCmd},
		{"certs", "init DIR", "make a cluster CA, node and client certificates, a cluster secret and an admin token for a local cluster (docs/SECURITY.md)", certsCmd},
		{"version", "", "berthctl's version, commit and Go version", versionCmd},
	}
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// streaming commands run until their work is done or SIGINT/SIGTERM
// arrives; --timeout bounds each of their waits for the broker, not the
// whole command.
var streaming = map[string]bool{"publish": true, "consume": true, "get": true}

// run is main without the process: tests call it directly.
func run(args []string, stdout, stderr io.Writer) int {
	return runIO(args, os.Stdin, stdout, stderr)
}

// runIO is run with the standard input given too.
func runIO(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	e := &env{stdin: stdin, stdout: stdout, stderr: stderr}
	top := flag.NewFlagSet("berthctl", flag.ContinueOnError)
	top.SetOutput(io.Discard)
	e.register(top)
	if err := top.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			topUsage(stdout, top)
			return exitOK
		}
		fmt.Fprintf(stderr, "berthctl: %v\n", err)
		topUsage(stderr, top)
		return exitUsage
	}
	rest := top.Args()
	if len(rest) == 0 {
		fmt.Fprintln(stderr, "berthctl: no command given")
		topUsage(stderr, top)
		return exitUsage
	}
	name := rest[0]
	if name == "help" {
		if len(rest) > 1 {
			if c, ok := findCommand(rest[1]); ok {
				fs, _ := commandFlags(c, e)
				commandUsage(stdout, c, fs)
				return exitOK
			}
		}
		topUsage(stdout, top)
		return exitOK
	}
	c, ok := findCommand(name)
	if !ok {
		fmt.Fprintf(stderr, "berthctl: unknown command %q\n", name)
		topUsage(stderr, top)
		return exitUsage
	}
	fs, exec := commandFlags(c, e)
	pos, err := parseInterspersed(fs, rest[1:])
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			commandUsage(stdout, c, fs)
			return exitOK
		}
		fmt.Fprintf(stderr, "berthctl %s: %v\n", c.name, err)
		commandUsage(stderr, c, fs)
		return exitUsage
	}
	e.fromEnv()
	if e.timeout <= 0 {
		fmt.Fprintf(stderr, "berthctl %s: --timeout must be positive, got %v\n", c.name, e.timeout)
		return exitUsage
	}
	var ctx context.Context
	var cancel context.CancelFunc
	if streaming[c.name] {
		ctx, cancel = signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	} else {
		ctx, cancel = context.WithTimeout(context.Background(), e.timeout)
	}
	defer cancel()
	if err := exec(ctx, e, pos); err != nil {
		fmt.Fprintf(stderr, "berthctl %s: %v%s\n", c.name, err, e.credentialHint(err))
		var u *usageError
		if errors.As(err, &u) {
			commandUsage(stderr, c, fs)
			return exitUsage
		}
		return exitFail
	}
	return exitOK
}

func findCommand(name string) (command, bool) {
	for _, c := range commands() {
		if c.name == name {
			return c, true
		}
	}
	return command{}, false
}

// commandFlags builds a command's flag set; the global flags are bound to
// the same variables so they work after the command name too.
func commandFlags(c command, e *env) (*flag.FlagSet, func(context.Context, *env, []string) error) {
	fs := flag.NewFlagSet(c.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	exec := c.setup(fs)
	// Registering stores the defaults into the variables; keep what the
	// flags before the command name set.
	saved := e.globals
	e.register(fs)
	e.globals = saved
	return fs, exec
}

// parseInterspersed parses flags wherever they appear among positional
// arguments ("declare-queue q --durable"), as operators expect. After
// "--" everything is positional, so a name or key starting with "-" can
// still be given.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

func topUsage(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprintln(w, "usage: berthctl [global flags] COMMAND [flags] [args]")
	fmt.Fprintln(w, "\ncommands:")
	cs := commands()
	sort.Slice(cs, func(i, j int) bool { return cs[i].name < cs[j].name })
	for _, c := range cs {
		fmt.Fprintf(w, "  %-18s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w, "\nglobal flags (also accepted after the command):")
	printFlags(w, fs)
	fmt.Fprintln(w, "\n'berthctl help COMMAND' or 'berthctl COMMAND -h' shows a command's flags.")
}

func commandUsage(w io.Writer, c command, fs *flag.FlagSet) {
	synopsis := "berthctl " + c.name + " [flags]"
	if c.args != "" {
		synopsis += " " + c.args
	}
	fmt.Fprintf(w, "usage: %s\n  %s\n\nflags:\n", synopsis, c.summary)
	printFlags(w, fs)
}

func printFlags(w io.Writer, fs *flag.FlagSet) {
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
}
