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
// Lists (a fanout's queues, a direct key's queues, a trie node's queues,
// a queue's bindings) grow by appending in place past the published
// length when their array has room: a published snapshot never sees past
// its slice's length, and successors are built one at a time from the
// latest published snapshot, so each slot past a published length is
// written for at most one snapshot that is published (one that fails to
// publish is dropped, and the next writes the slot again). A bind thus
// costs amortised O(1) in the length of the lists it extends, where a
// copy of each made n binds to one fanout cost O(n^2). Removing from a
// list still copies it.

// addQueue adds q, which must not be there.
func (r *Routing) addQueue(q *shards.Queue) { r.queues = r.queues.Set(q.Name, q) }

// addExchange adds an exchange with no bindings, replacing any of that
// name (whose bindings die with it).
func (r *Routing) addExchange(name string, kind uint8, opts ExchangeOptions) {
	r.gen++
	r.exchanges = r.exchanges.Set(name, &exchange{name: name, kind: kind, options: opts, gen: r.gen})
}

// removeExchange removes an exchange and so its bindings. The queues'
// binding lists keep them until the next change to each queue's list,
// which drops them by their generation.
func (r *Routing) removeExchange(name string) { r.exchanges = r.exchanges.Delete(name) }

// liveBindings returns the queue's bindings whose exchange still exists.
// The slice is shared with the snapshot: do not change it below its
// length (appending past it is how a bind extends it; change.go).
func (r *Routing) liveBindings(queue string) []queueBinding {
	all, _ := r.bindings.Get(queue)
	// A queue's bindings mostly share an exchange: look each name up
	// once per run of it.
	var last *exchange
	for i, b := range all {
		if last == nil || last.name != b.exchange {
			last = r.exchange(b.exchange)
			if last == nil {
				last = &exchange{name: b.exchange} // gone: no binding's gen is 0
			}
		}
		if last.gen != b.gen {
			// Rare (an exchange was deleted): copy without the dead ones.
			live := slices.Clone(all[:i])
			for _, b := range all[i+1:] {
				if r.bindingLive(b) {
					live = append(live, b)
				}
			}
			return live
		}
	}
	return all
}

func (r *Routing) bindingLive(b queueBinding) bool {
	ex := r.exchange(b.exchange)
	return ex != nil && ex.gen == b.gen
}

// hasBinding reports whether the binding exists. A queue with many
// bindings is first looked up in the exchange's table (see coveredBy),
// which rules most new bindings out without scanning the queue's list.
func (r *Routing) hasBinding(exchange, queue, key string) bool {
	ex := r.exchange(exchange)
	if ex == nil {
		return false
	}
	all, _ := r.bindings.Get(queue)
	if q := r.queue(queue); q != nil && len(all) > 16 {
		switch ex.kind {
		case KindDirect:
			if qs, _ := ex.direct.Get(key); len(qs) < len(all) {
				return slices.Contains(qs, q)
			}
		case KindFanout:
			if len(ex.fanout) < len(all) && !slices.Contains(ex.fanout, q) {
				return false
			}
		case KindTopic:
			if words, ok := topicTrieWords(key); ok {
				n := trieFind(ex.topic, words)
				if n == nil || (len(n.queues) < len(all) && !slices.Contains(n.queues, q)) {
					return false
				}
			}
		}
	}
	return slices.Contains(all, queueBinding{exchange: exchange, gen: ex.gen, key: key})
}

// bind adds a binding of q to the exchange, which must exist; the binding
// must not.
func (r *Routing) bind(exchangeName string, q *shards.Queue, key string) {
	ex := r.exchange(exchangeName)
	qb := r.liveBindings(q.Name)
	nb := queueBinding{exchange: exchangeName, gen: ex.gen, key: key}
	r.exchanges = r.exchanges.Set(exchangeName, ex.with(q, key, qb))
	r.bindings = r.bindings.Set(q.Name, append(qb, nb)) // in place past the published length
}

// unbind removes a binding, which must exist.
func (r *Routing) unbind(exchangeName string, q *shards.Queue, key string) {
	ex := r.exchange(exchangeName)
	nb := queueBinding{exchange: exchangeName, gen: ex.gen, key: key}
	qb := r.liveBindings(q.Name)
	i := slices.Index(qb, nb)
	rest := slices.Delete(slices.Clone(qb), i, i+1)
	r.exchanges = r.exchanges.Set(exchangeName, ex.without(q, key, rest))
	if len(rest) == 0 {
		r.bindings = r.bindings.Delete(q.Name)
	} else {
		r.bindings = r.bindings.Set(q.Name, rest)
	}
}

// removeQueue removes q and its bindings, if q is the queue of its name.
func (r *Routing) removeQueue(q *shards.Queue) {
	if r.queue(q.Name) != q {
		return
	}
	qb := r.liveBindings(q.Name)
	for i, b := range qb {
		ex := r.exchange(b.exchange)
		rest := slices.Delete(slices.Clone(qb[i:]), 0, 1) // bindings still to remove
		r.exchanges = r.exchanges.Set(b.exchange, ex.without(q, b.key, rest))
	}
	r.bindings = r.bindings.Delete(q.Name)
	r.queues = r.queues.Delete(q.Name)
}

// with returns a copy of ex with q bound by key. others are q's other
// bindings (to any exchange): a fanout lists q once and a topic trie
// holds q once per normalised pattern, however many keys lead there.
func (ex *exchange) with(q *shards.Queue, key string, others []queueBinding) *exchange {
	return ex.withIn(nil, q, key, ex.coveredBy(q, key, others))
}

// coveredBy is covered, answered from ex's own tables when that is less
// work than scanning others (a queue with thousands of bindings): the
// fanout list holds q iff q has a binding to ex, and the trie node of
// key's normalised pattern holds q iff q has a binding of that pattern.
func (ex *exchange) coveredBy(q *shards.Queue, key string, others []queueBinding) bool {
	switch ex.kind {
	case KindFanout:
		if len(ex.fanout) < len(others) {
			return slices.Contains(ex.fanout, q)
		}
	case KindTopic:
		words, ok := topicTrieWords(key)
		if !ok {
			return true
		}
		if n := trieFind(ex.topic, words); n == nil {
			return false
		} else if len(n.queues) < len(others) {
			return slices.Contains(n.queues, q)
		}
		return ex.boundElsewhere(others, samePattern(key, words))
	}
	return ex.covered(key, others)
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
		c.direct = c.direct.SetIn(ed, key, append(qs, q))
	case KindFanout:
		if !covered {
			c.fanout = append(c.fanout, q)
		}
	case KindTopic:
		if !covered {
			words, _ := topicTrieWords(key)
			c.topic = trieAddIn(ed, c.topic, words, q)
		}
	}
	return c
}

// without returns a copy of ex without q's binding by key. others are q's
// bindings that stay.
func (ex *exchange) without(q *shards.Queue, key string, others []queueBinding) *exchange {
	c := *ex
	c.edit = nil
	c.count--
	switch c.kind {
	case KindDirect:
		qs, _ := c.direct.Get(key)
		if i := slices.Index(qs, q); i >= 0 {
			if len(qs) == 1 {
				c.direct = c.direct.Delete(key)
			} else {
				c.direct = c.direct.Set(key, slices.Delete(slices.Clone(qs), i, i+1))
			}
		}
	case KindFanout:
		if !ex.boundElsewhere(others, func(string) bool { return true }) {
			if i := slices.Index(c.fanout, q); i >= 0 {
				c.fanout = slices.Delete(slices.Clone(c.fanout), i, i+1)
			}
		}
	case KindTopic:
		words, ok := topicTrieWords(key)
		if ok && !ex.boundElsewhere(others, samePattern(key, words)) {
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
