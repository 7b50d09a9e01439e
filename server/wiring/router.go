package wiring

import (
	"bytes"
	"math/bits"
	"strings"

	"github.com/berthmq/berth/shards"
	"github.com/berthmq/berth/wire"
)

// Exchange kinds (the same values as on the wire).
const (
	KindDirect uint8 = 0
	KindFanout uint8 = 1
	KindTopic  uint8 = 2
)

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

// exchange is immutable once published in a Routing snapshot: a binding
// change replaces the exchange, sharing its tables' unchanged parts.
type exchange struct {
	name    string
	kind    uint8
	options ExchangeOptions
	// gen tells this exchange from an earlier one of the same name: the
	// queues' binding lists keep it, and a binding whose gen is not the
	// current exchange's died with the exchange (deleting an exchange does
	// not visit its queues).
	gen    uint64
	direct pmap[queueSet] // by routing key
	fanout queueSet       // each queue once
	topic  *tnode
	count  int       // bindings
	edit   *pmapEdit // the batch that made this copy (withIn), or nil
}

// queueBinding is one binding as its queue's binding list holds it.
type queueBinding struct {
	exchange string
	gen      uint64
	key      string
}

// Routing is an immutable snapshot of the wiring: every exchange, queue and
// binding. Event loops route through it without locks; a change builds a
// new snapshot and swaps an atomic pointer (copy on write).
//
// Every table is persistent (queueTable, pmap, tnode): a new snapshot copies the
// Routing struct and the few nodes on the paths to what changed, so a
// declare, bind, unbind or delete costs O(log n) in the number of queues
// and bindings, plus the bindings of the one queue or key it touches.
type Routing struct {
	queues    queueTable
	exchanges pmap[*exchange]
	// bindings holds each queue's bindings, by queue name, so that a
	// queue's deletion removes its bindings without a scan, and a bind
	// finds a duplicate among its queue's bindings only.
	bindings pmap[queueBindings]
	gen      uint64 // the last exchange generation handed out
}

func emptyRouting() *Routing { return &Routing{} }

// Queue looks a queue up by name. It does not allocate.
func (r *Routing) Queue(name []byte) *shards.Queue {
	q, _ := r.queues.GetBytes(name)
	return q
}

// Len returns the number of queues.
func (r *Routing) Len() int { return r.queues.Len() }

func (r *Routing) queue(name string) *shards.Queue {
	q, _ := r.queues.Get(name)
	return q
}

func (r *Routing) exchange(name string) *exchange {
	ex, _ := r.exchanges.Get(name)
	return ex
}

// Route appends to dst the queues that a message with key, published to
// the named exchange, goes to, each queue once. The default exchange ""
// routes to the queue named by the key. It takes no lock and does not
// allocate (unless a topic match tracks more than trieStatesInline
// nodes at once).
func (r *Routing) Route(exchangeName, key []byte, dst []*shards.Queue) ([]*shards.Queue, error) {
	if len(exchangeName) == 0 {
		if q, _ := r.queues.GetBytes(key); q != nil {
			dst = append(dst, q)
		}
		return dst, nil
	}
	ex, _ := r.exchanges.GetBytes(exchangeName)
	if ex == nil {
		return dst, shards.ErrNoExchange
	}
	switch ex.kind {
	case KindDirect:
		qs, _ := ex.direct.GetBytes(key)
		dst = qs.appendTo(dst)
	case KindFanout:
		dst = ex.fanout.appendTo(dst)
	case KindTopic:
		var buf [topicWordsMax][]byte
		words, ok := splitTopicKey(key, &buf)
		if !ok {
			break // longer keys match no topic binding
		}
		dst = ex.topic.route(words, dst, len(dst))
	}
	return dst, nil
}

func containsQueue(qs []*shards.Queue, q *shards.Queue) bool {
	for _, x := range qs {
		if x == q {
			return true
		}
	}
	return false
}

// topicWordsMax bounds the words of a topic key or pattern. A key with
// more words matches no topic binding; a pattern with more words is refused
// by Bind (see TopicPatternError).
const topicWordsMax = 32

// Word kinds of a compiled topic pattern.
const (
	wordLiteral uint8 = iota
	wordStar          // "*": exactly one word
	wordHash          // "#": zero or more words
)

// topicPattern is a binding key compiled for matching: runs of "#" are
// collapsed to one (they match the same keys), each word's kind is decided
// once, and a pattern that needs more words than any key may have is marked
// as never matching.
//
// Matching runs the pattern as an NFA over the key's words, holding the set
// of key positions the pattern prefix can have consumed as a bitmask (a key
// has at most topicWordsMax = 32 words, so positions 0..32 fit in a
// uint64). Each pattern word turns one position set into the next:
//   - "#"     every position at or after the lowest one in the set (O(1));
//   - "*"     every position shifted by one (O(1));
//   - literal each position whose key word equals it, shifted by one
//     (at most one word comparison per position in the set).
//
// There is no backtracking. The worst case for one binding is a pattern
// whose words alternate "#" and literals, against a key whose words all
// equal those literals: after collapsing, a pattern has at most
// topicWordsMax literal or "*" words (more can never match and are skipped
// at compile time), so at most 32 literal steps of at most 32 comparisons
// each, 1,024 comparisons of words whose bytes together are bounded by the
// routing key's length (wire.RoutingKeyLenMax): per literal step the
// compared bytes are at most the key's bytes. A publish to a topic exchange
// with B bindings thus costs at most B x 1,024 word comparisons plus one
// split of the key. BenchmarkTopicMatchWorstCase measures the per-binding
// bound: 1.7 us on the 2-core development VM, against a stall of minutes
// for the backtracking matcher this replaced.
type topicPattern struct {
	words    [][]byte
	kinds    []uint8
	minWords int  // words a key needs at least
	anyLen   bool // a "#" lets the key be longer than minWords
	never    bool // needs more words than a key may have
}

func compileTopicPattern(s string) topicPattern {
	var p topicPattern
	for _, w := range bytes.Split([]byte(s), []byte{'.'}) {
		kind := wordLiteral
		switch {
		case len(w) == 1 && w[0] == '#':
			kind = wordHash
		case len(w) == 1 && w[0] == '*':
			kind = wordStar
		}
		if kind == wordHash {
			p.anyLen = true
			if n := len(p.kinds); n > 0 && p.kinds[n-1] == wordHash {
				continue // "#.#" matches what "#" matches
			}
		} else {
			p.minWords++
		}
		p.words = append(p.words, w)
		p.kinds = append(p.kinds, kind)
	}
	p.never = p.minWords > topicWordsMax
	return p
}

// splitTopicKey splits key into its dot-separated words in buf. ok is false
// when the key has more than topicWordsMax words.
func splitTopicKey(key []byte, buf *[topicWordsMax][]byte) (words [][]byte, ok bool) {
	words = buf[:0]
	for {
		if len(words) == topicWordsMax {
			return nil, false
		}
		i := bytes.IndexByte(key, '.')
		if i < 0 {
			return append(words, key), true
		}
		words = append(words, key[:i])
		key = key[i+1:]
	}
}

// match reports whether the key's words (at most topicWordsMax) match.
func (p *topicPattern) match(k [][]byte) bool {
	n := len(k)
	if p.never || n < p.minWords || (!p.anyLen && n != p.minWords) {
		return false
	}
	full := uint64(1)<<(n+1) - 1 // positions 0..n
	set := uint64(1)             // position 0: nothing consumed yet
	for i, w := range p.words {
		switch p.kinds[i] {
		case wordHash:
			low := set & -set
			set = full &^ (low - 1)
		case wordStar:
			set = (set << 1) & full
		default:
			var next uint64
			for m := set &^ (1 << n); m != 0; m &= m - 1 {
				pos := bits.TrailingZeros64(m)
				if bytes.Equal(w, k[pos]) {
					next |= 1 << (pos + 1)
				}
			}
			set = next
		}
		if set == 0 {
			return false
		}
	}
	return set&(1<<n) != 0
}

// TopicPatternError says why a topic binding key is refused, or nil.
func TopicPatternError(key string) error {
	words := 1 + strings.Count(key, ".")
	if words > topicWordsMax {
		return shards.Errorf(wire.CodeInvalid, "topic binding key has %d words; at most %d are allowed", words, topicWordsMax)
	}
	return nil
}
