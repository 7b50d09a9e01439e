package controlplane

import (
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/klauspost/compress/zstd"
)

// snapshotFormat 3 added the primary; DecodeState still reads format 2.
const snapshotFormat = 3

// snapshotBytesMax bounds a decompressed snapshot.
const snapshotBytesMax = 1 << 30

// Encode serializes the state deterministically: equal states give equal
// bytes, which tests use to compare controllers.
func (s *State) Encode() []byte {
	e := encoder{b: make([]byte, 0, 1024)}
	e.u8(snapshotFormat)
	e.u32(s.nextBrokerID)
	e.u32(uint32(len(s.brokers)))
	for _, b := range s.Brokers() {
		(&RegisterBroker{ID: b.ID, Addrs: b.Addrs, Version: b.Version}).encode(&e)
	}
	e.u32(s.config.Groups)
	e.u8(s.config.Mode)
	e.boolean(s.config.UncleanElection)
	e.u32(uint32(len(s.groups)))
	for i := range s.groups {
		g := &s.groups[i]
		e.u32(g.Master)
		e.u32(g.Epoch)
		e.u32(g.ElectedLogEnd.Epoch)
		e.u64(g.ElectedLogEnd.Index)
		encodeIDs(&e, g.SyncStateSet)
	}
	encodeWiring(&e, s.Wiring())
	e.u32(uint32(len(s.attrs)))
	for _, k := range slices.Sorted(maps.Keys(s.attrs)) {
		e.str(k)
		e.str(s.attrs[k])
	}
	e.u32(uint32(len(s.controllers)))
	for _, id := range slices.Sorted(maps.Keys(s.controllers)) {
		e.u64(id)
		e.str(s.controllers[id])
	}
	e.u32(s.primary)
	e.u32(s.primaryEpoch)
	return e.b
}

func encodeWiring(e *encoder, w Wiring) {
	e.u32(uint32(len(w.Exchanges)))
	for i := range w.Exchanges {
		w.Exchanges[i].encode(e)
	}
	e.u32(uint32(len(w.Queues)))
	for i := range w.Queues {
		w.Queues[i].encode(e)
	}
	e.u32(uint32(len(w.Bindings)))
	for _, b := range w.Bindings {
		e.str(b.Exchange)
		e.str(b.Queue)
		e.str(b.Key)
	}
}

func decodeWiring(d *decoder) Wiring {
	var w Wiring
	n := d.count(5)
	w.Exchanges = make([]DeclareExchange, n)
	for i := range w.Exchanges {
		w.Exchanges[i].decode(d)
	}
	n = d.count(20)
	w.Queues = make([]DeclareQueue, n)
	for i := range w.Queues {
		w.Queues[i].decode(d)
	}
	n = d.count(6)
	w.Bindings = make([]Binding, n)
	for i := range w.Bindings {
		w.Bindings[i] = Binding{d.str(), d.str(), d.str()}
	}
	return w
}

// DecodeState rebuilds a state from Encode's output.
func DecodeState(b []byte) (*State, error) {
	s := NewState()
	d := decoder{b: b}
	format := d.u8()
	if format != 2 && format != snapshotFormat {
		return nil, fmt.Errorf("controlplane: unknown snapshot format %d", format)
	}
	s.nextBrokerID = d.u32()
	n := d.count(10)
	for i := 0; i < n; i++ {
		var rb RegisterBroker
		rb.decode(&d)
		s.brokers[rb.ID] = &Broker{ID: rb.ID, Addrs: rb.Addrs, Version: rb.Version}
	}
	s.config.Groups = d.u32()
	s.config.Mode = d.u8()
	s.config.UncleanElection = d.boolean()
	n = d.count(24)
	if d.err == nil && uint32(n) != s.config.Groups {
		return nil, fmt.Errorf("controlplane: snapshot holds %d groups, config says %d", n, s.config.Groups)
	}
	s.groups = make([]Group, n)
	for i := range s.groups {
		g := &s.groups[i]
		g.ID = uint32(i)
		master := d.u32()
		g.Epoch = d.u32()
		g.ElectedLogEnd = LogEnd{d.u32(), d.u64()}
		g.SyncStateSet = decodeIDs(&d)
		if len(g.SyncStateSet) == 0 {
			g.SyncStateSet = nil
		}
		s.setMaster(g, master)
	}
	w := decodeWiring(&d)
	for _, x := range w.Exchanges {
		s.exchanges[x.Name] = x
	}
	for _, q := range w.Queues {
		s.queues[q.Name] = q.Options
	}
	for _, b := range w.Bindings {
		addIndex(s.byExchange, b.Exchange, b)
		addIndex(s.byQueue, b.Queue, b)
	}
	n = d.count(4)
	for i := 0; i < n; i++ {
		k := d.str()
		s.attrs[k] = d.str()
	}
	n = d.count(10)
	for i := 0; i < n; i++ {
		id := d.u64()
		s.controllers[id] = d.str()
	}
	if format >= 3 {
		s.primary, s.primaryEpoch = d.u32(), d.u32()
	}
	if err := d.finish(); err != nil {
		return nil, fmt.Errorf("controlplane: decode snapshot: %w", err)
	}
	s.recomputeVersion()
	return s, nil
}

// zstd coders are costly to build and safe for concurrent EncodeAll/DecodeAll.
var (
	zstdOnce sync.Once
	zstdEnc  *zstd.Encoder
	zstdDec  *zstd.Decoder
)

func zstdCoders() (*zstd.Encoder, *zstd.Decoder) {
	zstdOnce.Do(func() {
		var err error
		zstdEnc, err = zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(1))
		if err != nil {
			panic(err) // only on invalid options, which are constants here
		}
		zstdDec, err = zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(snapshotBytesMax))
		if err != nil {
			panic(err)
		}
	})
	return zstdEnc, zstdDec
}

func compressSnapshot(raw []byte) []byte {
	enc, _ := zstdCoders()
	return enc.EncodeAll(raw, nil)
}

func decompressSnapshot(b []byte) ([]byte, error) {
	_, dec := zstdCoders()
	raw, err := dec.DecodeAll(b, nil)
	if err != nil {
		return nil, fmt.Errorf("controlplane: decompress snapshot: %w", err)
	}
	return raw, nil
}
