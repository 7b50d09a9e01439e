package wiring

import (
	"slices"
	"strings"

	"github.com/berthmq/berth/shards"
)

// The changes below are made to a Routing that is not published yet: a
// copy of the current snapshot's struct, whose tables are persistent, so
// changing it leaves the published snapshot as it was. The caller holds
// Wiring.mu (or owns the copy alone, as Restore does).
//
// Small lists (a queueSet's slice, a queue's bindings) grow by appending
// in place past the published length when their array has room: a
// published snapshot never sees past its slice's length, and successors
// are built one at a time from the latest published snapshot, so each
// slot past a published length is written for at most one snapshot that
// is published (one that fails to publish is dropped, and the next writes
// the slot again). A bind thus costs amortised O(1) in the length of the
// lists it extends, where a copy of each made n binds to one fanout cost
// O(n^2). Removing a queue from a list of n copies at most
// queueSetSliceMax entries or a pmap path (queueSet), not the list.
//
// A queue's own binding list is still copied by an unbind (it is as long
// as that queue's bindings, mostly one).

// queueBindings is a queue's bindings as Routing.bindings holds them.
// Bindings of deleted exchanges stay in list until a sweep drops them
// (sweep): everything that reads the list checks each binding's
// generation (bindingLive), so a dead one is only memory, and the sweeps
// bound that memory to twice the list's live length at its last sweep.
type queueBindings struct {
	list  []queueBinding
	swept int // len(list) after its last sweep
}

// bindingsSweepMin is the length below which a queue's binding list is
// not swept: a list that short costs little to keep or to scan.
const bindingsSweepMin = 16

// addQueue adds q, which must not be there.
func (r *Routing) addQueue(q *shards.Queue) { r.queues = r.queues.Set(q.Name, q) }

// addExchange adds an exchange with no bindings, replacing any of that
// name (whose bindings die with it).
func (r *Routing) addExchange(name string, kind uint8, opts ExchangeOptions) {
	r.gen++
	r.exchanges = r.exchanges.Set(name, &exchange{name: name, kind: kind, options: opts, gen: r.gen})
}

// removeExchange removes an exchange and so its bindings. The queues'
// binding lists keep them until a sweep (queueBindings), which knows them
// by their generation.
func (r *Routing) removeExchange(name string) { r.exchanges = r.exchanges.Delete(name) }

// liveBindings returns a copy of the queue's bindings whose exchange
// still exists. It costs O(the queue's bindings); binds and unbinds do
// not call it.
func (r *Routing) liveBindings(queue string) []queueBinding {
	qb, _ := r.bindings.Get(queue)
	return r.appendLive(nil, qb.list)
}

// appendLive appends to dst the bindings of all whose exchange still
// exists.
func (r *Routing) appendLive(dst, all []queueBinding) []queueBinding {
	// A queue's bindings mostly share an exchange: look each name up
	// once per run of it.
	var last *exchange
	for _, b := range all {
		if last == nil || last.name != b.exchange {
			last = r.exchange(b.exchange)
			if last == nil {
				last = &exchange{name: b.exchange} // gone: no binding's gen is 0
			}
		}
		if last.gen == b.gen {
			dst = append(dst, b)
		}
	}
	return dst
}

// sweep returns qb without the bindings of deleted exchanges once it has
// doubled since its last sweep, and qb itself otherwise. A sweep costs
// O(len(qb.list)) and comes after at least half that many binds since
// the last one: amortised O(1) a bind.
func (r *Routing) sweep(qb queueBindings) queueBindings {
	if len(qb.list) < max(2*qb.swept, bindingsSweepMin) {
		return qb
	}
	live := r.appendLive(make([]queueBinding, 0, len(qb.list)), qb.list)
	if len(live) == len(qb.list) {
		return queueBindings{list: qb.list, swept: len(qb.list)} // nothing dead: keep the shared array
	}
	return queueBindings{list: live, swept: len(live)}
}

func (r *Routing) bindingLive(b queueBinding) bool {
	ex := r.exchange(b.exchange)
	return ex != nil && ex.gen == b.gen
}

// hasBinding reports whether the binding exists. The exchange's table
// answers first (see covers), so that a queue with many bindings is
// scanned only when it has one that covers this one.
func (r *Routing) hasBinding(exchange, queue, key string) bool {
	ex, q := r.exchange(exchange), r.queue(queue)
	if ex == nil || q == nil {
		return false
	}
	switch ex.kind {
	case KindDirect:
		qs, _ := ex.direct.Get(key)
		return qs.contains(q) // a direct key's list holds q iff q has that binding
	case KindFanout, KindTopic:
		if !ex.covers(q, key) {
			return false
		}
	}
	qb, _ := r.bindings.Get(queue)
	return slices.Contains(qb.list, queueBinding{exchange: exchange, gen: ex.gen, key: key})
}

// covers reports whether ex's tables hold q for key already, so that a
// binding of q by key adds nothing to them: the fanout list holds q iff
// q has a binding to ex, and the trie node of key's normalised pattern
// holds q iff q has a binding of that pattern. A topic pattern that can
// match nothing is never in the trie: covered. A direct key's list
// gains q with each binding of it.
func (ex *exchange) covers(q *shards.Queue, key string) bool {
	switch ex.kind {
	case KindFanout:
		return ex.fanout.contains(q)
	case KindTopic:
		words, ok := topicTrieWords(key)
		if !ok {
			return true
		}
		n := trieFind(ex.topic, words)
		return n != nil && n.queues.contains(q)
	}
	return false
}

// bind adds a binding of q to the exchange, which must exist; the binding
// must not. It costs O(log n) in the lists it extends and amortised O(1)
// in q's other bindings (sweep).
func (r *Routing) bind(exchangeName string, q *shards.Queue, key string) {
	ex := r.exchange(exchangeName)
	qb, _ := r.bindings.Get(q.Name)
	qb = r.sweep(qb)
	qb.list = append(qb.list, queueBinding{exchange: exchangeName, gen: ex.gen, key: key}) // in place past the published length
	r.exchanges = r.exchanges.Set(exchangeName, ex.withIn(nil, q, key, ex.covers(q, key)))
	r.bindings = r.bindings.Set(q.Name, qb)
}

// unbind removes a binding, which must exist.
func (r *Routing) unbind(exchangeName string, q *shards.Queue, key string) {
	ex := r.exchange(exchangeName)
	nb := queueBinding{exchange: exchangeName, gen: ex.gen, key: key}
	qb, _ := r.bindings.Get(q.Name)
	i := slices.Index(qb.list, nb)
	rest := slices.Delete(slices.Clone(qb.list), i, i+1)
	last := true // q's last binding to ex that puts it where key does
	switch ex.kind {
	case KindFanout:
		last = !ex.boundElsewhere(rest, func(string) bool { return true })
	case KindTopic:
		if words, ok := topicTrieWords(key); ok {
			last = !ex.boundElsewhere(rest, samePattern(key, words))
		}
	}
	r.exchanges = r.exchanges.Set(exchangeName, ex.without(q, key, last))
	if len(rest) == 0 {
		r.bindings = r.bindings.Delete(q.Name)
	} else {
		r.bindings = r.bindings.Set(q.Name, queueBindings{list: rest, swept: min(qb.swept, len(rest))})
	}
}

// removeQueue removes q and its bindings, if q is the queue of its name.
// Every binding of q goes, so each exchange drops q from a table the
// first time one of q's bindings leads there: O(q's bindings x log n).
func (r *Routing) removeQueue(q *shards.Queue) {
	if r.queue(q.Name) != q {
		return
	}
	qb, _ := r.bindings.Get(q.Name)
	for _, b := range qb.list {
		ex := r.exchange(b.exchange)
		if ex == nil || ex.gen != b.gen {
			continue // died with its exchange
		}
		r.exchanges = r.exchanges.Set(b.exchange, ex.without(q, b.key, ex.covers(q, b.key)))
	}
	r.bindings = r.bindings.Delete(q.Name)
	r.queues = r.queues.Delete(q.Name)
}

// covered reports whether others bind q to ex so that a binding by key
// adds nothing to ex's tables: to a fanout, any binding; to a topic, one
// of the same normalised pattern (or key's pattern can match nothing).
func (ex *exchange) covered(key string, others []queueBinding) bool {
	switch ex.kind {
	case KindFanout:
		return ex.boundElsewhere(others, func(string) bool { return true })
	case KindTopic:
		words, ok := topicTrieWords(key)
		return !ok || ex.boundElsewhere(others, samePattern(key, words))
	}
	return false
}

// withIn returns ex with q bound by key, within the batch ed (nil: none):
// an exchange ed made is changed in place and returned, any other is
// copied. covered says that the binding adds nothing to the fanout list
// or the topic trie (see covered).
func (ex *exchange) withIn(ed *pmapEdit, q *shards.Queue, key string, covered bool) *exchange {
	c := ex
	if ed == nil || ex.edit != ed {
		c = new(exchange)
		*c = *ex
		c.edit = ed
	}
	c.count++
	switch c.kind {
	case KindDirect:
		qs, _ := c.direct.Get(key)
		c.direct = c.direct.SetIn(ed, key, qs.with(ed, q))
	case KindFanout:
		if !covered {
			c.fanout = c.fanout.with(ed, q)
		}
	case KindTopic:
		if !covered {
			words, _ := topicTrieWords(key)
			c.topic = trieAddIn(ed, c.topic, words, q)
		}
	}
	return c
}

// without returns a copy of ex without q's binding by key. last says
// that q has no other binding to ex that puts it where key does: in the
// fanout list (any binding), at the trie node of key's normalised
// pattern; only then does q leave that table. A direct key's list loses
// q with its binding.
func (ex *exchange) without(q *shards.Queue, key string, last bool) *exchange {
	c := *ex
	c.edit = nil
	c.count--
	switch c.kind {
	case KindDirect:
		if qs, _ := c.direct.Get(key); qs.contains(q) {
			if qs.len() == 1 {
				c.direct = c.direct.Delete(key)
			} else {
				c.direct = c.direct.Set(key, qs.without(q))
			}
		}
	case KindFanout:
		if last {
			c.fanout = c.fanout.without(q)
		}
	case KindTopic:
		if words, ok := topicTrieWords(key); ok && last {
			c.topic = trieRemove(c.topic, words, q)
		}
	}
	return &c
}

// boundElsewhere reports whether one of others binds to ex with a key
// that same accepts.
func (ex *exchange) boundElsewhere(others []queueBinding, same func(string) bool) bool {
	for _, b := range others {
		if b.exchange == ex.name && b.gen == ex.gen && same(b.key) {
			return true
		}
	}
	return false
}

// samePattern accepts keys that normalise to words, the normalised form
// of key. Only runs of "#" words normalise away, so when neither key nor
// k holds "#.#", k is the same pattern only if it is key: a queue's other
// bindings cost a string comparison each, not a split.
func samePattern(key string, words []string) func(string) bool {
	plain := !strings.Contains(key, "#.#")
	return func(k string) bool {
		if k == key {
			return true
		}
		if plain && !strings.Contains(k, "#.#") {
			return false
		}
		w, ok := topicTrieWords(k)
		return ok && slices.Equal(w, words)
	}
}
