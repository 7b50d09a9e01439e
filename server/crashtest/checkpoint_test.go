package crashtest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berthmq/berth/internal/testutil"
)

// TestKill9DuringCheckpoint kills a real berthd with SIGKILL while it is
// writing a checkpoint of its durable queues (the moment its
// checkpoint.tmp exists), under the load of TestKill9Durability, restarts
// it and checks the same guarantees: every completed publish is there
// once unless accepted, no completed accept comes back, order holds. The
// first kill comes during the first checkpoint; later ones while an
// older checkpoint exists, so the restart reads that one and a longer
// tail, next to the torn temporary file.
func TestKill9DuringCheckpoint(t *testing.T) {
	dataDir, logPath := t.TempDir(), filepath.Join(t.TempDir(), "berthd.log")
	logOnFailure(t, logPath)
	addr := testutil.FreeAddr(t)
	led := &ledger{sent: map[string]bool{}, completed: map[string]bool{}, accepted: map[string]bool{}, acceptSent: map[string]bool{}}
	nextSeq := make([]int, producers)
	start := func() *broker {
		// One shard: its journal takes every record, so checkpoints come
		// every 2,000 records (or every tick after that many).
		p := testutil.StartBerthd(t, logPath, "-listen", addr, "-admin", "", "-data", dataDir, "-shards", "1", "-loops", "2",
			"-fsync", "always", "-controller", "127.0.0.1:0", "-log-level", "info", "-journal-checkpoint-records", "2000")
		p.WaitPort(t, addr, 10*time.Second)
		return &broker{proc: p, addr: addr}
	}
	tmp := filepath.Join(dataDir, "shard-000", "checkpoint.tmp")
	final := filepath.Join(dataDir, "shard-000", "checkpoint")
	exists := func(p string) bool { _, err := os.Stat(p); return err == nil }
	torn, withOld := 0, 0
	for round := 0; round < 6 && (torn < 3 || withOld == 0); round++ {
		b := start()
		check(t, round, addr, led)
		killed := make(chan bool, 1)
		go func() {
			deadline := time.Now().Add(10 * time.Second)
			for time.Now().Before(deadline) {
				if exists(tmp) && (round == 0 || exists(final)) {
					b.kill()
					killed <- exists(tmp) // still there: the write was cut short
					return
				}
				time.Sleep(20 * time.Microsecond)
			}
			b.kill()
			killed <- false
		}()
		runLoad(t, addr, led, nextSeq, 12*time.Second)
		if <-killed {
			torn++
			if exists(final) {
				withOld++
			}
		}
		<-b.proc.Exited()
	}
	b := start()
	check(t, -1, b.addr, led)
	b.proc.Stop(t, os.Interrupt, 30*time.Second)
	if torn == 0 || withOld == 0 {
		t.Fatalf("%d kills during a checkpoint write, %d with an older checkpoint: the test proved nothing", torn, withOld)
	}
	log, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(log), "from_checkpoint=true") {
		t.Fatal("no restart recovered from a checkpoint")
	}
	led.mu.Lock()
	defer led.mu.Unlock()
	t.Logf("%d kills during a checkpoint write (%d next to an older checkpoint): %d sent, %d publishes completed, %d accepts completed",
		torn, withOld, len(led.sent), len(led.completed), len(led.accepted))
	if len(led.completed) == 0 || len(led.accepted) == 0 {
		t.Fatal("the load completed nothing: the test checked nothing")
	}
}
