package wiring

import (
	"bytes"
	"fmt"
	"math/rand"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berthmq/berth/shards"
)

// topicMatches compiles pattern and matches key with it, as Route does.
func topicMatches(pattern, key string) bool {
	p := compileTopicPattern(pattern)
	var buf [topicWordsMax][]byte
	words, ok := splitTopicKey([]byte(key), &buf)
	return ok && p.match(words)
}

// refMatch is the backtracking matcher the broker used before: obviously
// right, exponential in the number of "#" words. The tests keep its inputs
// short.
func refMatch(p, k [][]byte) bool {
	for len(p) > 0 {
		w := p[0]
		if len(w) == 1 && w[0] == '#' {
			if len(p) == 1 {
				return true
			}
			for i := 0; i <= len(k); i++ {
				if refMatch(p[1:], k[i:]) {
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

func refTopicMatch(pattern, key string) bool {
	k := bytes.Split([]byte(key), []byte{'.'})
	if len(k) > topicWordsMax {
		return false
	}
	return refMatch(bytes.Split([]byte(pattern), []byte{'.'}), k)
}

// TestTopicMatchAgainstReference compares the NFA matcher with the
// backtracking one on random patterns of "*", "#" and words against random
// keys over a small alphabet, so that many of them match.
func TestTopicMatchAgainstReference(t *testing.T) {
	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewSource(seed))
	words := []string{"a", "b", "", "ab"}
	n := 200000
	if testing.Short() {
		n = 20000
	}
	matched := 0
	for i := 0; i < n; i++ {
		pw := make([]string, 1+rng.Intn(7))
		for j := range pw {
			switch r := rng.Intn(6); {
			case r == 0:
				pw[j] = "#"
			case r == 1:
				pw[j] = "*"
			default:
				pw[j] = words[rng.Intn(len(words))]
			}
		}
		kw := make([]string, 1+rng.Intn(8))
		for j := range kw {
			kw[j] = words[rng.Intn(len(words))]
		}
		pattern, key := strings.Join(pw, "."), strings.Join(kw, ".")
		want := refTopicMatch(pattern, key)
		if got := topicMatches(pattern, key); got != want {
			t.Fatalf("seed %d: %q ~ %q = %v, reference says %v", seed, pattern, key, got, want)
		}
		if want {
			matched++
		}
	}
	if matched < n/20 {
		t.Fatalf("only %d of %d random cases matched: the comparison says little", matched, n)
	}
}

// TestTopicMatchAtTheCaps covers keys and patterns at and past
// topicWordsMax, where the reference matcher would take too long.
func TestTopicMatchAtTheCaps(t *testing.T) {
	rep := func(w string, n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = w
		}
		return out
	}
	join := func(parts ...[]string) string {
		var all []string
		for _, p := range parts {
			all = append(all, p...)
		}
		return strings.Join(all, ".")
	}
	a30 := join(rep("a", 30))
	cases := []struct {
		pattern, key string
		want         bool
	}{
		{join(rep("#", 12), []string{"z"}), a30, false}, // the report's pattern
		{join(rep("#", 12), []string{"z"}), join(rep("a", 29), []string{"z"}), true},
		{join(rep("#", 40), []string{"a"}), a30, true},
		{join(rep("#.a", 32)), join(rep("a", 32)), true},
		{join(rep("#.a", 32), []string{"b"}), join(rep("a", 31), []string{"b"}), false},
		{join(rep("*", 32)), join(rep("a", 32)), true},
		{join(rep("*", 33)), join(rep("a", 32)), false},
		{join(rep("*", 31)), join(rep("a", 32)), false},
		{"#", join(rep("a", 32)), true},
		{"#", join(rep("a", 33)), false}, // longer keys match nothing
		{join(rep("a", 40)), join(rep("a", 32)), false},
		{join(rep("*.#", 32)), join(rep("a", 32)), true},
		{join(rep("*.#", 33)), join(rep("a", 32)), false},
	}
	for _, c := range cases {
		if got := topicMatches(c.pattern, c.key); got != c.want {
			t.Errorf("%.40q... ~ %.40q... = %v, want %v", c.pattern, c.key, got, c.want)
		}
	}
}

func TestTopicPatternCap(t *testing.T) {
	ok := strings.Repeat("#.", topicWordsMax-1) + "z"
	if err := TopicPatternError(ok); err != nil {
		t.Fatalf("%d words refused: %v", topicWordsMax, err)
	}
	if err := TopicPatternError(ok + ".y"); err == nil {
		t.Fatalf("%d words accepted", topicWordsMax+1)
	}
}

// BenchmarkTopicMatchWorstCase is the most expensive single binding at the
// caps: "#" and a literal alternate 32 times, and every key word equals the
// literal, so after each "#" every position is live and each literal step
// compares the whole word at every position. The key is 32 words of 31
// bytes (1,023 bytes, within wire.RoutingKeyLenMax); the last literal
// differs from the key's words in its last byte, so the walk runs to the
// end and fails there.
func BenchmarkTopicMatchWorstCase(b *testing.B) {
	w := strings.Repeat("w", 31)
	pw := make([]string, 0, 64)
	for i := 0; i < topicWordsMax-1; i++ {
		pw = append(pw, "#", w)
	}
	pw = append(pw, "#", strings.Repeat("w", 30)+"x")
	pattern := compileTopicPattern(strings.Join(pw, "."))
	kw := make([]string, topicWordsMax)
	for i := range kw {
		kw[i] = w
	}
	key := []byte(strings.Join(kw, "."))
	var buf [topicWordsMax][]byte
	words, ok := splitTopicKey(key, &buf)
	if !ok {
		b.Fatal("key too long")
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if pattern.match(words) {
			b.Fatal("matched")
		}
	}
}

// BenchmarkTopicRouteReported routes the report's key through the report's
// binding, split and all, as a publish does.
func BenchmarkTopicRouteReported(b *testing.B) {
	r := emptyRouting()
	r.addExchange("t", KindTopic, ExchangeOptions{})
	q := &shards.Queue{Name: "q"}
	r.addQueue(q)
	r.bind("t", q, strings.Repeat("#.", 12)+"z")
	key := []byte(strings.TrimSuffix(strings.Repeat("a.", 30), "."))
	dst := make([]*shards.Queue, 0, 4)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		var err error
		if dst, err = r.Route([]byte("t"), key, dst[:0]); err != nil || len(dst) != 0 {
			b.Fatal(err, len(dst))
		}
	}
}

// BenchmarkTopicRoute10kBindings routes a key through a topic exchange with
// 10,000 bindings that do not match it (one per queue, "dev<i>.*.temp"),
// the shape of the wiring-scale report (2,458 publishes/s before this
// matcher, which split the key again for every binding).
func BenchmarkTopicRoute10kBindings(b *testing.B) {
	r := emptyRouting()
	r.addExchange("t", KindTopic, ExchangeOptions{})
	for i := 0; i < 10000; i++ {
		name := "q" + strings.Repeat("x", i%7) + string(rune('a'+i%26)) + strconv.Itoa(i)
		q := &shards.Queue{Name: name}
		r.addQueue(q)
		r.bind("t", q, "dev"+strconv.Itoa(i)+".*.temp")
	}
	key := []byte("sensor.room1.humidity")
	dst := make([]*shards.Queue, 0, 4)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var err error
		if dst, err = r.Route([]byte("t"), key, dst[:0]); err != nil || len(dst) != 0 {
			b.Fatal(err, len(dst))
		}
	}
}

func TestTopicMatch(t *testing.T) {
	cases := []struct {
		pattern, key string
		want         bool
	}{
		{"a.b", "a.b", true}, {"a.*", "a.b", true}, {"a.*", "a.b.c", false},
		{"a.#", "a", true}, {"a.#", "a.b.c", true}, {"#", "", true}, {"#", "x.y", true},
		{"#.c", "a.b.c", true}, {"#.c", "c", true}, {"#.c", "a.b", false},
		{"a.#.c", "a.c", true}, {"a.#.c", "a.x.y.c", true}, {"a.#.c", "a.x.y", false},
		{"*", "", true}, {"*", "a.b", false}, {"*.*", "a", false}, {"a.*.#", "a", false},
	}
	for _, c := range cases {
		if got := topicMatches(c.pattern, c.key); got != c.want {
			t.Errorf("%q ~ %q = %v, want %v", c.pattern, c.key, got, c.want)
		}
	}
}

// BenchmarkRouteScale routes through a wiring of n queues, each bound to a
// topic exchange by "dev<i>.*.temp" and to a direct exchange by "k<i>":
// a publish to the default exchange (queue lookup), a direct key and a
// topic key that each match one queue, and a topic key that matches none.
func BenchmarkRouteScale(b *testing.B) {
	for _, n := range []int{10, 10_000, 1_000_000} {
		r := emptyRouting()
		r.addExchange("t", KindTopic, ExchangeOptions{})
		r.addExchange("d", KindDirect, ExchangeOptions{})
		for i := range n {
			q := &shards.Queue{Name: "q" + strconv.Itoa(i)}
			r.addQueue(q)
			r.bind("t", q, "dev"+strconv.Itoa(i)+".*.temp")
			r.bind("d", q, "k"+strconv.Itoa(i))
		}
		mid := strconv.Itoa(n / 2)
		for _, c := range []struct{ name, exchange, key string }{
			{"default", "", "q" + mid}, {"direct", "d", "k" + mid},
			{"topic-match", "t", "dev" + mid + ".room1.temp"}, {"topic-none", "t", "sensor.room1.humidity"},
		} {
			b.Run(fmt.Sprintf("bindings=%d/%s", n, c.name), func(b *testing.B) {
				ex, key := []byte(c.exchange), []byte(c.key)
				want := 1
				if c.name == "topic-none" {
					want = 0
				}
				dst := make([]*shards.Queue, 0, 4)
				b.ReportAllocs()
				for b.Loop() {
					var err error
					if dst, err = r.Route(ex, key, dst[:0]); err != nil || len(dst) != want {
						b.Fatal(err, len(dst))
					}
				}
			})
		}
	}
}
