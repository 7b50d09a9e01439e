package replication

import (
	"errors"
	"fmt"
	"testing"

	"github.com/berthmq/berth/replication/event"
	"github.com/berthmq/berth/replication/group"
	"github.com/berthmq/berth/replication/groups"
	"github.com/berthmq/berth/shards"
	"github.com/berthmq/berth/wire"
)

// TestGroupErrorCodes: a client learns why its command on a replicated
// queue failed from the code, wrapped or not: a proposal whose master
// stepped down with it in the log has an unknown outcome; one the member
// refused (groups.ErrNotProposed) was not taken.
func TestGroupErrorCodes(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code wire.ErrorCode
	}{
		{nil, wire.CodeOK},
		{group.ErrNotEnoughSet, wire.CodeUnavailable},
		{fmt.Errorf("%w: %w", groups.ErrNotProposed, group.ErrNotEnoughSet), wire.CodeUnavailable},
		{group.ErrNotMaster, wire.CodeOutcomeUnknown},
		{fmt.Errorf("propose: %w", group.ErrNotMaster), wire.CodeOutcomeUnknown},
		{fmt.Errorf("%w: %w", groups.ErrNotProposed, group.ErrNotMaster), wire.CodeUnavailable},
		{fmt.Errorf("%w: %w", groups.ErrNotProposed, group.ErrHandover), wire.CodeUnavailable},
		{group.ErrBacklog, wire.CodeResourceLimit},
		{groups.ErrClosed, wire.CodeShutdown},
		{errors.New("disk on fire"), wire.CodeInternal},
	} {
		got := groupError(tc.err)
		if tc.err == nil {
			if got != nil {
				t.Fatalf("nil became %v", got)
			}
			continue
		}
		if c := shards.CodeOf(got); c != tc.code {
			t.Errorf("%v: code %v, want %v", tc.err, c, tc.code)
		}
	}
}

// TestEnqueueEventTrailers: a replicated enqueue carries a priority and
// deliver-at trailer, a producer trailer, both or neither, and each comes
// back as written; trailing bytes that are neither are refused.
func TestEnqueueEventTrailers(t *testing.T) {
	for _, tc := range []struct {
		prio     uint8
		at       int64
		producer uint64
	}{{}, {prio: 7}, {at: 1767225600000000000}, {producer: 0x0123456789abcdef}, {prio: 3, at: 42, producer: 9}} {
		b := shards.NewBody([]byte("ex"), []byte("key"), []byte{1, 2}, []byte("payload"), true)
		b.Priority, b.DeliverAt = tc.prio, tc.at
		data := appendEnqueueEvent(nil, "q", b, 1234, tc.producer, 77)
		b.Unref()
		var enq event.Enqueue
		if err := enq.Decode(data); err != nil {
			t.Fatalf("%+v: refused: %v", tc, err)
		}
		if string(enq.Queue) != "q" {
			t.Fatalf("%+v: queue %q", tc, enq.Queue)
		}
		ev := enqueueEventOf(&enq, true)
		got := ev.body
		if ev.expiresAt != 1234 || got.Priority != tc.prio || got.DeliverAt != tc.at || !got.Persistent ||
			string(got.Exchange) != "ex" || string(got.RoutingKey) != "key" || string(got.Payload) != "payload" {
			t.Fatalf("%+v: decoded %+v (priority %d, deliver-at %d)", tc, ev, got.Priority, got.DeliverAt)
		}
		want := uint64(0)
		if tc.producer != 0 {
			want = 77
		}
		if ev.producer != tc.producer || ev.producerSeq != want {
			t.Fatalf("%+v: producer %x seq %d", tc, ev.producer, ev.producerSeq)
		}
		got.Unref()
		// Five stray bytes are no trailer.
		if err := enq.Decode(append(data, 1, 2, 3, 4, 5)); err == nil {
			t.Fatalf("%+v: an event with 5 stray bytes decoded", tc)
		}
	}
}

// TestApplyRefusesUndecodable: apply reports a committed event it cannot
// decode, of every kind, rather than skip it (the node then stops this
// member of the group).
func TestApplyRefusesUndecodable(t *testing.T) {
	r := &Replicator{}
	b := shards.NewBody([]byte("ex"), []byte("key"), nil, []byte("payload"), true)
	enq := appendEnqueueEvent(nil, "q", b, 0, 9, 1)
	b.Unref()
	for _, tc := range []struct {
		name string
		data []byte
		want error
	}{
		{"unknown-kind", []byte{'Z'}, event.ErrUnknownKind},
		{"newer-enqueue", append([]byte{event.Marker, byte(event.KindEnqueue), event.EnqueueVersion + 1, 0}, enq[4:]...), event.ErrNewerVersion},
		{"unknown-flag", append([]byte{event.Marker, byte(event.KindEnqueue), 1, 0x80}, enq[4:]...), event.ErrUnknownFlags},
		{"truncated-enqueue", enq[:len(enq)-3], event.ErrMalformed},
		{"truncated-removes", event.AppendRemoves(nil, "q", []uint64{1, 2}, event.Stamp{})[:20], event.ErrMalformed},
		{"legacy-remove-truncated", []byte{'R', 0, 1, 'q', 0, 0}, event.ErrMalformed},
		{"barrier-trailing", append(event.AppendBarrier(nil), 1), event.ErrMalformed},
		{"delete-truncated", event.AppendDelete(nil, "queue")[:7], event.ErrMalformed},
	} {
		if err := r.apply(3, wire.GroupEntry{Index: 11, Data: tc.data}); !errors.Is(err, tc.want) {
			t.Errorf("%s: apply: %v, want %v", tc.name, err, tc.want)
		}
	}
}
