package wiring

import (
	"slices"
	"strings"

	"github.com/berthmq/berth/shards"
)

// tnode is one node of a topic exchange's binding trie: the patterns that
// start with the words on the path from the root to it. Like pmap it is
// persistent: a bind or unbind copies the nodes on its pattern's path and
// shares the rest, so a Routing snapshot never sees a trie change.
//
// Patterns are normalised before they enter the trie (topicTrieWords):
// runs of "#" become one "#", so a "#" node never has a "#" child, and a
// pattern that needs more words than a key may have is left out (it can
// match nothing).
type tnode struct {
	words  pmap[*tnode] // children by literal word (the empty word too)
	star   *tnode       // child by "*"
	hash   *tnode       // child by "#"
	isHash bool         // this node is a "#": it also takes any word itself
	queues queueSet     // the queues of the patterns that end here, each once
	size   int          // queues here and below; a node of size 0 is removed
	edit   *pmapEdit    // the batch that made this node (trieAddIn), or nil
}

// topicTrieWords splits and normalises a binding key for the trie. ok is
// false when the pattern needs more than topicWordsMax words: no key can
// match it, so it is kept out of the trie.
func topicTrieWords(key string) (words []string, ok bool) {
	literal := 0
	for w := range strings.SplitSeq(key, ".") {
		if w == "#" {
			if n := len(words); n > 0 && words[n-1] == "#" {
				continue
			}
		} else {
			literal++
		}
		words = append(words, w)
	}
	return words, literal <= topicWordsMax
}

// trieFind returns the node at the end of words' path in the trie n, or
// nil if there is none.
func trieFind(n *tnode, words []string) *tnode {
	for _, w := range words {
		if n == nil {
			return nil
		}
		switch w {
		case "#":
			n = n.hash
		case "*":
			n = n.star
		default:
			n, _ = n.words.Get(w)
		}
	}
	return n
}

// trieAdd returns the trie n (nil: empty) with q added at the end of
// words' path. q must not be there yet.
func trieAdd(n *tnode, words []string, q *shards.Queue) *tnode { return trieAddIn(nil, n, words, q) }

// trieAddIn is trieAdd within the batch ed (nil: none): the nodes ed made
// are changed in place rather than copied (pmapEdit).
func trieAddIn(ed *pmapEdit, n *tnode, words []string, q *shards.Queue) *tnode {
	c := n
	if n == nil || ed == nil || n.edit != ed {
		c = &tnode{edit: ed}
		if n != nil {
			*c = *n
			c.edit = ed
			// c.queues shares n's array: appending writes past n's
			// length, which n never reads (change.go).
		}
	}
	c.size++
	if len(words) == 0 {
		c.queues = c.queues.with(ed, q)
		return c
	}
	switch w := words[0]; w {
	case "#":
		c.hash = trieAddIn(ed, c.hash, words[1:], q)
		c.hash.isHash = true
	case "*":
		c.star = trieAddIn(ed, c.star, words[1:], q)
	default:
		child, _ := c.words.Get(w)
		c.words = c.words.SetIn(ed, w, trieAddIn(ed, child, words[1:], q))
	}
	return c
}

// trieRemove returns the trie n without q at the end of words' path (nil
// when nothing is left). q must be there.
func trieRemove(n *tnode, words []string, q *shards.Queue) *tnode {
	if n == nil {
		panic("wiring: removing a binding that is not in the topic trie")
	}
	if n.size == 1 {
		return nil
	}
	c := *n
	c.edit = nil
	c.size--
	if len(words) == 0 {
		c.queues = c.queues.without(q)
		return &c
	}
	switch w := words[0]; w {
	case "#":
		c.hash = trieRemove(c.hash, words[1:], q)
	case "*":
		c.star = trieRemove(c.star, words[1:], q)
	default:
		child, _ := c.words.Get(w)
		if child = trieRemove(child, words[1:], q); child == nil {
			c.words = c.words.Delete(w)
		} else {
			c.words = c.words.Set(w, child)
		}
	}
	return &c
}

// trieStatesInline is how many trie nodes a match tracks per key word
// before its state sets spill to the heap. Only patterns that all match
// the key so far share a set, so ordinary wirings stay far below it.
const trieStatesInline = 32

// route appends to dst (past start, where this publish's targets begin)
// the queues of every pattern in the trie that matches the key's words,
// each queue once.
//
// It runs the trie as an NFA, one key word at a time, holding the set of
// nodes whose path matches the words so far; a "#" node stays in the set
// for every word, and entering a node enters its "#" child too (a "#" may
// match no word). Each node is in a set at most once, so a word costs at
// most one child lookup per live node, whatever the patterns: no work is
// done for a pattern once its prefix stops matching, and patterns built
// to make a backtracking matcher explode ("#.a.#.a...") cost at most
// (words x live nodes) steps.
func (n *tnode) route(words [][]byte, dst []*shards.Queue, start int) []*shards.Queue {
	if n == nil {
		return dst
	}
	var bufA, bufB [trieStatesInline]*tnode
	cur := addState(bufA[:0], n)
	next := bufB[:0]
	for _, w := range words {
		next = next[:0]
		for _, s := range cur {
			if s.isHash {
				next = addState(next, s)
			}
			if c, ok := s.words.GetBytes(w); ok {
				next = addState(next, c)
			}
			if s.star != nil {
				next = addState(next, s.star)
			}
		}
		cur, next = next, cur
		if len(cur) == 0 {
			return dst
		}
	}
	first := true
	for _, s := range cur {
		if s.queues.len() == 0 {
			continue
		}
		mark := len(dst)
		dst = s.queues.appendTo(dst)
		if first {
			// One node's queues are distinct: only later nodes can repeat
			// them.
			first = false
			continue
		}
		kept := mark
		for _, q := range dst[mark:] {
			if !containsQueue(dst[start:mark], q) {
				dst[kept] = q
				kept++
			}
		}
		clear(dst[kept:])
		dst = dst[:kept]
	}
	return dst
}

// addState adds n, and the "#" child that may follow it matching no word,
// to set unless already there.
func addState(set []*tnode, n *tnode) []*tnode {
	for ; n != nil; n = n.hash {
		if !slices.Contains(set, n) {
			set = append(set, n)
		}
	}
	return set
}
