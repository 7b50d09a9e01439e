package clustertest

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/berthmq/berth/client"
	"github.com/berthmq/berth/internal/testutil"
)

// TestReplacedMasterDeliversNothing (issue 25, item 1): a group's master
// frozen past the controller's broker timeout is replaced, and the new
// master's consumer takes and accepts part of the backlog; when the old
// master wakes it still believes it is master until it hears of the new
// epoch, and the accepts and credit its own consumer sent while it was
// frozen are waiting in its socket. Before the masters' lease, it handed
// that consumer, from the copy of the queue it held, messages whose
// accepts had completed at the new master (guarantee 3). Each round
// freezes the master of the round; no delivery of an accepted message
// may happen in any.
func TestReplacedMasterDeliversNothing(t *testing.T) {
	testutil.Long(t, "a replaced master delivers nothing")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c := startReplicatedWith(t, ctx, 1, 3, 3)
	const queue = "stale-master"
	g, _, _, conn := c.declare(queue, 1)
	conn.Close()
	c.declareEverywhere(queue)

	var mu sync.Mutex
	accepted := map[string]bool{}
	var back []string
	var deliveries, acceptedN int
	seen := func(who string, d *client.Delivery) {
		mu.Lock()
		defer mu.Unlock()
		deliveries++
		if accepted[string(d.Payload)] {
			back = append(back, fmt.Sprintf("%s to %s (redelivered %v)", d.Payload, who, d.Redelivered))
		}
	}
	accept := func(d *client.Delivery) {
		actx, acancel := context.WithTimeout(ctx, 10*time.Second)
		defer acancel()
		if d.Accept(actx) == nil {
			mu.Lock()
			accepted[string(d.Payload)] = true
			acceptedN++
			mu.Unlock()
		}
	}

	const rounds, backlog = 3, 1500
	for r := range rounds {
		master, mnode := c.waitServing(g)
		// A backlog at the master.
		pc := dial(t, ctx, mnode.client)
		var pwg sync.WaitGroup
		sem := make(chan struct{}, 64)
		for i := range backlog {
			sem <- struct{}{}
			pwg.Add(1)
			err := pc.PublishAsync(ctx, "", queue, []byte(fmt.Sprintf("r%d-%05d", r, i)), client.PublishOptions{Persistent: true}, func(err error) {
				<-sem
				pwg.Done()
				if err != nil {
					t.Errorf("publish: %v", err)
				}
			})
			if err != nil {
				t.Fatal(err)
			}
		}
		pwg.Wait()
		pc.Close()

		// A slow consumer on the master itself, accepting without
		// waiting for the answers, so its accepts and credit go on
		// while the master is frozen.
		xc := dial(t, ctx, mnode.client)
		xcon, err := xc.Subscribe(ctx, queue, client.SubscribeOptions{Credit: 16, AutoCredit: true})
		if err != nil {
			t.Fatal(err)
		}
		xctx, xstop := context.WithCancel(ctx)
		var xwg sync.WaitGroup
		var xgot sync.WaitGroup
		xgot.Add(1)
		xwg.Add(1)
		go func() {
			defer xwg.Done()
			n := 0
			for {
				d, err := xcon.Next(xctx)
				if err != nil {
					if n < 32 {
						xgot.Done()
					}
					return
				}
				seen(fmt.Sprintf("the old master %s's consumer", mnode.name), d)
				if n++; n == 32 {
					xgot.Done()
				}
				time.Sleep(5 * time.Millisecond)
				xwg.Add(1)
				go func() { defer xwg.Done(); accept(d) }()
			}
		}()
		xgot.Wait()

		mnode.signal(syscall.SIGSTOP)
		newMaster, _ := c.newMasterWithin(g, master, 20*time.Second, "the master is frozen")
		nnode := c.nodeOf(newMaster)
		// The new master's consumer takes and accepts 400 messages.
		yc := dial(t, ctx, nnode.client)
		var ycon *client.Consumer
		testutil.WaitFor(t, 20*time.Second, func() error {
			var err error
			ycon, err = yc.Subscribe(ctx, queue, client.SubscribeOptions{Credit: 100, AutoCredit: true})
			return err
		})
		for range 400 {
			nctx, ncancel := context.WithTimeout(ctx, 20*time.Second)
			d, err := ycon.Next(nctx)
			ncancel()
			if err != nil {
				mnode.signal(syscall.SIGCONT)
				t.Fatalf("round %d: the new master %s's consumer: %v", r, nnode.name, err)
			}
			seen(fmt.Sprintf("the new master %s's consumer", nnode.name), d)
			accept(d)
		}
		mnode.signal(syscall.SIGCONT)
		// The old master wakes with its consumer's accepts and credit
		// waiting; what it hands out now must not be what was accepted.
		time.Sleep(2 * time.Second)
		xstop()
		xc.Close()
		xwg.Wait()
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		_ = ycon.Cancel(cctx)
		ccancel()
		yc.Close()
		mu.Lock()
		t.Logf("round %d: froze %s (broker %d), %s (broker %d) took over; %d deliveries, %d accepted, %d accepted messages delivered again so far",
			r, mnode.name, master, nnode.name, newMaster, deliveries, acceptedN, len(back))
		mu.Unlock()
	}
	mu.Lock()
	defer mu.Unlock()
	for i, b := range back {
		if i < 10 {
			t.Errorf("delivered again after its accept completed: %s", b)
		}
	}
	if len(back) > 0 {
		t.Errorf("%d deliveries of messages whose accept had completed", len(back))
	}
}
