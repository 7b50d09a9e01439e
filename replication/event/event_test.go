package event

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/berthmq/berth/wire"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// legacyAppendEnqueue is the encoder of the older format's enqueue as
// server/replicate.go (now replication/replicate.go) wrote it before this
// package (appendEnqueueEvent), kept to write the older format's golden
// files.
func legacyAppendEnqueue(e *Enqueue) []byte {
	data := []byte{legacyEnqueue}
	data = wire.AppendStrBytes(data, e.Queue)
	data = wire.AppendU64(data, uint64(e.ExpiresAt))
	data = wire.AppendBool(data, e.Persistent)
	data = wire.AppendStrBytes(data, e.Exchange)
	data = wire.AppendStrBytes(data, e.RoutingKey)
	data = wire.AppendBytes(data, e.Props)
	data = wire.AppendBytes(data, e.Payload)
	if e.Priority != 0 || e.DeliverAt != 0 {
		data = wire.AppendU8(data, e.Priority)
		data = wire.AppendU64(data, uint64(e.DeliverAt))
	}
	if e.Producer != 0 {
		data = wire.AppendU64(data, e.Producer)
		data = wire.AppendU64(data, e.ProducerSeq)
	}
	return data
}

func legacyAppendRemoves(queue string, seqs []uint64) []byte {
	data := wire.AppendStr([]byte{legacyRemoves}, queue)
	data = binary.BigEndian.AppendUint32(data, uint32(len(seqs)))
	for _, seq := range seqs {
		data = binary.BigEndian.AppendUint64(data, seq)
	}
	return data
}

func enqueue(schedule, producer bool) Enqueue {
	e := Enqueue{Queue: []byte("orders"), ExpiresAt: 1_900_000_000_000_000_000, Persistent: true,
		Exchange: []byte("amq.direct"), RoutingKey: []byte("orders.eu"), Props: []byte("ct=json"), Payload: []byte(`{"id":7}`)}
	if schedule {
		e.Priority, e.DeliverAt = 9, 1_800_000_000_000_000_000
	}
	if producer {
		e.Producer, e.ProducerSeq = 0xfeedface, 42
	}
	return e
}

type golden struct {
	name   string
	legacy []byte // the older format's bytes; nil for a new-format case
	want   Event  // what it decodes to (Header.Kind set)
}

func goldens() []golden {
	var gs []golden
	for _, c := range []struct {
		tag                string
		schedule, producer bool
	}{{"plain", false, false}, {"schedule", true, false}, {"producer", false, true}, {"both", true, true}} {
		e := enqueue(c.schedule, c.producer)
		gs = append(gs,
			golden{name: "enqueue-v1-" + c.tag, want: Event{Header: Header{Kind: KindEnqueue}, Enqueue: e}},
			golden{name: "enqueue-legacy-" + c.tag, legacy: legacyAppendEnqueue(&e), want: Event{Header: Header{Kind: KindEnqueue}, Enqueue: e}})
	}
	seqs := []uint64{3, 5, 1 << 40}
	st := Stamp{Broker: 2, Gen: 9, Tag: 1<<33 | 17}
	gs = append(gs,
		golden{name: "removes-v1", want: Event{Header: Header{Kind: KindRemoves}, Removes: Removes{Queue: []byte("orders"), Seqs: seqs}}},
		golden{name: "removes-legacy", legacy: legacyAppendRemoves("orders", seqs), want: Event{Header: Header{Kind: KindRemoves}, Removes: Removes{Queue: []byte("orders"), Seqs: seqs}}},
		golden{name: "remove-legacy", legacy: binary.BigEndian.AppendUint64(wire.AppendStr([]byte{legacyRemove}, "orders"), 77),
			want: Event{Header: Header{Kind: KindRemove}, Remove: Remove{Queue: []byte("orders"), Seq: 77}}},
		golden{name: "barrier-v1", want: Event{Header: Header{Kind: KindBarrier}}},
		golden{name: "barrier-legacy", legacy: []byte{legacyBarrier}, want: Event{Header: Header{Kind: KindBarrier}}},
		golden{name: "delete-v1", want: Event{Header: Header{Kind: KindDelete}, Delete: Delete{Queue: []byte("orders")}}},
		golden{name: "delete-legacy", legacy: wire.AppendStr([]byte{legacyDelete}, "orders"), want: Event{Header: Header{Kind: KindDelete}, Delete: Delete{Queue: []byte("orders")}}},
		golden{name: "acquires-v1", want: Event{Header: Header{Kind: KindAcquires}, Acquires: Acquires{Queue: []byte("orders"), Seqs: seqs}}},
		golden{name: "releases-v1", want: Event{Header: Header{Kind: KindReleases}, Releases: Releases{Queue: []byte("orders"), Seqs: seqs}}},
		golden{name: "releases-v1-unseen", want: Event{Header: Header{Kind: KindReleases}, Releases: Releases{Queue: []byte("orders"), Seqs: seqs, Unseen: true}}},
		golden{name: "acquires-v1-window", want: Event{Header: Header{Kind: KindAcquires}, Acquires: Acquires{Queue: []byte("orders"), Seqs: seqs, Window: 1000}}},
		golden{name: "acquires-v1-none", want: Event{Header: Header{Kind: KindAcquires}, Acquires: Acquires{Queue: []byte("orders")}}},
		golden{name: "acquires-v1-stamp", want: Event{Header: Header{Kind: KindAcquires}, Acquires: Acquires{Queue: []byte("orders"), Seqs: seqs, Window: 7, Stamp: st}}},
		golden{name: "releases-v1-stamp", want: Event{Header: Header{Kind: KindReleases}, Releases: Releases{Queue: []byte("orders"), Seqs: seqs, Unseen: true, Stamp: st}}},
		golden{name: "removes-v1-stamp", want: Event{Header: Header{Kind: KindRemoves}, Removes: Removes{Queue: []byte("orders"), Seqs: seqs, Stamp: st}}},
		golden{name: "own-v1", want: Event{Header: Header{Kind: KindOwn}, Own: Own{Queue: []byte("orders"), Gen: 4, Owner: 3}}},
		golden{name: "own-v1-requeue", want: Event{Header: Header{Kind: KindOwn}, Own: Own{Queue: []byte("orders"), Gen: 5, Requeue: 2}}},
		golden{name: "own-v1-stamp", want: Event{Header: Header{Kind: KindOwn}, Own: Own{Queue: []byte("orders"), Gen: 6, Owner: 1, Stamp: st}}},
		golden{name: "want-v1", want: Event{Header: Header{Kind: KindWant}, Want: Want{Queue: []byte("orders"), Broker: 2}}},
		golden{name: "want-v1-withdraw", want: Event{Header: Header{Kind: KindWant}, Want: Want{Queue: []byte("orders"), Broker: 2, Withdraw: true}}},
		golden{name: "want-v1-stamp", want: Event{Header: Header{Kind: KindWant}, Want: Want{Queue: []byte("orders"), Broker: 2, Stamp: st}}},
	)
	return gs
}

// The golden files hold one event each, in hex. The new format's are
// what the encoders write today; the older format's what brokers wrote
// before this package, which group journals on disk still hold.
func readGolden(t *testing.T, name string) []byte {
	t.Helper()
	text, err := os.ReadFile(filepath.Join("testdata", name+".hex"))
	if err != nil {
		t.Fatalf("%v (run with -update to write it)", err)
	}
	data, err := hex.DecodeString(strings.TrimSpace(string(text)))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return data
}

func TestGolden(t *testing.T) {
	for _, g := range goldens() {
		t.Run(g.name, func(t *testing.T) {
			var enc []byte
			if g.legacy != nil {
				enc = g.legacy
			} else {
				enc = Append(nil, &g.want)
			}
			path := filepath.Join("testdata", g.name+".hex")
			if *update {
				if err := os.WriteFile(path, []byte(hex.EncodeToString(enc)+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			data := readGolden(t, g.name)
			if g.legacy == nil && !bytes.Equal(enc, data) {
				t.Fatalf("encoding changed:\n got %x\nwant %x", enc, data)
			}
			var ev Event
			if err := Decode(data, &ev); err != nil {
				t.Fatalf("decode: %v", err)
			}
			want := g.want
			want.Header = Header{Kind: g.want.Header.Kind, Legacy: g.legacy != nil}
			if g.legacy == nil {
				want.Header.Version = 1
				want.Header.Flags = data[3]
			}
			if !reflect.DeepEqual(ev, want) {
				t.Fatalf("decoded\n %+v\nwant\n %+v", ev, want)
			}
			if g.legacy == nil && data[0] != Marker {
				t.Fatalf("a new-format event starts with %#x", data[0])
			}
			if g.legacy != nil && data[0] == Marker {
				t.Fatal("an older-format event starts with the marker")
			}
		})
	}
}

// TestEnqueueFlags pins which flag bits each optional part sets.
func TestEnqueueFlags(t *testing.T) {
	for _, c := range []struct {
		schedule, producer bool
		flags              uint8
	}{{false, false, 0}, {true, false, FlagSchedule}, {false, true, FlagProducer}, {true, true, FlagSchedule | FlagProducer}} {
		e := enqueue(c.schedule, c.producer)
		data := AppendEnqueue(nil, &e)
		if len(data) != e.Size() {
			t.Fatalf("Size %d, encoded %d", e.Size(), len(data))
		}
		if !bytes.Equal(data[:4], []byte{Marker, byte(KindEnqueue), EnqueueVersion, c.flags}) {
			t.Fatalf("header %x, want flags %#x", data[:4], c.flags)
		}
		if !IsEnqueue(data) || !IsEnqueue(legacyAppendEnqueue(&e)) {
			t.Fatal("IsEnqueue false for an enqueue")
		}
	}
	if IsEnqueue(AppendBarrier(nil)) || IsEnqueue([]byte{legacyRemoves}) || IsEnqueue(nil) {
		t.Fatal("IsEnqueue true for another kind")
	}
}

// TestRejects: what a reader does not know, or what is malformed, is an
// error of its kind, never a skip.
// with3 is data with header flags f.
func with3(data []byte, f uint8) []byte { data[3] = f; return data }

func TestRejects(t *testing.T) {
	e := enqueue(true, true)
	good := AppendEnqueue(nil, &e)
	with := func(i int, b byte) []byte { d := bytes.Clone(good); d[i] = b; return d }
	for _, c := range []struct {
		name string
		data []byte
		want error
	}{
		{"empty", nil, ErrMalformed},
		{"unknown-first-byte", []byte{'Z', 1, 2}, ErrUnknownKind},
		{"short-header", []byte{Marker, byte(KindEnqueue), 1}, ErrMalformed},
		{"unknown-kind", with(1, 99), ErrUnknownKind},
		{"legacy-only-kind", with(1, byte(KindRemove)), ErrUnknownKind},
		{"version-0", with(2, 0), ErrMalformed},
		{"newer-version", with(2, EnqueueVersion+1), ErrNewerVersion},
		{"unknown-flag", with(3, FlagSchedule|FlagProducer|1<<5), ErrUnknownFlags},
		{"flag-without-part", with(3, FlagSchedule), ErrMalformed}, // 16 bytes of producer left over
		{"trailing-byte", append(bytes.Clone(good), 0), ErrMalformed},
		{"truncated", good[:len(good)-1], ErrMalformed},
		{"barrier-flags", []byte{Marker, byte(KindBarrier), 1, 1}, ErrUnknownFlags},
		{"barrier-newer", []byte{Marker, byte(KindBarrier), 2, 0}, ErrNewerVersion},
		{"barrier-trailing", []byte{Marker, byte(KindBarrier), 1, 0, 0}, ErrMalformed},
		{"delete-newer", []byte{Marker, byte(KindDelete), DeleteVersion + 1, 0, 0, 1, 'q'}, ErrNewerVersion},
		{"removes-over-bound", AppendRemoves(nil, "q", make([]uint64, SeqsMax+1), Stamp{}), ErrMalformed},
		{"stamp-of-broker-0", append(with3(AppendRemoves(nil, "q", nil, Stamp{}), FlagStamp), make([]byte, StampLen)...), ErrMalformed},
		{"stamp-truncated", AppendRemoves(nil, "q", nil, Stamp{Broker: 1})[:HeaderLen+2+1+4+StampLen-1], ErrMalformed},
		{"own-gen-0", AppendOwn(nil, &Own{Queue: []byte("q")}), ErrMalformed},
		{"own-requeue-0", append(with3(AppendOwn(nil, &Own{Queue: []byte("q"), Gen: 1}), FlagRequeue), 0, 0, 0, 0), ErrMalformed},
		{"own-unknown-flag", with3(AppendOwn(nil, &Own{Queue: []byte("q"), Gen: 1}), 1<<6), ErrUnknownFlags},
		{"want-broker-0", AppendWant(nil, &Want{Queue: []byte("q")}), ErrMalformed},
		{"want-stamp-of-another", AppendWant(nil, &Want{Queue: []byte("q"), Broker: 1, Stamp: Stamp{Broker: 2}}), ErrMalformed},
		{"want-trailing", append(AppendWant(nil, &Want{Queue: []byte("q"), Broker: 1}), 0), ErrMalformed},
		{"legacy-enqueue-odd-trailer", append(legacyAppendEnqueue(&e), 0), ErrMalformed},
	} {
		t.Run(c.name, func(t *testing.T) {
			var ev Event
			err := Decode(c.data, &ev)
			if !errors.Is(err, c.want) {
				t.Fatalf("Decode: %v, want %v", err, c.want)
			}
		})
	}
	// A flag set over a part of zeros has a second encoding: refused.
	zero := AppendEnqueue(nil, &Enqueue{Queue: []byte("q")})
	zero[3] = FlagSchedule
	zero = append(zero, make([]byte, 9)...)
	var ev Enqueue
	if err := ev.Decode(zero); !errors.Is(err, ErrMalformed) {
		t.Fatalf("a schedule of zeros: %v", err)
	}
	// A decoder of one kind refuses another kind.
	if err := ev.Decode(AppendBarrier(nil)); !errors.Is(err, ErrWrongKind) {
		t.Fatalf("Enqueue.Decode of a barrier: %v", err)
	}
}

func TestEnqueueDecodeAllocatesNothing(t *testing.T) {
	e := enqueue(true, true)
	data := AppendEnqueue(nil, &e)
	var got Enqueue
	if n := testing.AllocsPerRun(100, func() {
		if err := got.Decode(data); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Fatalf("Enqueue.Decode allocates %v times", n)
	}
	// Zero-copy: the payload aliases the event.
	if &got.Payload[0] != &data[len(data)-25-len(e.Payload)] {
		t.Fatal("the payload is a copy")
	}
}

func FuzzDecode(f *testing.F) {
	for _, g := range goldens() {
		if g.legacy != nil {
			f.Add(g.legacy)
		} else {
			f.Add(Append(nil, &g.want))
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var ev Event
		if err := Decode(data, &ev); err != nil {
			return
		}
		if ev.Header.Legacy {
			// The older format re-encodes to the new one, which decodes
			// to the same event.
			var again Event
			if err := Decode(Append(nil, &ev), &again); err != nil {
				t.Fatalf("re-encoded %x: %v", data, err)
			}
			return
		}
		if enc := Append(nil, &ev); !bytes.Equal(enc, data) {
			t.Fatalf("re-encoded\n %x\nfrom\n %x", enc, data)
		}
	})
}

func BenchmarkDecode(b *testing.B) {
	e := enqueue(false, true)
	e.Payload = make([]byte, 256)
	for _, c := range []struct {
		name string
		data []byte
	}{{"format=v1", AppendEnqueue(nil, &e)}, {"format=legacy", legacyAppendEnqueue(&e)}} {
		b.Run("kind=enqueue/"+c.name, func(b *testing.B) {
			b.SetBytes(int64(len(c.data)))
			b.ReportAllocs()
			var got Enqueue
			for b.Loop() {
				if err := got.Decode(c.data); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
