package controlplane

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// The controller's encodings are stored (events in the raft log, the state
// in snapshots, address books in membership entries) and spoken between
// processes of different builds (service requests and replies). The golden
// files in testdata hold their bytes as an earlier build wrote them; these
// tests fail if any encoding changes. Rewrite a golden file only for a
// deliberate, versioned format change:
//
//	go test ./controlplane -run Golden -rewrite
var rewriteGolden = flag.Bool("rewrite", false, "rewrite the golden files in testdata from the current code")

// golden is one named encoding.
type golden struct {
	name string
	b    []byte
}

// checkGolden compares got, in order, with testdata/file, or rewrites it.
func checkGolden(t *testing.T, file string, got []golden) {
	t.Helper()
	path := filepath.Join("testdata", file)
	if *rewriteGolden {
		var buf bytes.Buffer
		for _, g := range got {
			fmt.Fprintf(&buf, "%s %s\n", g.name, hex.EncodeToString(g.b))
		}
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want := readGolden(t, path)
	if len(want) != len(got) {
		t.Errorf("%s holds %d encodings, the test made %d", path, len(want), len(got))
	}
	for i := 0; i < len(want) && i < len(got); i++ {
		if want[i].name != got[i].name {
			t.Fatalf("%s line %d is %s, the test made %s", path, i+1, want[i].name, got[i].name)
		}
		if !bytes.Equal(want[i].b, got[i].b) {
			t.Errorf("%s changed:\n stored %x\n now    %x", got[i].name, want[i].b, got[i].b)
		}
	}
}

func readGolden(t *testing.T, path string) []golden {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []golden
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		name, hx, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			t.Fatalf("%s: bad line %q", path, sc.Text())
		}
		b, err := hex.DecodeString(hx)
		if err != nil {
			t.Fatalf("%s: %s: %v", path, name, err)
		}
		out = append(out, golden{name, b})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// goldenEvents is one event of every kind, every field set.
func goldenEvents() []Event {
	return []Event{
		&RegisterBroker{ID: 7, Addrs: []string{"10.0.0.7:7400", "[::1]:7400"}, Version: 0x0102},
		&ApplyBrokerID{Requested: 9},
		&ElectMaster{Unclean: true, Groups: []ElectGroup{
			{Group: 2, Epoch: 3, Preferred: 7, Candidates: []Candidate{
				{Broker: 7, Alive: true, LogEnd: LogEnd{Epoch: 3, Index: 1 << 40}},
				{Broker: 8, LogEnd: LogEnd{Epoch: 2, Index: 5}},
			}},
			{Group: 5},
		}},
		&AlterSyncStateSet{Group: 2, Master: 7, Epoch: 4, Set: []uint32{7, 8, 9}},
		&CleanBrokerData{ID: 8},
		&DeclareExchange{Name: "ex", Type: "topic", Durable: true},
		&DeclareQueue{Name: "q", Options: QueueOptions{Durable: true, Exclusive: true, AutoDelete: true,
			TTLMs: 60000, MaxLength: 1000, Overflow: OverflowRejectPublish, DeadLetterExchange: "dlx",
			MaxDeliveries: 5, MaxLengthBytes: 1 << 30, DeadLetterKey: "dead"}},
		&Bind{Exchange: "ex", Queue: "q", Key: "a.*.c"},
		&Unbind{Exchange: "ex", Queue: "q", Key: "a.#"},
		&DeleteQueue{Name: "q2"},
		&DeleteExchange{Name: "ex2"},
		&SetClusterConfig{Groups: 4, Mode: ModeActivePassive, UncleanElection: true},
		&SetAttribute{Key: "k", Value: "v\x00\xff"},
		&ElectPrimary{Epoch: 2, Preferred: 8, Candidates: []PrimaryCandidate{{Broker: 7, Alive: true, Data: 1 << 33}, {Broker: 8}}},
		&ElectPrimary{Epoch: 3},
	}
}

// goldenState is a state with something in every part a snapshot holds.
func goldenState(t *testing.T) *State {
	s := NewState()
	for _, ev := range []Event{
		&ApplyBrokerID{},
		&ApplyBrokerID{Requested: 7},
		&ApplyBrokerID{},
		&RegisterBroker{ID: 1, Addrs: []string{"10.0.0.1:7400"}, Version: 0x0101},
		&RegisterBroker{ID: 7, Addrs: []string{"10.0.0.7:7400", "10.0.1.7:7400"}, Version: 0x0102},
		&RegisterBroker{ID: 8, Addrs: []string{"10.0.0.8:7400"}, Version: 0x0102},
		&SetClusterConfig{Groups: 3, Mode: ModeActivePassive, UncleanElection: true},
		&ElectMaster{Groups: []ElectGroup{{Group: 1, Candidates: []Candidate{
			{Broker: 7, Alive: true}, {Broker: 8, Alive: true}, {Broker: 1, Alive: true}}}}},
		&ElectMaster{Groups: []ElectGroup{{Group: 1, Epoch: 1, Candidates: []Candidate{
			{Broker: 8, Alive: true, LogEnd: LogEnd{Epoch: 1, Index: 42}}, {Broker: 1, Alive: true, LogEnd: LogEnd{Epoch: 1, Index: 41}}}}}},
		&AlterSyncStateSet{Group: 1, Master: 8, Epoch: 2, Set: []uint32{8, 1}},
		&DeclareExchange{Name: "ex", Type: "topic", Durable: true},
		&DeclareExchange{Name: "fan", Type: "fanout"},
		goldenEvents()[6], // the queue with every option
		&DeclareQueue{Name: "plain"},
		&Bind{Exchange: "ex", Queue: "q", Key: "a.*.c"},
		&Bind{Exchange: "fan", Queue: "plain"},
		&SetAttribute{Key: "k", Value: "v"},
		&SetAttribute{Key: "a", Value: "b"},
		&ElectPrimary{Epoch: 0, Candidates: []PrimaryCandidate{{Broker: 7, Alive: true, Data: 3}, {Broker: 8, Alive: true, Data: 9}}},
	} {
		if r := s.Apply(ev); r.Code != CodeOK {
			t.Fatalf("golden state: apply %T: %v", ev, r.Err())
		}
	}
	s.applyMembership(map[uint64]string{1: "10.0.0.1:7402", 2: "10.0.0.2:7402", 3: "10.0.0.3:7402"})
	return s
}

// TestGoldenStoredEncodings pins what controllers store: events, the state
// snapshot and a membership change's address book. Stored bytes must also
// decode back to what wrote them.
func TestGoldenStoredEncodings(t *testing.T) {
	var got []golden
	for i, ev := range goldenEvents() {
		got = append(got, golden{fmt.Sprintf("event/%d-%s", i, reflect.TypeOf(ev).Elem().Name()), EncodeEvent(nil, ev)})
	}
	s := goldenState(t)
	got = append(got, golden{"state", s.Encode()})
	book := map[uint64]string{1: "10.0.0.1:7402", 4: "10.0.0.4:7402"}
	got = append(got, golden{"address-book", encodeAddressBook(book)})
	checkGolden(t, "stored.golden", got)
	if *rewriteGolden {
		return
	}
	// What was stored decodes to what was written, and encodes the same.
	stored := readGolden(t, filepath.Join("testdata", "stored.golden"))
	for i, ev := range goldenEvents() {
		dec, err := DecodeEvent(stored[i].b)
		if err != nil {
			t.Fatalf("%s: %v", stored[i].name, err)
		}
		if !bytes.Equal(EncodeEvent(nil, dec), stored[i].b) {
			t.Errorf("%s: decoded %+v, which encodes differently", stored[i].name, dec)
		}
		if dec.Kind() != ev.Kind() {
			t.Errorf("%s: decoded kind %d", stored[i].name, dec.Kind())
		}
	}
	st, err := DecodeState(stored[len(stored)-2].b)
	if err != nil {
		t.Fatalf("stored state: %v", err)
	}
	if !bytes.Equal(st.Encode(), stored[len(stored)-2].b) {
		t.Error("stored state decodes to a state that encodes differently")
	}
	if p, e := st.Primary(); p != 8 || e != 1 {
		t.Errorf("stored state: primary %d/%d, want 8/1", p, e)
	}
	if g, _ := st.Group(1); g.Master != 8 || g.Epoch != 2 || len(g.SyncStateSet) != 2 {
		t.Errorf("stored state: group 1 is %+v", g)
	}
	if got := st.GroupsMasteredBy(8); len(got) != 1 || got[0] != 1 {
		t.Errorf("stored state: broker 8 masters %v, want [1]", got)
	}
	b, err := decodeAddressBook(stored[len(stored)-1].b)
	if err != nil || len(b) != 2 || b[4] != "10.0.0.4:7402" {
		t.Errorf("stored address book: %v %v", b, err)
	}
}

// TestGoldenReplies pins the service's replies, which clients of other
// builds decode.
func TestGoldenReplies(t *testing.T) {
	s := goldenState(t)
	var got []golden
	for _, q := range []struct {
		name string
		q    readQuery
	}{
		{"wiring", readQuery{query: queryWiring}},
		{"groups", readQuery{query: queryGroups, start: 1, count: 5}},
		{"brokers", readQuery{query: queryBrokers}},
		{"next-broker-id", readQuery{query: queryNextBrokerID}},
		{"attribute", readQuery{query: queryAttribute, key: "k"}},
		{"attribute-missing", readQuery{query: queryAttribute, key: "none"}},
		{"cluster-info", readQuery{query: queryClusterInfo}},
		{"sync-state-set", readQuery{query: querySyncStateSet, group: 1}},
		{"sync-state-set-missing", readQuery{query: querySyncStateSet, group: 9}},
		{"primary", readQuery{query: queryPrimary}},
	} {
		got = append(got, golden{"read/" + q.name, q.q.appendAnswer(nil, s)})
	}
	got = append(got, golden{"result", appendResult(nil, Result{Code: CodeConflict, Value: 1<<32 + 5, Msg: "exchange \"ex\" exists"})})
	_, _, lag := errorStatus(&LaggingError{Leader: "10.0.0.1:7402", Behind: 1234})
	got = append(got, golden{"lagging", lag})
	checkGolden(t, "replies.golden", got)
}
