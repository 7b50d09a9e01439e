package journal

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// childDirEnv makes the test binary run killChild instead of the tests.
const childDirEnv = "BERTH_JOURNAL_KILL_CHILD_DIR"

// killChild plays a shard against the journal in dir until it is killed:
// it publishes messages, dequeues most of them, and prints a line for each
// publish ("P pos data") and dequeue ("D target") once its completion
// arrived without error. Bounded in count and time in case nobody kills it.
func killChild(dir string) {
	var refsOf = map[Pos]bool{}
	var plain []Pos
	j, err := Open(Options{Dir: dir, SegmentBytes: 64 << 10, Logger: quietLogger()}, func(pos, ref Pos, _ []byte) error {
		if ref != 0 {
			refsOf[ref] = true
		} else {
			plain = append(plain, pos)
		}
		return nil
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	for _, p := range plain {
		if refsOf[p] {
			j.Free(p) // the owner's view: dequeued before the crash
		}
	}
	var mu sync.Mutex
	results := map[Pos]error{}
	pendingCount := 0
	cond := sync.NewCond(&mu)
	done := func(pos Pos, err error) {
		mu.Lock()
		results[pos] = err
		pendingCount--
		cond.Broadcast()
		mu.Unlock()
	}
	wait := func() {
		mu.Lock()
		for pendingCount > 0 {
			cond.Wait()
		}
		mu.Unlock()
	}
	deadline := time.Now().Add(20 * time.Second)
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	for round := 0; round < 2000 && time.Now().Before(deadline); round++ {
		n := 50 + rng.IntN(300)
		ps := make([]Pos, 0, n)
		datas := make([]string, 0, n)
		mu.Lock()
		pendingCount += n
		mu.Unlock()
		for i := range n {
			d := fmt.Sprintf("m-%d-%d-%d", os.Getpid(), round, i)
			datas = append(datas, d)
			ps = append(ps, j.Append([]byte(d), done))
		}
		wait()
		var sb strings.Builder
		var live []Pos
		for i, p := range ps {
			if results[p] == nil {
				fmt.Fprintf(&sb, "P %d %s\n", p, datas[i])
				live = append(live, p)
			}
		}
		os.Stdout.WriteString(sb.String())
		refs := map[Pos]Pos{}
		mu.Lock()
		for _, p := range live {
			if rng.IntN(10) != 0 {
				pendingCount++
				mu.Unlock()
				refs[j.AppendRef([]byte("dequeue"), p, done)] = p
				mu.Lock()
			}
		}
		mu.Unlock()
		wait()
		// Report the dequeues before freeing: a free lets compaction delete
		// the message, and the parent must know why it is gone.
		sb.Reset()
		var dead []Pos
		for r, p := range refs {
			if results[r] == nil {
				fmt.Fprintf(&sb, "D %d\n", p)
				dead = append(dead, p)
			}
		}
		os.Stdout.WriteString(sb.String())
		for _, p := range dead {
			j.Free(p)
		}
		clear(results)
	}
	j.Close()
}

// TestKillDuringLoad runs killChild in a separate process, kills it with
// SIGKILL at a random moment, reopens the journal and checks: every
// completed publish whose dequeue did not complete is replayed with its
// data, no completed dequeue is lost while its message is replayed, no ref
// comes without its target, positions increase. Then again, on the same
// directory. BERTH_JOURNAL_LONG=1 runs 20 rounds instead of 3.
func TestKillDuringLoad(t *testing.T) {
	rounds := 3
	if os.Getenv("BERTH_JOURNAL_LONG") != "" {
		rounds = 20
	}
	dir := t.TempDir()
	published := map[Pos]string{}
	dequeued := map[Pos]bool{}
	for round := range rounds {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), childDirEnv+"="+dir)
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		var stderr strings.Builder
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		var lines []string
		readDone := make(chan struct{})
		go func() {
			defer close(readDone)
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				lines = append(lines, sc.Text())
			}
		}()
		time.Sleep(time.Duration(100+rand.IntN(400)) * time.Millisecond)
		cmd.Process.Kill()
		<-readDone
		cmd.Wait()
		if strings.TrimSpace(stderr.String()) != "" {
			t.Fatalf("child: %s", stderr.String())
		}
		for _, l := range lines {
			f := strings.Fields(l)
			if len(f) < 2 {
				continue // the last line may be cut by the kill
			}
			p, err := strconv.ParseUint(f[1], 10, 64)
			if err != nil {
				continue
			}
			switch {
			case f[0] == "P" && len(f) == 3:
				published[Pos(p)] = f[2]
			case f[0] == "D":
				dequeued[Pos(p)] = true
			}
		}

		j, got := openT(t, Options{Dir: dir, SegmentBytes: 64 << 10})
		present := map[Pos]string{}
		refd := map[Pos]bool{}
		var last Pos
		for _, r := range got {
			if r.pos <= last {
				t.Fatalf("round %d: position %d after %d", round, r.pos, last)
			}
			last = r.pos
			if r.ref != 0 {
				if _, ok := present[r.ref]; !ok {
					t.Fatalf("round %d: ref %d without target %d", round, r.pos, r.ref)
				}
				refd[r.ref] = true
				continue
			}
			present[r.pos] = r.data
		}
		for p, data := range published {
			got, ok := present[p]
			switch {
			case dequeued[p] && ok && !refd[p]:
				t.Fatalf("round %d: message %d resurrected", round, p)
			case !dequeued[p] && !ok:
				t.Fatalf("round %d: completed publish %d lost", round, p)
			case ok && got != data:
				t.Fatalf("round %d: message %d is %q, want %q", round, p, got, data)
			}
		}
		// A dequeue found on disk is durable even if the child died before
		// reporting it; the next child frees its message on replay.
		for p := range refd {
			dequeued[p] = true
		}
		checkInvariants(t, j)
		st := j.Stats()
		if err := j.Close(); err != nil {
			t.Fatal(err)
		}
		t.Logf("round %d: %d lines from the child, %d published, %d dequeued in all, %d records replayed, %d bytes dropped, %d sources finished",
			round, len(lines), len(published), len(dequeued), len(got), st.DroppedBytes, st.SourcesFinished)
	}
	if len(published) == 0 {
		t.Fatal("the child never completed a publish")
	}
}
