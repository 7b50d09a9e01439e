package shards

import (
	"bytes"
	"errors"
	"sort"
)

// Exchange kinds (the same values as on the wire).
const (
	KindDirect uint8 = 0
	KindFanout uint8 = 1
	KindTopic  uint8 = 2
)

// ErrNoExchange is returned when routing through an exchange that does not
// exist.
var ErrNoExchange = errors.New("shards: no such exchange")

// ExchangeOptions are fixed when an exchange is declared.
type ExchangeOptions struct {
	Durable    bool
	AutoDelete bool
}

// Binding routes messages from Exchange to Queue when Key matches.
type Binding struct {
	Exchange string
	Queue    string
	Key      string
}

// exchange is immutable once published in a Routing snapshot.
type exchange struct {
	name    string
	kind    uint8
	options ExchangeOptions
	direct  map[string][]*Queue
	fanout  []*Queue
	topic   []topicBinding
	count   int // bindings
}

type topicBinding struct {
	pattern [][]byte
	queue   *Queue
}

// Routing is an immutable snapshot of the wiring: every exchange, queue and
// binding. Event loops route through it without locks; a change builds a
// new snapshot and swaps an atomic pointer (copy on write).
type Routing struct {
	queues    map[string]*Queue
	exchanges map[string]*exchange
	bindings  []Binding // sorted, for listing and rebuilding
}

func emptyRouting() *Routing {
	return &Routing{queues: map[string]*Queue{}, exchanges: map[string]*exchange{}}
}

// Queue looks a queue up by name. The []byte form does not allocate.
func (r *Routing) Queue(name []byte) *Queue { return r.queues[string(name)] }

// Route appends to dst the queues that a message with key, published to
// the named exchange, goes to, each queue once. The default exchange ""
// routes to the queue named by the key.
func (r *Routing) Route(exchangeName, key []byte, dst []*Queue) ([]*Queue, error) {
	if len(exchangeName) == 0 {
		if q := r.queues[string(key)]; q != nil {
			dst = append(dst, q)
		}
		return dst, nil
	}
	ex := r.exchanges[string(exchangeName)]
	if ex == nil {
		return dst, ErrNoExchange
	}
	start := len(dst)
	switch ex.kind {
	case KindDirect:
		dst = append(dst, ex.direct[string(key)]...)
	case KindFanout:
		dst = append(dst, ex.fanout...)
	case KindTopic:
		for i := range ex.topic {
			tb := &ex.topic[i]
			if topicMatch(tb.pattern, key) && !containsQueue(dst[start:], tb.queue) {
				dst = append(dst, tb.queue)
			}
		}
	}
	return dst, nil
}

func containsQueue(qs []*Queue, q *Queue) bool {
	for _, x := range qs {
		if x == q {
			return true
		}
	}
	return false
}

// topicWordsMax bounds the words of a topic key or pattern; longer keys
// match no topic binding.
const topicWordsMax = 32

// topicMatch matches a dot-separated routing key against a pattern in which
// "*" matches exactly one word and "#" matches zero or more words.
func topicMatch(pattern [][]byte, key []byte) bool {
	var buf [topicWordsMax][]byte
	words := buf[:0]
	for {
		if len(words) == topicWordsMax {
			return false
		}
		i := bytes.IndexByte(key, '.')
		if i < 0 {
			words = append(words, key)
			break
		}
		words = append(words, key[:i])
		key = key[i+1:]
	}
	return matchWords(pattern, words)
}

func matchWords(p, k [][]byte) bool {
	for len(p) > 0 {
		w := p[0]
		if len(w) == 1 && w[0] == '#' {
			if len(p) == 1 {
				return true
			}
			for i := 0; i <= len(k); i++ {
				if matchWords(p[1:], k[i:]) {
					return true
				}
			}
			return false
		}
		if len(k) == 0 {
			return false
		}
		if !(len(w) == 1 && w[0] == '*') && !bytes.Equal(w, k[0]) {
			return false
		}
		p, k = p[1:], k[1:]
	}
	return len(k) == 0
}

func splitPattern(s string) [][]byte {
	var out [][]byte
	for _, w := range bytes.Split([]byte(s), []byte{'.'}) {
		out = append(out, w)
	}
	return out
}

// clone copies the snapshot's maps so a change can be made to the copy.
func (r *Routing) clone() *Routing {
	n := &Routing{
		queues:    make(map[string]*Queue, len(r.queues)),
		exchanges: make(map[string]*exchange, len(r.exchanges)),
		bindings:  append([]Binding(nil), r.bindings...),
	}
	for k, v := range r.queues {
		n.queues[k] = v
	}
	for k, v := range r.exchanges {
		n.exchanges[k] = v
	}
	return n
}

// rebuildExchanges recomputes every exchange's routing tables from the
// binding list. Wiring changes are rare, so simplicity wins over speed.
func (r *Routing) rebuildExchanges() {
	for name, ex := range r.exchanges {
		n := &exchange{name: ex.name, kind: ex.kind, options: ex.options, direct: map[string][]*Queue{}}
		r.exchanges[name] = n
	}
	kept := r.bindings[:0]
	for _, b := range r.bindings {
		ex := r.exchanges[b.Exchange]
		q := r.queues[b.Queue]
		if ex == nil || q == nil {
			continue // the exchange or queue was deleted: the binding goes too
		}
		kept = append(kept, b)
		ex.count++
		switch ex.kind {
		case KindDirect:
			ex.direct[b.Key] = append(ex.direct[b.Key], q)
		case KindFanout:
			if !containsQueue(ex.fanout, q) {
				ex.fanout = append(ex.fanout, q)
			}
		case KindTopic:
			ex.topic = append(ex.topic, topicBinding{pattern: splitPattern(b.Key), queue: q})
		}
	}
	r.bindings = kept
	sort.Slice(r.bindings, func(i, j int) bool {
		a, b := r.bindings[i], r.bindings[j]
		if a.Exchange != b.Exchange {
			return a.Exchange < b.Exchange
		}
		if a.Queue != b.Queue {
			return a.Queue < b.Queue
		}
		return a.Key < b.Key
	})
}
