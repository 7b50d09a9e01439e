package wiring

import (
	"fmt"
	"math/rand"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthmq/berth/shards"
)

// refWiring is the naive router the model test holds the wiring to: sets
// of names and bindings, and a scan of every binding per route with the
// backtracking matcher (refTopicMatch).
type refWiring struct {
	queues    map[string]bool
	exchanges map[string]uint8
	bindings  map[Binding]bool
}

func (r *refWiring) route(exchange, key string) []string {
	if exchange == "" {
		if r.queues[key] {
			return []string{key}
		}
		return nil
	}
	kind, ok := r.exchanges[exchange]
	if !ok {
		return nil
	}
	var out []string
	for b := range r.bindings {
		if b.Exchange != exchange || slices.Contains(out, b.Queue) {
			continue
		}
		if kind == KindFanout || (kind == KindDirect && b.Key == key) || (kind == KindTopic && refTopicMatch(b.Key, key)) {
			out = append(out, b.Queue)
		}
	}
	slices.Sort(out)
	return out
}

// routeNames routes through r and returns the queue names sorted; it fails
// the test if a queue comes out twice.
func routeNames(t *testing.T, r *Routing, exchange, key string) []string {
	t.Helper()
	qs, _ := r.Route([]byte(exchange), []byte(key), nil)
	var out []string
	for _, q := range qs {
		if slices.Contains(out, q.Name) {
			t.Fatalf("route %s %q: queue %s twice", exchange, key, q.Name)
		}
		out = append(out, q.Name)
	}
	slices.Sort(out)
	return out
}

// TestWiringModel runs random declares, deletes, binds and unbinds on the
// wiring and on refWiring, and after every step compares the routes of
// random keys (with empty words) on every exchange. It also keeps the
// snapshot of every 50th step and checks at the end that later changes
// left it routing as it did: snapshots are never changed once published.
//
// The "many" run binds up to 160 queues by few keys, so that a fanout's,
// a direct key's and a trie node's lists grow past queueSetSliceMax (64
// for the run) into their pmap form and shrink back; it fails unless
// both happened.
func TestWiringModel(t *testing.T) {
	t.Run("few", func(t *testing.T) { testWiringModel(t, 8, []string{"a", "b", "", "ab"}, 5) })
	t.Run("many", func(t *testing.T) {
		defer func(max, min int) { queueSetSliceMax, queueSetSliceMin = max, min }(queueSetSliceMax, queueSetSliceMin)
		queueSetSliceMax, queueSetSliceMin = 64, 32
		testWiringModel(t, 160, []string{"a", "b", ""}, 2)
	})
}

func testWiringModel(t *testing.T, nQueues int, words []string, maxWords int) {
	many := nQueues > queueSetSliceMax
	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewSource(seed))
	w := startWiring(t, nil)
	ref := &refWiring{queues: map[string]bool{}, exchanges: map[string]uint8{}, bindings: map[Binding]bool{}}
	randWords := func(pattern bool) string {
		ws := make([]string, 1+rng.Intn(maxWords))
		for i := range ws {
			switch r := rng.Intn(6); {
			case pattern && r == 0:
				ws[i] = "#"
			case pattern && r == 1:
				ws[i] = "*"
			default:
				ws[i] = words[rng.Intn(len(words))]
			}
		}
		return strings.Join(ws, ".")
	}
	queueNames := []string{"q0", "q1", "q2", "q3", "q4", "q5", "a", "b"}
	for i := len(queueNames); i < nQueues; i++ {
		queueNames = append(queueNames, fmt.Sprintf("q%d", i))
	}
	queueNames = queueNames[:nQueues]
	var grew, shrank int // a list's form changed to a pmap, back to a slice
	big := map[string]bool{}
	watchForms := func(r *Routing) {
		forms := map[string]bool{}
		r.exchanges.All(func(name string, ex *exchange) bool {
			name = fmt.Sprint(name, ex.gen) // a new exchange's lists are new
			forms[name+"/fanout"] = ex.fanout.big != nil
			ex.direct.All(func(key string, qs queueSet) bool {
				forms[name+"/direct/"+key] = qs.big != nil
				return true
			})
			var walk func(n *tnode, path string)
			walk = func(n *tnode, path string) {
				if n == nil {
					return
				}
				forms[name+"/topic/"+path] = n.queues.big != nil
				n.words.All(func(w string, c *tnode) bool { walk(c, path+"."+w); return true })
				walk(n.star, path+".*")
				walk(n.hash, path+".#")
			}
			walk(ex.topic, "")
			return true
		})
		for k, isBig := range forms {
			if isBig && !big[k] {
				grew++
			}
			if !isBig && big[k] {
				shrank++
			}
		}
		big = map[string]bool{}
		for k, isBig := range forms {
			if isBig {
				big[k] = true
			}
		}
	}
	exchanges := []struct {
		name string
		kind uint8
	}{{"d", KindDirect}, {"f", KindFanout}, {"t1", KindTopic}, {"t2", KindTopic}}
	type kept struct {
		r      *Routing
		routes map[string][]string
	}
	var keptSnaps []kept
	if many {
		for _, q := range queueNames {
			if _, err := w.DeclareQueue(q, shards.QueueOptions{}, false, nil); err != nil {
				t.Fatal(err)
			}
			ref.queues[q] = true
		}
		for _, x := range exchanges {
			if err := w.DeclareExchange(x.name, x.kind, ExchangeOptions{}, false); err != nil {
				t.Fatal(err)
			}
			ref.exchanges[x.name] = x.kind
		}
	}
	steps := 3000
	if testing.Short() {
		steps = 600
	}
	if many {
		steps = 4800
	}
	routed := 0
	for step := range steps {
		var op string
		kind := rng.Intn(10)
		if many {
			// Phases of mostly binds and mostly unbinds, so that lists
			// cross queueSetSliceMax up and queueSetSliceMin down.
			if r := rng.Intn(100); r < 85 && (step/600)%2 == 0 {
				kind = 5
			} else if r < 85 {
				kind = 9
			}
		}
		switch kind {
		case 0, 1:
			q := queueNames[rng.Intn(len(queueNames))]
			op = "declare queue " + q
			if _, err := w.DeclareQueue(q, shards.QueueOptions{}, false, nil); err != nil {
				t.Fatalf("seed %d step %d: %s: %v", seed, step, op, err)
			}
			ref.queues[q] = true
		case 2:
			q := queueNames[rng.Intn(len(queueNames))]
			op = "delete queue " + q
			_, err := w.DeleteQueue(q, false, false)
			if (err == nil) != ref.queues[q] {
				t.Fatalf("seed %d step %d: %s: %v, ref has it: %v", seed, step, op, err, ref.queues[q])
			}
			delete(ref.queues, q)
			for b := range ref.bindings {
				if b.Queue == q {
					delete(ref.bindings, b)
				}
			}
		case 3:
			x := exchanges[rng.Intn(len(exchanges))]
			op = "declare exchange " + x.name
			if err := w.DeclareExchange(x.name, x.kind, ExchangeOptions{}, false); err != nil {
				t.Fatalf("seed %d step %d: %s: %v", seed, step, op, err)
			}
			ref.exchanges[x.name] = x.kind
		case 4:
			if rng.Intn(4) != 0 || (many && rng.Intn(10) != 0) {
				continue // exchanges go rarely, so bindings pile up
			}
			x := exchanges[rng.Intn(len(exchanges))]
			op = "delete exchange " + x.name
			err := w.DeleteExchange(x.name, false)
			if _, ok := ref.exchanges[x.name]; (err == nil) != ok {
				t.Fatalf("seed %d step %d: %s: %v, ref has it: %v", seed, step, op, err, ok)
			}
			delete(ref.exchanges, x.name)
			for b := range ref.bindings {
				if b.Exchange == x.name {
					delete(ref.bindings, b)
				}
			}
		case 5, 6, 7:
			x := exchanges[rng.Intn(len(exchanges))]
			b := Binding{Exchange: x.name, Queue: queueNames[rng.Intn(len(queueNames))], Key: randWords(true)}
			if many && rng.Intn(2) == 0 {
				b.Key = "a" // long lists on a direct key and a trie node
			}
			op = fmt.Sprintf("bind %+v", b)
			err := w.Bind(b.Exchange, b.Queue, b.Key)
			_, exOK := ref.exchanges[b.Exchange]
			if (err == nil) != (exOK && ref.queues[b.Queue]) {
				t.Fatalf("seed %d step %d: %s: %v", seed, step, op, err)
			}
			if err == nil {
				ref.bindings[b] = true
			}
		default:
			// Unbind an existing binding mostly, sometimes a missing one.
			var b Binding
			for x := range ref.bindings {
				b = x
				break
			}
			if b == (Binding{}) || rng.Intn(5) == 0 {
				b = Binding{Exchange: "t1", Queue: "q0", Key: randWords(true)}
			}
			op = fmt.Sprintf("unbind %+v", b)
			err := w.Unbind(b.Exchange, b.Queue, b.Key)
			if (err == nil) != ref.bindings[b] {
				t.Fatalf("seed %d step %d: %s: %v, ref has it: %v", seed, step, op, err, ref.bindings[b])
			}
			delete(ref.bindings, b)
		}
		r := w.Routing()
		if nQueues > queueSetSliceMax {
			watchForms(r)
		}
		routes := map[string][]string{}
		keys := 8
		if many {
			keys = 2
		}
		for range keys {
			key := randWords(false)
			for _, x := range append(exchanges, struct {
				name string
				kind uint8
			}{"", 0}) {
				got, want := routeNames(t, r, x.name, key), ref.route(x.name, key)
				if !slices.Equal(got, want) {
					t.Fatalf("seed %d step %d after %s: route %s %q = %v, reference says %v", seed, step, op, x.name, key, got, want)
				}
				routes[x.name+"\x00"+key] = got
				if len(got) > 0 {
					routed++
				}
			}
		}
		if step%50 == 0 {
			keptSnaps = append(keptSnaps, kept{r, routes})
		}
	}
	if routed < steps {
		t.Fatalf("seed %d: only %d non-empty routes in %d steps: the comparison says little", seed, routed, steps)
	}
	if nQueues > queueSetSliceMax && (grew == 0 || shrank == 0) {
		t.Fatalf("seed %d: lists grew to a pmap %d times and shrank to a slice %d times: the comparison says little", seed, grew, shrank)
	}
	t.Logf("seed %d: lists grew to a pmap %d times, shrank to a slice %d times", seed, grew, shrank)
	for i, k := range keptSnaps {
		for xk, want := range k.routes {
			x, key, _ := strings.Cut(xk, "\x00")
			if got := routeNames(t, k.r, x, key); !slices.Equal(got, want) {
				t.Fatalf("seed %d: snapshot %d changed after publication: route %s %q = %v, was %v", seed, i, x, key, got, want)
			}
		}
	}
}

// TestRouteDuringChanges routes from several goroutines while another binds
// queues q0..q(n-1) to a topic exchange in order and then unbinds them in
// the same order. Every route must see the bindings of a prefix of the
// changes: q0..q(m-1) while binding, q(m)..q(n-1) while unbinding, never a
// set that no snapshot had. Run it with -race.
func TestRouteDuringChanges(t *testing.T) {
	w := startWiring(t, nil)
	if err := w.DeclareExchange("t", KindTopic, ExchangeOptions{}, false); err != nil {
		t.Fatal(err)
	}
	const n = 64
	index := map[*shards.Queue]int{}
	for i := range n {
		q, err := w.DeclareQueue(fmt.Sprintf("q%02d", i), shards.QueueOptions{}, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		index[q] = i
	}
	patterns := []string{"a.#", "*.b", "#", "a.b"} // all match "a.b"
	var stop atomic.Bool
	var bad atomic.Pointer[string]
	var seen atomic.Int64
	var wg sync.WaitGroup
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dst := make([]*shards.Queue, 0, n)
			for !stop.Load() {
				dst, _ = w.Route([]byte("t"), []byte("a.b"), dst[:0])
				idx := make([]int, 0, len(dst))
				for _, q := range dst {
					idx = append(idx, index[q])
				}
				slices.Sort(idx)
				// A contiguous run that starts at 0 (binding) or ends at n-1
				// (unbinding), with no repeats.
				ok := true
				for j := 1; j < len(idx); j++ {
					ok = ok && idx[j] == idx[j-1]+1
				}
				if len(idx) > 0 && idx[0] != 0 && idx[len(idx)-1] != n-1 {
					ok = false
				}
				if !ok {
					msg := fmt.Sprint("torn route: ", idx)
					bad.CompareAndSwap(nil, &msg)
					return
				}
				seen.Add(1)
			}
		}()
	}
	// The routers run before the changes start: on a loaded machine the
	// changes could otherwise all finish before any router was scheduled.
	for deadline := time.Now().Add(10 * time.Second); seen.Load() == 0 && bad.Load() == nil; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no router ran within 10 s")
		}
	}
	for round := range 5 {
		for i := range n {
			if err := w.Bind("t", fmt.Sprintf("q%02d", i), patterns[(i+round)%len(patterns)]); err != nil {
				t.Fatal(err)
			}
		}
		for i := range n {
			if err := w.Unbind("t", fmt.Sprintf("q%02d", i), patterns[(i+round)%len(patterns)]); err != nil {
				t.Fatal(err)
			}
		}
	}
	stop.Store(true)
	wg.Wait()
	if p := bad.Load(); p != nil {
		t.Fatal(*p)
	}
	if seen.Load() == 0 {
		t.Fatal("no route ran during the changes")
	}
}

// TestRestoreModel restores a random wiring of many bindings, which
// Restore adds in one batch that grows its tables in place (pmapEdit),
// and compares the routes of random keys with refWiring's. It then binds
// and unbinds more on the restored wiring, one change at a time, checks
// the routes again, and checks that the snapshot Restore published still
// routes as it did: the batch's nodes are never changed after it.
func TestRestoreModel(t *testing.T) {
	// Long lists take their pmap form in the batch too.
	defer func(max, min int) { queueSetSliceMax, queueSetSliceMin = max, min }(queueSetSliceMax, queueSetSliceMin)
	queueSetSliceMax, queueSetSliceMin = 64, 32
	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewSource(seed))
	words := []string{"a", "b", "c", "", "ab"}
	randWords := func(pattern bool) string {
		ws := make([]string, 1+rng.Intn(5))
		for i := range ws {
			switch r := rng.Intn(6); {
			case pattern && r == 0:
				ws[i] = "#"
			case pattern && r == 1:
				ws[i] = "*"
			default:
				ws[i] = words[rng.Intn(len(words))]
			}
		}
		return strings.Join(ws, ".")
	}
	ref := &refWiring{queues: map[string]bool{}, exchanges: map[string]uint8{}, bindings: map[Binding]bool{}}
	snap := &Snapshot{}
	exchanges := []string{"d", "f", "t1", "t2"}
	for i, kind := range []uint8{KindDirect, KindFanout, KindTopic, KindTopic} {
		snap.Exchanges = append(snap.Exchanges, WiringExchange{Name: exchanges[i], Kind: kind})
		ref.exchanges[exchanges[i]] = kind
	}
	var queues []string
	for i := range 200 {
		q := fmt.Sprintf("q%d", i)
		queues = append(queues, q)
		snap.Queues = append(snap.Queues, WiringQueue{Name: q})
		ref.queues[q] = true
	}
	randBinding := func() Binding {
		return Binding{Exchange: exchanges[rng.Intn(len(exchanges))], Queue: queues[rng.Intn(len(queues))], Key: randWords(true)}
	}
	for range 3000 {
		b := randBinding()
		snap.Bindings = append(snap.Bindings, b) // a binding listed twice is restored once
		ref.bindings[b] = true
	}
	w := startWiring(t, snapLog{snap})
	compare := func(r *Routing, when string) map[string][]string {
		routes := map[string][]string{}
		for range 500 {
			key := randWords(false)
			for _, x := range append(exchanges, "") {
				got, want := routeNames(t, r, x, key), ref.route(x, key)
				if !slices.Equal(got, want) {
					t.Fatalf("seed %d %s: route %s %q = %v, reference says %v", seed, when, x, key, got, want)
				}
				routes[x+"\x00"+key] = got
			}
		}
		return routes
	}
	restored := w.Routing()
	kept := compare(restored, "after the restore")
	for step := range 300 {
		b := randBinding()
		if rng.Intn(2) == 0 {
			for x := range ref.bindings {
				b = x
				break
			}
			if err := w.Unbind(b.Exchange, b.Queue, b.Key); err != nil {
				t.Fatalf("seed %d step %d: unbind %+v: %v", seed, step, b, err)
			}
			delete(ref.bindings, b)
		} else if !ref.bindings[b] {
			if err := w.Bind(b.Exchange, b.Queue, b.Key); err != nil {
				t.Fatalf("seed %d step %d: bind %+v: %v", seed, step, b, err)
			}
			ref.bindings[b] = true
		}
	}
	compare(w.Routing(), "after later changes")
	for xk, want := range kept {
		x, key, _ := strings.Cut(xk, "\x00")
		if got := routeNames(t, restored, x, key); !slices.Equal(got, want) {
			t.Fatalf("seed %d: the restored snapshot changed: route %s %q = %v, was %v", seed, x, key, got, want)
		}
	}
}
