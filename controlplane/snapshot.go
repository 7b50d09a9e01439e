package controlplane

import (
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/berthmq/berth/controlplane/ctlapi"
	"github.com/berthmq/berth/wire"
	"github.com/klauspost/compress/zstd"
)

// snapshotFormat 3 added the primary, 4 the groups' replica sets (after
// the primary); DecodeState still reads formats 2 and 3.
const snapshotFormat = 4

// snapshotBytesMax bounds a decompressed snapshot.
const snapshotBytesMax = 1 << 30

// Encode serializes the state deterministically: equal states give equal
// bytes, which tests use to compare controllers.
func (s *State) Encode() []byte {
	b := make([]byte, 0, 1024)
	b = wire.AppendU8(b, snapshotFormat)
	b = wire.AppendU32(b, s.nextBrokerID)
	b = wire.AppendU32(b, uint32(len(s.brokers)))
	for _, br := range s.Brokers() {
		b = ctlapi.AppendBroker(b, br)
	}
	b = wire.AppendU32(b, s.config.Groups)
	b = wire.AppendU8(b, s.config.Mode)
	b = wire.AppendBool(b, s.config.UncleanElection)
	b = wire.AppendU32(b, uint32(len(s.groups)))
	for i := range s.groups {
		g := &s.groups[i]
		b = wire.AppendU32(b, g.Master)
		b = wire.AppendU32(b, g.Epoch)
		b = wire.AppendU32(b, g.ElectedLogEnd.Epoch)
		b = wire.AppendU64(b, g.ElectedLogEnd.Index)
		b = ctlapi.AppendIDs(b, g.SyncStateSet)
	}
	b = ctlapi.AppendWiring(b, s.Wiring())
	b = wire.AppendU32(b, uint32(len(s.attrs)))
	for _, k := range slices.Sorted(maps.Keys(s.attrs)) {
		b = ctlapi.AppendString(b, k)
		b = ctlapi.AppendString(b, s.attrs[k])
	}
	b = wire.AppendU32(b, uint32(len(s.controllers)))
	for _, id := range slices.Sorted(maps.Keys(s.controllers)) {
		b = wire.AppendU64(b, id)
		b = ctlapi.AppendString(b, s.controllers[id])
	}
	b = wire.AppendU32(b, s.primary)
	b = wire.AppendU32(b, s.primaryEpoch)
	for i := range s.groups {
		b = ctlapi.AppendIDs(b, s.groups[i].Replicas)
	}
	return s.appendUsers(b)
}

// DecodeState rebuilds a state from Encode's output.
func DecodeState(b []byte) (*State, error) {
	s := NewState()
	r := wire.NewReader(b)
	format := r.U8()
	if format < 2 || format > snapshotFormat {
		return nil, fmt.Errorf("controlplane: unknown snapshot format %d", format)
	}
	s.nextBrokerID = r.U32()
	n := r.Count(10)
	for i := 0; i < n; i++ {
		br := ctlapi.ReadBroker(r)
		s.brokers[br.ID] = &br
	}
	s.config.Groups = r.U32()
	s.config.Mode = r.U8()
	s.config.UncleanElection = r.Bool()
	n = r.Count(24)
	if r.Err() == nil && uint32(n) != s.config.Groups {
		return nil, fmt.Errorf("controlplane: snapshot holds %d groups, config says %d", n, s.config.Groups)
	}
	s.groups = make([]ctlapi.Group, n)
	for i := range s.groups {
		g := &s.groups[i]
		g.ID = uint32(i)
		master := r.U32()
		g.Epoch = r.U32()
		g.ElectedLogEnd = ctlapi.LogEnd{Epoch: r.U32(), Index: r.U64()}
		g.SyncStateSet = ctlapi.ReadIDs(r)
		if len(g.SyncStateSet) == 0 {
			g.SyncStateSet = nil
		}
		s.setMaster(g, master)
	}
	w := ctlapi.ReadWiring(r)
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
	n = r.Count(4)
	for i := 0; i < n; i++ {
		k := ctlapi.ReadString(r)
		s.attrs[k] = ctlapi.ReadString(r)
	}
	n = r.Count(10)
	for i := 0; i < n; i++ {
		id := r.U64()
		s.controllers[id] = ctlapi.ReadString(r)
	}
	if format >= 3 {
		s.primary, s.primaryEpoch = r.U32(), r.U32()
		if format >= 4 {
			for i := range s.groups {
				if s.groups[i].Replicas = ctlapi.ReadIDs(r); len(s.groups[i].Replicas) == 0 {
					s.groups[i].Replicas = nil
				}
			}
		}
		s.readUsers(r)
	}
	if err := r.Done(); err != nil {
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
