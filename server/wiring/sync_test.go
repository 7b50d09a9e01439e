package wiring

import (
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/berthmq/berth/shards"
)

// TestSyncBringsInAndDrops: Sync adds the exchanges, queues and bindings
// of the controller's wiring this broker lacks, drops the durable ones it
// has that the controller no longer holds, and leaves its transient and
// exclusive queues alone.
func TestSyncBringsInAndDrops(t *testing.T) {
	w := startWiring(t, newGateLog())
	if _, err := w.DeclareQueue("mine", shards.QueueOptions{Durable: true}, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := w.DeclareQueue("transient", shards.QueueOptions{}, false, nil); err != nil {
		t.Fatal(err)
	}
	owner := &shards.Session{}
	if _, err := w.DeclareQueue("excl", shards.QueueOptions{Durable: true, Exclusive: true}, false, owner); err != nil {
		t.Fatal(err)
	}
	durable := ExchangeOptions{Durable: true}
	snap := &Snapshot{
		Exchanges: []WiringExchange{{Name: "x", Kind: KindDirect, Options: durable}},
		Queues:    []WiringQueue{{Name: "mine", Options: shards.QueueOptions{Durable: true}}, {Name: "other", Options: shards.QueueOptions{Durable: true}}},
		Bindings:  []Binding{{Exchange: "x", Queue: "other", Key: "k"}},
	}
	st, err := w.Sync(w.SyncToken(), snap)
	if err != nil {
		t.Fatal(err)
	}
	if st.ExchangesAdded != 1 || st.QueuesAdded != 1 || st.BindingsAdded != 1 || st.Changed() != 3 {
		t.Fatalf("first sync: %+v", st)
	}
	got, err := w.Routing().Route([]byte("x"), []byte("k"), nil)
	if err != nil || len(got) != 1 || got[0].Name != "other" {
		t.Fatalf("x/k routes to %v (%v), want the queue other", got, err)
	}
	// Again: nothing to do.
	if st, err := w.Sync(w.SyncToken(), snap); err != nil || st.Changed() != 0 {
		t.Fatalf("second sync: %+v, %v", st, err)
	}
	// The controller dropped the binding.
	snap.Bindings = nil
	st, err = w.Sync(w.SyncToken(), snap)
	if err != nil || st.BindingsRemoved != 1 || st.Changed() != 1 {
		t.Fatalf("unbind sync: %+v, %v", st, err)
	}
	if got, _ := w.Routing().Route([]byte("x"), []byte("k"), nil); len(got) != 0 {
		t.Fatalf("x/k still routes to %v", got)
	}
	// Then the queue other and x.
	snap = &Snapshot{Queues: []WiringQueue{{Name: "mine", Options: shards.QueueOptions{Durable: true}}}}
	st, err = w.Sync(w.SyncToken(), snap)
	if err != nil {
		t.Fatal(err)
	}
	if st.QueuesRemoved != 1 || st.ExchangesRemoved != 1 || st.Changed() != 2 {
		t.Fatalf("delete sync: %+v", st)
	}
	r := w.Routing()
	if r.queue("other") != nil || r.exchange("x") != nil {
		t.Fatal("other or x survived the sync")
	}
	for _, name := range []string{"mine", "transient", "excl"} {
		if r.queue(name) == nil {
			t.Fatalf("queue %s dropped", name)
		}
	}
	// A queue of the same name with other options is left as it is: a
	// pass never drops a copy for its options.
	snap = &Snapshot{Queues: []WiringQueue{{Name: "mine", Options: shards.QueueOptions{Durable: true, MaxLength: 7}}}}
	st, err = w.Sync(w.SyncToken(), snap)
	if err != nil || st.Changed() != 0 {
		t.Fatalf("options sync: %+v, %v", st, err)
	}
	if q := w.Routing().queue("mine"); q == nil || q.Options.MaxLength != 0 {
		t.Fatalf("mine was replaced: %+v", q)
	}
	// A queue Droppable refuses stays when the controller drops it.
	w.cfg.Droppable = func(q *shards.Queue) bool { return q.Name != "mine" }
	st, err = w.Sync(w.SyncToken(), &Snapshot{})
	if err != nil || st.Changed() != 0 || w.Routing().queue("mine") == nil {
		t.Fatalf("a queue Droppable refuses: %+v, %v", st, err)
	}
}

// TestSyncRacedByLocalChange: a snapshot read before this broker
// committed a change of its own is stale; Sync must not undo the change.
func TestSyncRacedByLocalChange(t *testing.T) {
	w := startWiring(t, newGateLog())
	token := w.SyncToken()
	stale := &Snapshot{} // read before the declare below committed
	if _, err := w.DeclareQueue("late", shards.QueueOptions{Durable: true}, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Sync(token, stale); !errors.Is(err, ErrSyncRaced) {
		t.Fatalf("sync with a stale snapshot: %v, want ErrSyncRaced", err)
	}
	if w.Routing().queue("late") == nil {
		t.Fatal("a stale snapshot dropped a queue this broker had just declared")
	}
	// Read again after the change: it is there, and stays.
	fresh := &Snapshot{Queues: []WiringQueue{{Name: "late", Options: shards.QueueOptions{Durable: true}}}}
	if st, err := w.Sync(w.SyncToken(), fresh); err != nil || st.Changed() != 0 {
		t.Fatalf("fresh sync: %+v, %v", st, err)
	}
}

// TestSyncAsksSyncableOnlyOutsideOwnDeclares: a pass that finds in the
// controller's wiring a queue whose declare is in flight here (its round
// committed, the queue not on this broker yet) does not ask Syncable of
// it, which writes a refused queue down as another broker's: it waits
// for the declare's name and then sees the local change (ErrSyncRaced).
// It used to ask first, so a broker's own queue declared before "cluster
// init" could land on its list of foreign queues and be left out at its
// next start, its messages dropped.
func TestSyncAsksSyncableOnlyOutsideOwnDeclares(t *testing.T) {
	g := newGateLog()
	release := make(chan struct{})
	g.held["mine"] = release
	var asked []string
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	b := shards.New(shards.Config{Shards: 1, Logger: logger})
	w := New(Config{Broker: b, Log: g, Logger: logger, Dir: t.TempDir(),
		Syncable: func(name string, _ shards.QueueOptions) bool { asked = append(asked, name); return false }})
	if err := b.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Stop)
	if err := w.Restore(); err != nil {
		t.Fatal(err)
	}
	token := w.SyncToken()
	declared := make(chan error, 1)
	go func() {
		_, err := w.DeclareQueue("mine", shards.QueueOptions{Durable: true}, false, nil)
		declared <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for w.names[stripe("mine")].TryLock() {
		w.names[stripe("mine")].Unlock()
		if time.Now().After(deadline) {
			t.Fatal("the declare never started")
		}
		time.Sleep(time.Millisecond)
	}
	synced := make(chan error, 1)
	go func() {
		_, err := w.Sync(token, &Snapshot{Queues: []WiringQueue{{Name: "mine", Options: shards.QueueOptions{Durable: true}}}})
		synced <- err
	}()
	time.Sleep(50 * time.Millisecond) // let the pass reach the queue
	close(release)
	if err := <-declared; err != nil {
		t.Fatal(err)
	}
	if err := <-synced; !errors.Is(err, ErrSyncRaced) {
		t.Fatalf("sync during the declare: %v, want ErrSyncRaced", err)
	}
	if len(asked) != 0 {
		t.Fatalf("Syncable asked of %v while this broker declared it", asked)
	}
}
