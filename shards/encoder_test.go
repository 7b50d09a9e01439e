package shards

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/berthmq/berth/wire"
)

// heldWriter keeps each write's vector and holds its done until release,
// so that every buffer and body of the writes stays as it was written.
type heldWriter struct {
	writes [][][]byte
	dones  []func()
}

func (w *heldWriter) WriteAsync(bufs [][]byte, done func()) error {
	w.writes = append(w.writes, slices.Clone(bufs))
	w.dones = append(w.dones, done)
	return nil
}

// take returns the writes so far and finishes them.
func (w *heldWriter) take() (writes [][][]byte, finish func()) {
	writes, dones := w.writes, w.dones
	w.writes, w.dones = nil, nil
	return writes, func() {
		for _, d := range dones {
			d()
		}
	}
}

// failure is a command the test fails, as the old encoding saw it.
type failure struct {
	id   uint64
	code wire.ErrorCode
	text string
}

// oldConsumer is one consumer's pending deliveries before a flush.
type oldConsumer struct {
	id      uint32
	pending []Delivery
}

// oldEncode is a copy of what Shard.flush and Shard.appendDeliver wrote
// for one session before there was an Encoder: the reference the native
// encoder must match byte for byte and vector entry for vector entry.
// isPay marks the entries that are payloads (not copied, so they must
// alias the bodies).
func oldEncode(v wire.Version, frameMax int, ranges []wire.Range, errs []failure, cons []oldConsumer) (writes [][][]byte, isPay [][]bool) {
	var buf []byte
	var cuts []int
	var pays [][]byte
	submit := func() {
		var vec [][]byte
		var pay []bool
		prev := 0
		for i, cut := range cuts {
			if cut > prev {
				vec, pay = append(vec, buf[prev:cut]), append(pay, false)
			}
			if len(pays[i]) > 0 {
				vec, pay = append(vec, pays[i]), append(pay, true)
			}
			prev = cut
		}
		if len(buf) > prev {
			vec, pay = append(vec, buf[prev:]), append(pay, false)
		}
		if len(vec) > 0 {
			writes, isPay = append(writes, vec), append(isPay, pay)
		}
		buf, cuts, pays = nil, nil, nil
	}
	buf = wire.AppendCompletes(buf, v, ranges)
	for _, e := range errs {
		buf = wire.AppendError(buf, v, e.id, e.code, e.text)
	}
	for _, con := range cons {
		p := con.pending
		for len(p) > 0 {
			room := (IovecsMax - 1 - 2*len(cuts)) / 2
			if room < 16 {
				submit()
				room = (IovecsMax - 1) / 2
			}
			n, size := 0, wire.HeaderSize+4+2
			for n < len(p) && n < wire.BatchMax && n < room {
				b := p[n].Body
				m := wire.DeliverMessageOverhead + len(b.Exchange) + len(b.RoutingKey) + len(b.Props) + len(b.Payload)
				if n > 0 && size+m > frameMax {
					break
				}
				size += m
				n++
			}
			var start int
			buf, start = wire.AppendDeliverStart(buf, v, con.id, n)
			extra := 0
			for i := 0; i < n; i++ {
				d := &p[i]
				b := d.Body
				buf = wire.AppendDeliverMessageHead(buf, d.Tag, d.DeliveryCount, d.Flags, b.Exchange, b.RoutingKey, b.Props, len(b.Payload))
				cuts = append(cuts, len(buf))
				pays = append(pays, b.Payload)
				extra += len(b.Payload)
			}
			wire.EndFrame(buf, start, extra)
			p = p[n:]
		}
	}
	submit()
	return writes, isPay
}

// shardWithQueues is a broker's one shard, driven by hand, holding plain
// queues of the names given.
func shardWithQueues(names ...string) (*Shard, []*Queue) {
	s := New(Config{Shards: 1}).shards[0]
	var qs []*Queue
	for _, name := range names {
		q := NewQueue(name, QueueOptions{}, 0, &s.pool)
		s.queues.add(q)
		qs = append(qs, q)
	}
	return s, qs
}

// pendingOf is what the shard will flush for sess: its completed ranges
// and its consumers' deliveries, copied.
func pendingOf(s *Shard, sess *Session) ([]wire.Range, []oldConsumer) {
	o := s.outs[sess]
	if o == nil {
		return nil, nil
	}
	var cons []oldConsumer
	for _, c := range o.consumers {
		cons = append(cons, oldConsumer{c.ID, slices.Clone(c.pending)})
	}
	return slices.Clone(o.ranges), cons
}

// frameCounts counts the frames of each type in writes, checking that
// every write is whole frames and within IovecsMax entries.
func frameCounts(t *testing.T, writes [][][]byte) map[wire.Type]int {
	t.Helper()
	counts := map[wire.Type]int{}
	for i, vec := range writes {
		if len(vec) > IovecsMax {
			t.Fatalf("write %d has %d vector entries, above IovecsMax %d", i, len(vec), IovecsMax)
		}
		b := bytes.Join(vec, nil)
		for len(b) > 0 {
			h, _, n, err := wire.Next(b, wire.FrameSizeMax)
			if err != nil || n == 0 {
				t.Fatalf("write %d: %d bytes left that are not a whole frame (%v)", i, len(b), err)
			}
			counts[h.Type]++
			b = b[n:]
		}
	}
	return counts
}

// TestNativeEncoderMatchesOldEncoding drives a shard by hand through
// cycles that mix completions (more ranges than one COMPLETE holds),
// errors (codes a 1.0 session must get mapped, a text to truncate) and
// deliveries (frames cut by a small frame max, a message larger than it,
// empty payloads, redeliveries, more messages than one vector holds), for
// a session with no Encoder and one with an explicit NativeEncoder of
// version 1.0. Each session's writes must equal, vector entry for entry,
// what the encoding before Encoder wrote, payloads still not copied.
func TestNativeEncoderMatchesOldEncoding(t *testing.T) {
	s, qs := shardWithQueues("qa", "qb", "qc", "qd")
	qa, qb, qc, qd := qs[0], qs[1], qs[2], qs[3]
	wa, wb := &heldWriter{}, &heldWriter{}
	a := &Session{ID: 1, Version: wire.Current, FrameMax: wire.FrameSizeMin, Out: wa}
	b := &Session{ID: 2, Version: wire.Version10, FrameMax: 3 * wire.FrameSizeMin, Out: wb,
		Encoder: NativeEncoder{Version: wire.Version10}}
	type sessCase struct {
		name string
		sess *Session
		w    *heldWriter
		errs []failure
	}
	cases := []*sessCase{{name: "default", sess: a, w: wa}, {name: "explicit-1.0", sess: b, w: wb}}
	var finishes []func()
	defer func() {
		for _, f := range finishes {
			f()
		}
	}()
	// check flushes the shard and compares each session's writes with the
	// old encoding of what was pending.
	type result struct {
		writes int
		frames map[wire.Type]int
	}
	check := func(cycle string) map[*Session]result {
		t.Helper()
		type want struct {
			writes [][][]byte
			isPay  [][]bool
		}
		wants := map[*Session]want{}
		for _, c := range cases {
			ranges, cons := pendingOf(s, c.sess)
			w, p := oldEncode(c.sess.Version, int(c.sess.FrameMax), ranges, c.errs, cons)
			wants[c.sess] = want{w, p}
			c.errs = nil
		}
		s.flush()
		results := map[*Session]result{}
		for _, c := range cases {
			got, finish := c.w.take()
			finishes = append(finishes, finish)
			want := wants[c.sess]
			if len(got) != len(want.writes) {
				t.Fatalf("%s, session %s: %d writes, the old encoding made %d", cycle, c.name, len(got), len(want.writes))
			}
			for i := range got {
				if len(got[i]) != len(want.writes[i]) {
					t.Fatalf("%s, session %s, write %d: %d vector entries, the old encoding made %d", cycle, c.name, i, len(got[i]), len(want.writes[i]))
				}
				for j := range got[i] {
					if !bytes.Equal(got[i][j], want.writes[i][j]) {
						t.Fatalf("%s, session %s, write %d, entry %d: %d bytes differ from the old encoding's %d:\n got %x\nwant %x",
							cycle, c.name, i, j, len(got[i][j]), len(want.writes[i][j]), head(got[i][j]), head(want.writes[i][j]))
					}
					if want.isPay[i][j] && &got[i][j][0] != &want.writes[i][j][0] {
						t.Fatalf("%s, session %s, write %d, entry %d: a payload was copied, not written from its body", cycle, c.name, i, j)
					}
				}
			}
			results[c.sess] = result{len(got), frameCounts(t, got)}
		}
		return results
	}
	publish := func(q *Queue, n int, size func(i int) int) {
		for i := range n {
			var exchange, props []byte
			if i%3 == 0 {
				exchange, props = []byte("ex"), []byte("props-"+strconv.Itoa(i))
			}
			payload := bytes.Repeat([]byte{byte(i)}, size(i))
			s.handleCmd(Publish{Queue: q, Body: NewBody(exchange, []byte(q.Name), props, payload, i%2 == 0), Now: 1}.Command())
		}
	}

	// Cycle 1: the subscriptions complete.
	s.handleCmd(Subscribe{Sess: a, CmdID: 1, Queue: qa, ConsumerID: 1, Credit: 1 << 16}.Command())
	s.handleCmd(Subscribe{Sess: a, CmdID: 2, Queue: qb, ConsumerID: 2, Credit: 1 << 16}.Command())
	s.handleCmd(Subscribe{Sess: b, CmdID: 1, Queue: qc, ConsumerID: 9, Credit: 1 << 16}.Command())
	s.handleCmd(Subscribe{Sess: a, CmdID: 3, Queue: qd, ConsumerID: 3, Credit: 1 << 16}.Command())
	if n := check("subscribe")[a].frames[wire.TypeComplete]; n != 1 {
		t.Fatalf("subscribe: %d COMPLETE frames, want 1", n)
	}

	// Cycle 2: everything at once.
	for i := range wire.RangesMax + 100 { // ids with gaps: a range each
		s.completeCmd(a, uint64(10+2*i), nil, nil)
	}
	for i := range 5 {
		s.completeCmd(b, uint64(100+i), nil, nil)
	}
	fails := []failure{
		{30000, wire.CodeNotFound, "no queue x"},
		{30001, wire.CodeOutcomeUnknown, "lost track of it"},
		{30002, wire.CodeResourceLimit, strings.Repeat("long ", wire.TextLenMax)},
	}
	for _, c := range cases {
		for _, f := range fails {
			s.completeCmd(c.sess, f.id, nil, Errorf(f.code, "%s", f.text))
			c.errs = append(c.errs, failure{f.id, f.code, "shards: " + f.text})
		}
	}
	publish(qa, 1300, func(i int) int { return i % 300 }) // over IovecsMax, and empty payloads
	publish(qb, 40, func(i int) int {
		if i%10 == 0 {
			return 2 * wire.FrameSizeMin // alone in a frame, larger than frame max
		}
		return 1500
	})
	publish(qc, 700, func(i int) int { return 100 + i%50 })
	s.dispatchDirty()
	res := check("mixed")
	// 1340 payloads need three batches; a 4 KiB frame holds about 25 of
	// qa's messages and two of qb's.
	if ra := res[a]; ra.writes < 3 || ra.frames[wire.TypeComplete] != 2 || ra.frames[wire.TypeError] != 3 || ra.frames[wire.TypeDeliver] < 1300/25+40/2 {
		t.Fatalf("mixed: session default got %d writes of %v frames, want 3 or more of 2 COMPLETE, 3 ERROR and DELIVERs cut by frame max", ra.writes, ra.frames)
	}
	if rb := res[b]; rb.writes < 2 || rb.frames[wire.TypeError] != 3 || rb.frames[wire.TypeDeliver] < 2 {
		t.Fatalf("mixed: session explicit-1.0 got %d writes of %v frames", rb.writes, rb.frames)
	}

	// Cycle 3: releases come back redelivered.
	rel := Settle{Kind: SettleRelease, Sess: a, CmdID: 40000, ConsumerID: 1, NRanges: 1, Last: true}
	rel.Ranges[0] = wire.Range{First: 1, Last: 600}
	s.handleCmd(rel.Command())
	acc := Settle{Kind: SettleAccept, Sess: b, CmdID: 40000, ConsumerID: 9, NRanges: 1, Last: true}
	acc.Ranges[0] = wire.Range{First: 1, Last: 700}
	s.handleCmd(acc.Command())
	publish(qc, 3, func(int) int { return 10 })
	s.dispatchDirty()
	redelivered := 0
	for _, c := range s.outs[a].consumers {
		for _, d := range c.pending {
			if d.Flags&wire.MsgRedelivered != 0 && d.DeliveryCount == 1 {
				redelivered++
			}
		}
	}
	if redelivered != 600 {
		t.Fatalf("redelivery: %d of 600 released messages pending as redelivered", redelivered)
	}
	check("redelivery")

	// Cycle 4: at the edge of a batch's room. Sixteen of these messages
	// fill a 4 KiB frame, so after 29 frames the batch has room for 15
	// payloads, one less than deliverRoomMin: it is sent, and the next
	// frame starts a new batch.
	for range 2 * PayloadsMax {
		s.handleCmd(Publish{Queue: qd, Body: NewBody(nil, []byte("qd"), nil, make([]byte, 220), false), Now: 1}.Command())
	}
	s.dispatchDirty()
	if ra := check("room edge")[a]; ra.writes != 3 || ra.frames[wire.TypeDeliver] != 2*PayloadsMax/16+1 {
		t.Fatalf("room edge: %d writes of %v frames, want 3 writes of %d DELIVERs", ra.writes, ra.frames, 2*PayloadsMax/16+1)
	}
}

func head(b []byte) []byte { return b[:min(len(b), 64)] }

// toyEncoder is a second protocol, AMQP-like: each frame is a type octet,
// a u32 body length, the body and a frame-end octet. A delivery is a 'D'
// frame (consumer, tag, count, flags, exchange, routing key, props and
// payload size as text) then 'B' frames of the payload, each within the
// frame max, written from the body unless the message has more parts than
// a batch holds payloads, when they are copied. Completions are a 'C'
// frame per range, errors an 'E' frame.
type toyEncoder struct{}

const toyFrameEnd = 0xCE

// toyOverhead is what a toy frame adds to its body.
const toyOverhead = 1 + 4 + 1

func toyFrame(b []byte, typ byte, body string) []byte {
	b = append(b, typ)
	b = binary.BigEndian.AppendUint32(b, uint32(len(body)))
	b = append(b, body...)
	return append(b, toyFrameEnd)
}

func (toyEncoder) AppendCompletes(b []byte, ranges []wire.Range) []byte {
	for _, r := range ranges {
		b = toyFrame(b, 'C', fmt.Sprintf("%d-%d", r.First, r.Last))
	}
	return b
}

func (toyEncoder) AppendError(b []byte, id uint64, code wire.ErrorCode, text string) []byte {
	return toyFrame(b, 'E', fmt.Sprintf("%d %d %s", id, code, text))
}

func (toyEncoder) AppendDeliveries(f *Frames, consumer uint32, ds []Delivery, frameMax int) int {
	chunk := frameMax - toyOverhead
	for n, d := range ds {
		b := d.Body
		parts := (len(b.Payload) + chunk - 1) / chunk
		copied := false
		if parts > f.PayloadRoom() {
			if f.PayloadRoom() < PayloadsMax {
				return n // the shard sends the batch and calls again
			}
			copied = true // no batch has room for its parts
		}
		f.Buf = toyFrame(f.Buf, 'D', fmt.Sprintf("%d %d %d %d %s %s %s %d",
			consumer, d.Tag, d.DeliveryCount, d.Flags, b.Exchange, b.RoutingKey, b.Props, len(b.Payload)))
		for off := 0; off < len(b.Payload); off += chunk {
			part := b.Payload[off:min(off+chunk, len(b.Payload))]
			f.Buf = append(f.Buf, 'B')
			f.Buf = binary.BigEndian.AppendUint32(f.Buf, uint32(len(part)))
			if copied {
				f.Buf = append(f.Buf, part...)
			} else {
				f.AddPayload(part)
			}
			f.Buf = append(f.Buf, toyFrameEnd)
		}
	}
	return len(ds)
}

// toyDelivery is a delivery decoded from toy frames.
type toyDelivery struct {
	head    string // the 'D' frame's fields but the payload size
	payload []byte
	parts   int
}

// toyDecode decodes one write of toy frames: each must be whole, as must
// each delivery, and no body frame may exceed frameMax.
func toyDecode(t *testing.T, b []byte, frameMax int) (completes, errs []string, ds []toyDelivery) {
	t.Helper()
	var open *toyDelivery
	want := 0
	for len(b) > 0 {
		if len(b) < toyOverhead {
			t.Fatalf("%d bytes left, less than a toy frame", len(b))
		}
		typ, n := b[0], int(binary.BigEndian.Uint32(b[1:]))
		if len(b) < toyOverhead+n || b[5+n] != toyFrameEnd {
			t.Fatalf("a %q frame of %d bytes is cut or has no frame end", typ, n)
		}
		body := b[5 : 5+n]
		b = b[toyOverhead+n:]
		if open != nil && typ != 'B' {
			t.Fatalf("a %q frame inside a delivery", typ)
		}
		switch typ {
		case 'C':
			completes = append(completes, string(body))
		case 'E':
			errs = append(errs, string(body))
		case 'D':
			f := strings.Fields(string(body))
			size, err := strconv.Atoi(f[len(f)-1])
			if err != nil {
				t.Fatal(err)
			}
			ds = append(ds, toyDelivery{head: strings.Join(f[:len(f)-1], " ")})
			if size > 0 {
				open, want = &ds[len(ds)-1], size
			}
		case 'B':
			if open == nil {
				t.Fatal("a body frame outside a delivery")
			}
			if toyOverhead+n > frameMax {
				t.Fatalf("a body frame of %d bytes, above the frame max %d", toyOverhead+n, frameMax)
			}
			open.payload = append(open.payload, body...)
			open.parts++
			if len(open.payload) >= want {
				open = nil
			}
		default:
			t.Fatalf("unknown toy frame type %q", typ)
		}
	}
	if open != nil {
		t.Fatal("a write ends inside a delivery")
	}
	return completes, errs, ds
}

// aliases counts the entries of vec that start at b[off] for an off that
// is a multiple of step: parts of payload b written from the body itself.
func aliases(vec [][]byte, b []byte, step int) int {
	n := 0
	for _, e := range vec {
		for off := 0; off < len(b); off += step {
			if len(e) > 0 && &e[0] == &b[off] {
				n++
			}
		}
	}
	return n
}

// TestSessionEncoderFrames gives one session of a shard the toy encoder
// and another none: the first gets its completions, errors and
// deliveries in toy frames, with payloads split into body frames within
// its frame max and written from the bodies (one too large for any batch
// copied), over several writes of whole frames each; the second gets the
// native format at the same time.
func TestSessionEncoderFrames(t *testing.T) {
	s, qs := shardWithQueues("qt", "qn")
	qt, qn := qs[0], qs[1]
	const frameMax = 100
	wt, wn := &heldWriter{}, &heldWriter{}
	toy := &Session{ID: 1, Version: wire.Current, FrameMax: frameMax, Out: wt, Encoder: toyEncoder{}}
	native := &Session{ID: 2, Version: wire.Current, FrameMax: wire.FrameSizeDefault, Out: wn}
	s.handleCmd(Subscribe{Sess: toy, CmdID: 1, Queue: qt, ConsumerID: 7, Credit: 1 << 16}.Command())
	s.handleCmd(Subscribe{Sess: native, CmdID: 1, Queue: qn, ConsumerID: 3, Credit: 1 << 16}.Command())
	s.completeCmd(toy, 5, nil, Errorf(wire.CodeNotFound, "no queue x"))
	sizes := []int{10, 250, 0, 300 * 1000} // one part, three parts, none, more parts than a batch holds
	for range 600 {
		sizes = append(sizes, 1+len(sizes)%(frameMax-toyOverhead)) // more messages than a batch holds
	}
	sizes = append(sizes, 250)
	var bodies []*Body
	for i, n := range sizes {
		body := NewBody([]byte("ex"), []byte("qt"), nil, bytes.Repeat([]byte{byte(i), byte(i >> 8)}, n)[:n], false)
		bodies = append(bodies, body)
		s.handleCmd(Publish{Queue: qt, Body: body, Now: 1}.Command())
		s.handleCmd(Publish{Queue: qn, Body: NewBody(nil, []byte("qn"), nil, []byte{byte(i)}, false), Now: 1}.Command())
	}
	s.dispatchDirty()
	s.flush()
	writes, finish := wt.take()
	defer finish()
	nwrites, nfinish := wn.take()
	defer nfinish()

	if len(writes) < 2 {
		t.Fatalf("the toy session got %d writes, want more than one: a batch holds %d payloads", len(writes), PayloadsMax)
	}
	var completes, errs []string
	var ds []toyDelivery
	for i, vec := range writes {
		if len(vec) > IovecsMax {
			t.Fatalf("write %d has %d vector entries, above IovecsMax %d", i, len(vec), IovecsMax)
		}
		c, e, d := toyDecode(t, bytes.Join(vec, nil), frameMax)
		completes, errs, ds = append(completes, c...), append(errs, e...), append(ds, d...)
	}
	wantErr := fmt.Sprintf("5 %d shards: no queue x", wire.CodeNotFound)
	if !slices.Equal(completes, []string{"1-1"}) || !slices.Equal(errs, []string{wantErr}) {
		t.Fatalf("toy completions %q and errors %q, want [1-1] and [%s]", completes, errs, wantErr)
	}
	if len(ds) != len(sizes) {
		t.Fatalf("the toy session got %d deliveries, want %d", len(ds), len(sizes))
	}
	chunk := frameMax - toyOverhead
	for i, d := range ds {
		if want := fmt.Sprintf("7 %d 0 0 ex qt", i+1); d.head != want {
			t.Fatalf("delivery %d: head %q, want %q", i, d.head, want)
		}
		if !bytes.Equal(d.payload, bodies[i].Payload) {
			t.Fatalf("delivery %d: %d payload bytes, not the %d published", i, len(d.payload), len(bodies[i].Payload))
		}
		if want := (sizes[i] + chunk - 1) / chunk; d.parts != want {
			t.Fatalf("delivery %d of %d bytes in %d body frames, want %d", i, sizes[i], d.parts, want)
		}
	}
	var all [][]byte
	for _, vec := range writes {
		all = append(all, vec...)
	}
	if n, m := aliases(all, bodies[1].Payload, chunk), aliases(all, bodies[len(bodies)-1].Payload, chunk); n != 3 || m != 3 {
		t.Fatalf("of the three parts of two split payloads, %d and %d were written from the bodies, want all", n, m)
	}
	if n := aliases(all, bodies[3].Payload, chunk); n != 0 {
		t.Fatalf("a payload with more parts than a batch holds had %d parts written from the body, want them copied", n)
	}

	// The native session, on the same shard in the same cycle.
	var got int
	for _, vec := range nwrites {
		b := bytes.Join(vec, nil)
		for len(b) > 0 {
			h, body, n, err := wire.Next(b, wire.FrameSizeMax)
			if err != nil || n == 0 {
				t.Fatalf("native session: not a whole native frame (%v)", err)
			}
			b = b[n:]
			if h.Type != wire.TypeDeliver {
				continue
			}
			var d wire.Deliver
			if err := wire.DecodeDeliver(body, &d); err != nil || d.ConsumerID != 3 {
				t.Fatalf("native session: DELIVER for consumer %d (%v)", d.ConsumerID, err)
			}
			var m wire.DeliverMessage
			for d.Next(&m) {
				if !bytes.Equal(m.Payload, []byte{byte(got)}) {
					t.Fatalf("native session: message %d has payload %x", got, m.Payload)
				}
				got++
			}
		}
	}
	if got != len(sizes) {
		t.Fatalf("native session: %d messages, want %d", got, len(sizes))
	}
}

// stuckEncoder never finds room for a delivery. Called for ever, it stops
// the test rather than let it spin.
type stuckEncoder struct {
	toyEncoder
	calls int
}

func (e *stuckEncoder) AppendDeliveries(*Frames, uint32, []Delivery, int) int {
	if e.calls++; e.calls > 100 {
		panic("stuckEncoder: called 100 times")
	}
	return 0
}

// TestEncoderWritingNothingPanics: an encoder that writes no delivery
// into an empty batch would have the shard loop for ever; it panics.
func TestEncoderWritingNothingPanics(t *testing.T) {
	s, qs := shardWithQueues("q")
	q := qs[0]
	sess := &Session{ID: 1, Version: wire.Current, FrameMax: wire.FrameSizeDefault, Out: &heldWriter{}, Encoder: &stuckEncoder{}}
	s.handleCmd(Subscribe{Sess: sess, CmdID: 1, Queue: q, ConsumerID: 1, Credit: 10}.Command())
	s.handleCmd(Publish{Queue: q, Body: NewBody(nil, []byte("q"), nil, []byte("m"), false), Now: 1}.Command())
	s.dispatchDirty()
	defer func() {
		if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "no delivery into an empty batch") {
			t.Fatalf("flush with a stuck encoder: recovered %v, want the empty-batch panic", r)
		}
	}()
	s.flush()
}
