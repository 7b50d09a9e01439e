package main

import (
	"context"
	"flag"
	"fmt"

	"github.com/berthmq/berth/client"
)

// withBroker runs fn on a session with the broker at --broker and closes it.
func withBroker(ctx context.Context, e *env, fn func(*client.Conn) error) error {
	cfg, err := e.brokerConfig()
	if err != nil {
		return err
	}
	c, err := client.DialConfig(ctx, cfg, e.broker)
	if err != nil {
		return fmt.Errorf("broker: %w", err)
	}
	err = fn(c)
	if cerr := c.Close(); err == nil && cerr != nil {
		return fmt.Errorf("broker: close: %w", cerr)
	}
	if err != nil {
		return fmt.Errorf("broker: %w", err)
	}
	return nil
}

// done reports a successful change, as text or JSON.
func done(e *env, action string, fields map[string]any, text string) error {
	if e.json {
		out := map[string]any{"ok": true, "action": action}
		for k, v := range fields {
			out[k] = v
		}
		return writeJSON(e.stdout, out)
	}
	fmt.Fprintln(e.stdout, text)
	return nil
}

func oneName(what string, args []string) (string, error) {
	if len(args) != 1 {
		return "", usageErrorf("needs exactly one %s, got %d arguments", what, len(args))
	}
	return args[0], nil
}

func declareQueueCmd(fs *flag.FlagSet) func(context.Context, *env, []string) error {
	durable := fs.Bool("durable", false, "survive a broker restart (recorded in the controller)")
	autoDelete := fs.Bool("auto-delete", false, "delete when the last consumer cancels")
	passive := fs.Bool("passive", false, "only check that the queue exists")
	noReplicate := fs.Bool("no-replicate", false, "keep the queue on one broker; refused (invalid) for a durable queue in a cluster with replication groups, which replicates it")
	maxLength := fs.Uint64("max-length", 0, "most messages held; 0 = unlimited")
	maxLengthBytes := fs.Uint64("max-length-bytes", 0, "most payload bytes held; 0 = unlimited")
	overflow := fs.String("overflow", "reject-publish", "policy at the max length: reject-publish or drop-head")
	ttl := fs.Duration("ttl", 0, "per-queue message TTL (whole milliseconds); 0 = none")
	dlx := fs.String("dlx", "", "dead-letter `EXCHANGE`")
	dlKey := fs.String("dl-key", "", "dead-letter routing `KEY`; empty keeps each message's key")
	maxDeliveries := fs.Uint("max-deliveries", 0, "dead-letter a message delivered this often; 0 = never")
	maxPriority := fs.Uint("max-priority", 0, "a priority queue with priorities 0 to `N` (at most 10); 0 = a plain queue")
	return func(ctx context.Context, e *env, args []string) error {
		name, err := oneName("queue NAME", args)
		if err != nil {
			return err
		}
		if *ttl < 0 {
			return usageErrorf("--ttl must not be negative, got %v", *ttl)
		}
		if *maxDeliveries > 1<<32-1 {
			return usageErrorf("--max-deliveries must fit in 32 bits, got %d", *maxDeliveries)
		}
		if *maxPriority > 10 {
			return usageErrorf("--max-priority must be 0 to 10, got %d", *maxPriority)
		}
		opts := client.QueueOptions{
			Durable: *durable, AutoDelete: *autoDelete, Passive: *passive, NoReplicate: *noReplicate,
			MaxLength: *maxLength, MaxLengthBytes: *maxLengthBytes, MessageTTL: *ttl,
			DeadLetterExchange: *dlx, DeadLetterKey: *dlKey, MaxDeliveries: uint32(*maxDeliveries),
			MaxPriority: uint8(*maxPriority),
		}
		switch *overflow {
		case "reject-publish":
			opts.Overflow = client.OverflowRejectPublish
		case "drop-head":
			opts.Overflow = client.OverflowDropHead
		default:
			return usageErrorf("--overflow must be reject-publish or drop-head, got %q", *overflow)
		}
		err = withBroker(ctx, e, func(c *client.Conn) error { return c.DeclareQueue(ctx, name, opts) })
		if err != nil {
			return err
		}
		return done(e, "declare-queue", map[string]any{"queue": name, "durable": *durable}, "queue "+name+" declared")
	}
}

func declareExchangeCmd(fs *flag.FlagSet) func(context.Context, *env, []string) error {
	typ := fs.String("type", "direct", "exchange `type`: direct, fanout or topic")
	durable := fs.Bool("durable", false, "survive a broker restart (recorded in the controller)")
	autoDelete := fs.Bool("auto-delete", false, "delete when the last binding goes")
	passive := fs.Bool("passive", false, "only check that the exchange exists")
	return func(ctx context.Context, e *env, args []string) error {
		name, err := oneName("exchange NAME", args)
		if err != nil {
			return err
		}
		var kind client.ExchangeKind
		switch *typ {
		case "direct":
			kind = client.Direct
		case "fanout":
			kind = client.Fanout
		case "topic":
			kind = client.Topic
		default:
			return usageErrorf("--type must be direct, fanout or topic, got %q", *typ)
		}
		opts := client.ExchangeOptions{Durable: *durable, AutoDelete: *autoDelete, Passive: *passive}
		err = withBroker(ctx, e, func(c *client.Conn) error { return c.DeclareExchange(ctx, name, kind, opts) })
		if err != nil {
			return err
		}
		return done(e, "declare-exchange", map[string]any{"exchange": name, "type": *typ, "durable": *durable},
			"exchange "+name+" ("+*typ+") declared")
	}
}

func bindCmd(bind bool) func(fs *flag.FlagSet) func(context.Context, *env, []string) error {
	action := "unbind"
	if bind {
		action = "bind"
	}
	return func(fs *flag.FlagSet) func(context.Context, *env, []string) error {
		return func(ctx context.Context, e *env, args []string) error {
			if len(args) != 2 && len(args) != 3 {
				return usageErrorf("%s needs EXCHANGE QUEUE [KEY], got %d arguments", action, len(args))
			}
			exchange, queue, key := args[0], args[1], ""
			if len(args) == 3 {
				key = args[2]
			}
			err := withBroker(ctx, e, func(c *client.Conn) error {
				if bind {
					return c.Bind(ctx, exchange, queue, key)
				}
				return c.Unbind(ctx, exchange, queue, key)
			})
			if err != nil {
				return err
			}
			verb := "bound to"
			if !bind {
				verb = "unbound from"
			}
			return done(e, action, map[string]any{"exchange": exchange, "queue": queue, "key": key},
				fmt.Sprintf("queue %s %s exchange %s with key %q", queue, verb, exchange, key))
		}
	}
}

func deleteQueueCmd(fs *flag.FlagSet) func(context.Context, *env, []string) error {
	ifUnused := fs.Bool("if-unused", false, "refuse if the queue has consumers")
	ifEmpty := fs.Bool("if-empty", false, "refuse if the queue holds messages")
	return func(ctx context.Context, e *env, args []string) error {
		name, err := oneName("queue NAME", args)
		if err != nil {
			return err
		}
		opts := client.QueueDeleteOptions{IfUnused: *ifUnused, IfEmpty: *ifEmpty}
		if err := withBroker(ctx, e, func(c *client.Conn) error { return c.DeleteQueue(ctx, name, opts) }); err != nil {
			return err
		}
		return done(e, "delete-queue", map[string]any{"queue": name}, "queue "+name+" deleted")
	}
}

func deleteExchangeCmd(fs *flag.FlagSet) func(context.Context, *env, []string) error {
	ifUnused := fs.Bool("if-unused", false, "refuse if the exchange has bindings")
	return func(ctx context.Context, e *env, args []string) error {
		name, err := oneName("exchange NAME", args)
		if err != nil {
			return err
		}
		opts := client.ExchangeDeleteOptions{IfUnused: *ifUnused}
		if err := withBroker(ctx, e, func(c *client.Conn) error { return c.DeleteExchange(ctx, name, opts) }); err != nil {
			return err
		}
		return done(e, "delete-exchange", map[string]any{"exchange": name}, "exchange "+name+" deleted")
	}
}

func purgeCmd(fs *flag.FlagSet) func(context.Context, *env, []string) error {
	return func(ctx context.Context, e *env, args []string) error {
		name, err := oneName("queue NAME", args)
		if err != nil {
			return err
		}
		if err := withBroker(ctx, e, func(c *client.Conn) error { return c.Purge(ctx, name) }); err != nil {
			return err
		}
		return done(e, "purge", map[string]any{"queue": name}, "queue "+name+" purged")
	}
}
