package clustertest

import (
	"context"
	"fmt"
	"math"
	"math/rand"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/berthmq/berth/controlplane/ctlapi"
	"github.com/berthmq/berth/controlplane/ctlclient"
	"github.com/berthmq/berth/internal/testutil"
)

// A register per key over the controller's cluster attributes.
type regInput struct {
	put   bool
	key   string
	value string
}

var regModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		for _, op := range history {
			k := op.Input.(regInput).key
			byKey[k] = append(byKey[k], op)
		}
		out := make([][]porcupine.Operation, 0, len(byKey))
		for _, ops := range byKey {
			out = append(out, ops)
		}
		return out
	},
	Init: func() any { return "" },
	Step: func(state, input, output any) (bool, any) {
		in := input.(regInput)
		if in.put {
			return true, in.value
		}
		return output.(string) == state.(string), state
	},
}

// TestLinearizableWithProcessKills runs three controller-only berthd
// processes while clients write and read attributes (leader reads by
// ReadIndex and follower reads) and a nemesis SIGKILLs a member and
// restarts it, or freezes one with SIGSTOP (a leader that wakes up after
// its followers moved on) and thaws it. Porcupine checks the history.
// BERTH_CLUSTER_SOAK (a Go duration) runs it longer than the default 3 s
// per mode. It runs once with ReadIndex reads and once with lease reads
// (-controller-lease-read), where a frozen leader that wakes up must not
// answer from a lease its followers have moved past.
func TestLinearizableWithProcessKills(t *testing.T) {
	testutil.Long(t, "the controller linearizable across process kills")
	for _, lease := range []bool{false, true} {
		t.Run(fmt.Sprintf("lease=%v", lease), func(t *testing.T) { testLinearizableProcesses(t, lease) })
	}
}

func testLinearizableProcesses(t *testing.T, lease bool) {
	duration := 3 * time.Second
	if v := os.Getenv("BERTH_CLUSTER_SOAK"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("bad BERTH_CLUSTER_SOAK %q: %v", v, err)
		}
		duration = d
	}
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	var nodes []*node
	if lease {
		nodes = startGroupArgs(t, []string{"-controller-lease-read"}, "controller", "controller", "controller")
	} else {
		nodes = startGroup(t, "controller", "controller", "controller")
	}
	addrs := make([]string, len(nodes))
	for i, n := range nodes {
		addrs[i] = n.ctl
	}
	{
		cl := ctlclient.NewClient(addrs)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		if err := cl.SetAttribute(ctx, "a", "init"); err != nil {
			t.Fatalf("no leader: %v", err)
		}
		cancel()
		cl.Close()
	}

	start := time.Now()
	now := func() int64 { return int64(time.Since(start)) }
	var mu sync.Mutex
	var ops []porcupine.Operation
	record := func(op porcupine.Operation) {
		mu.Lock()
		ops = append(ops, op)
		mu.Unlock()
	}
	// The initial put, so every key's register starts where the history does.
	record(porcupine.Operation{ClientId: 99, Input: regInput{put: true, key: "a", value: "init"}, Call: 0, Output: "", Return: 0})

	var succeeded atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	keys := []string{"a", "b", "c"}
	for ci := 0; ci < 4; ci++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewSource(seed + int64(ci)))
			cl := ctlclient.NewClient(addrs)
			defer cl.Close()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key := keys[r.Intn(len(keys))]
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				if r.Intn(5) < 2 {
					val := fmt.Sprintf("%d.%d", ci, i)
					call := now()
					err := cl.SetAttribute(ctx, key, val)
					ret := now()
					if err != nil {
						ret = math.MaxInt64 // outcome unknown: it may apply any time later
					} else {
						succeeded.Add(1)
					}
					record(porcupine.Operation{ClientId: ci, Input: regInput{put: true, key: key, value: val}, Call: call, Output: "", Return: ret})
				} else {
					mode := []ctlapi.ReadMode{ctlapi.ReadConsistent, ctlapi.ReadFollower}[r.Intn(2)]
					call := now()
					v, _, err := cl.GetAttribute(ctx, mode, key)
					ret := now()
					if err == nil {
						succeeded.Add(1)
						record(porcupine.Operation{ClientId: ci, Input: regInput{key: key}, Call: call, Output: v, Return: ret})
					}
				}
				cancel()
			}
		}()
	}

	// The nemesis: one fault at a time.
	r := rand.New(rand.NewSource(seed))
	deadline := time.Now().Add(duration)
	var killed, frozen *node
	faults := 0
	for time.Now().Before(deadline) {
		time.Sleep(time.Duration(200+r.Intn(300)) * time.Millisecond)
		switch {
		case killed != nil:
			killed.start(t)
			killed = nil
		case frozen != nil:
			frozen.signal(syscall.SIGCONT)
			frozen = nil
		case r.Intn(2) == 0:
			killed = nodes[r.Intn(len(nodes))]
			killed.stop(t, syscall.SIGKILL)
			faults++
		default:
			frozen = nodes[r.Intn(len(nodes))]
			frozen.signal(syscall.SIGSTOP)
			faults++
		}
	}
	if killed != nil {
		killed.start(t)
	}
	if frozen != nil {
		frozen.signal(syscall.SIGCONT)
	}
	// A little traffic on the healed group, so the history ends with
	// completed operations.
	time.Sleep(500 * time.Millisecond)
	close(stop)
	wg.Wait()

	if n := succeeded.Load(); n < 50 {
		t.Fatalf("only %d operations succeeded; the test exercised little", n)
	}
	t.Logf("%d faults, %d operations recorded, %d succeeded", faults, len(ops), succeeded.Load())
	res, info := porcupine.CheckOperationsVerbose(regModel, ops, 30*time.Second)
	switch res {
	case porcupine.Illegal:
		path := t.TempDir() + "/history.html"
		_ = porcupine.VisualizePath(regModel, info, path)
		t.Fatalf("history is not linearizable (seed %d); visualization at %s", seed, path)
	case porcupine.Unknown:
		t.Logf("linearizability check timed out (seed %d); history too large to decide", seed)
	}
}

// TestRegModelRejectsStaleRead proves the checker above can fail.
func TestRegModelRejectsStaleRead(t *testing.T) {
	h := []porcupine.Operation{
		{ClientId: 0, Input: regInput{put: true, key: "k", value: "1"}, Call: 0, Output: "", Return: 10},
		{ClientId: 1, Input: regInput{key: "k"}, Call: 20, Output: "", Return: 30},
	}
	if porcupine.CheckOperations(regModel, h) {
		t.Fatal("a read after a completed write that misses it was accepted")
	}
	h[1].Output = "1"
	if !porcupine.CheckOperations(regModel, h) {
		t.Fatal("a correct history was rejected")
	}
}
