// Command berthd runs a Berth broker. With no flags it runs a single node
// with embedded defaults: clients on 127.0.0.1:7400, admin HTTP on
// 127.0.0.1:7480.
package main

import (
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"syscall"

	"github.com/berthmq/berth/server"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func envOr(key, def string) string {
	if v, ok := os.LookupEnv(key); ok {
		return v
	}
	return def
}

func envInt(key string, def int) int {
	if v, ok := os.LookupEnv(key); ok {
		if n, err := strconv.Atoi(v); err == nil {
			return n
		}
	}
	return def
}

func run(args []string) int {
	d := server.DefaultConfig()
	fs := flag.NewFlagSet("berthd", flag.ContinueOnError)
	listen := fs.String("listen", envOr("BERTH_LISTEN", d.ClientAddr), "client listen address (env BERTH_LISTEN)")
	admin := fs.String("admin", envOr("BERTH_ADMIN", d.AdminAddr), "admin HTTP listen address, empty to disable (env BERTH_ADMIN)")
	dataDir := fs.String("data", envOr("BERTH_DATA", d.DataDir), "data directory (env BERTH_DATA)")
	shardCount := fs.Int("shards", envInt("BERTH_SHARDS", 0), "shard count, 0 = one per core (env BERTH_SHARDS)")
	loops := fs.Int("loops", envInt("BERTH_LOOPS", 0), "event loop count, 0 = one per core (env BERTH_LOOPS)")
	heartbeat := fs.Int("heartbeat-ms", envInt("BERTH_HEARTBEAT_MS", int(d.HeartbeatMs)), "default heartbeat interval in ms (env BERTH_HEARTBEAT_MS)")
	controller := fs.String("controller", envOr("BERTH_CONTROLLER", "127.0.0.1:7402"), "in-process controller address; durable wiring goes through it; empty to keep wiring in a local file (env BERTH_CONTROLLER)")
	fsync := fs.String("fsync", envOr("BERTH_FSYNC", d.Fsync), "journal fsync policy: always, or never (unsafe) (env BERTH_FSYNC)")
	segmentBytes := fs.Int64("journal-segment-bytes", int64(envInt("BERTH_JOURNAL_SEGMENT_BYTES", 0)), "journal segment size in bytes, 0 = default 2 MiB (env BERTH_JOURNAL_SEGMENT_BYTES)")
	mutexFraction := fs.Int("mutex-profile-fraction", envInt("BERTH_MUTEX_PROFILE_FRACTION", 0), "sample 1/n mutex contention events for /debug/pprof/mutex, 0 = off (env BERTH_MUTEX_PROFILE_FRACTION)")
	blockRate := fs.Int("block-profile-rate", envInt("BERTH_BLOCK_PROFILE_RATE", 0), "sample blocking events of this many ns for /debug/pprof/block, 0 = off (env BERTH_BLOCK_PROFILE_RATE)")
	logLevel := fs.String("log-level", envOr("BERTH_LOG_LEVEL", "info"), "debug, info, warn or error (env BERTH_LOG_LEVEL)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintln(os.Stderr, "berthd: bad -log-level:", err)
		return 2
	}
	runtime.SetMutexProfileFraction(*mutexFraction)
	runtime.SetBlockProfileRate(*blockRate)
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	cfg := d
	cfg.ClientAddr, cfg.AdminAddr, cfg.DataDir = *listen, *admin, *dataDir
	cfg.Shards, cfg.Loops, cfg.HeartbeatMs = *shardCount, *loops, uint32(*heartbeat)
	cfg.Logger = log
	cfg.Fsync = *fsync
	cfg.ControllerAddr = *controller
	cfg.JournalSegmentBytes = *segmentBytes
	srv, err := server.Start(cfg)
	if err != nil {
		log.Error("berthd: start failed", "err", err)
		return 1
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	sig := <-sigs
	log.Info("berthd: shutting down", "signal", sig.String())
	if err := srv.Close(); err != nil {
		log.Error("berthd: shutdown", "err", err)
		return 1
	}
	log.Info("berthd: stopped")
	return 0
}
