package wire

import (
	"bytes"
	"errors"
	"testing"
)

func mustNext(t *testing.T, b []byte) (Header, []byte) {
	t.Helper()
	h, body, n, err := Next(b, FrameSizeDefault)
	if err != nil || n != len(b) {
		t.Fatalf("Next: n=%d len=%d err=%v", n, len(b), err)
	}
	return h, body
}

func TestHelloWelcomeRoundTrip(t *testing.T) {
	b := AppendHello(nil, []Version{MakeVersion(1, 0), MakeVersion(2, 3)}, "cli", "none", []byte("x"), 1<<16, 500)
	h, body := mustNext(t, b)
	if h.Type != TypeHello {
		t.Fatalf("type %v", h.Type)
	}
	var hello Hello
	if err := DecodeHello(body, &hello); err != nil {
		t.Fatal(err)
	}
	if len(hello.Versions) != 2 || string(hello.ClientName) != "cli" || hello.FrameSizeMax != 1<<16 || hello.HeartbeatMs != 500 {
		t.Fatalf("bad hello %+v", hello)
	}
	v, ok := Negotiate(hello.Versions)
	if !ok || v != MakeVersion(1, 0) {
		t.Fatalf("negotiate = %v %v", v, ok)
	}
	if _, ok := Negotiate([]Version{MakeVersion(2, 0), MakeVersion(1, 9)}); ok {
		t.Fatal("negotiated a version we do not speak")
	}
	w := Welcome{Version: Current, FrameSizeMax: 4096, HeartbeatMs: 100, CreditMax: 7, WindowMax: 9,
		ServerName: []byte("s"), Addrs: [][]byte{[]byte("127.0.0.1:1"), []byte("127.0.0.1:2")}}
	_, body = mustNext(t, AppendWelcome(nil, &w))
	var w2 Welcome
	if err := DecodeWelcome(body, &w2); err != nil {
		t.Fatal(err)
	}
	if w2.FrameSizeMax != 4096 || w2.WindowMax != 9 || len(w2.Addrs) != 2 || string(w2.Addrs[1]) != "127.0.0.1:2" {
		t.Fatalf("bad welcome %+v", w2)
	}
}

func TestPublishRoundTrip(t *testing.T) {
	b, s := AppendPublishStart(nil, Current, 41, "ex", 3)
	for i := 0; i < 3; i++ {
		b = AppendPublishMessage(b, MsgPersistent, uint64(i), "k"+string(rune('a'+i)), []byte{byte(i)}, bytes.Repeat([]byte{'p'}, i*10))
	}
	EndFrame(b, s, 0)
	_, body := mustNext(t, b)
	var p Publish
	if err := DecodePublish(body, &p); err != nil {
		t.Fatal(err)
	}
	if p.FirstID != 41 || string(p.Exchange) != "ex" || p.Count != 3 {
		t.Fatalf("bad publish %+v", p)
	}
	var m PublishMessage
	i := 0
	for p.Next(&m) {
		if m.TTLMs != uint64(i) || string(m.RoutingKey) != "k"+string(rune('a'+i)) || len(m.Payload) != i*10 || m.Props[0] != byte(i) {
			t.Fatalf("msg %d: %+v", i, m)
		}
		i++
	}
	if i != 3 {
		t.Fatalf("iterated %d", i)
	}
}

func TestDeliverRoundTripOutOfBandPayload(t *testing.T) {
	payloads := [][]byte{[]byte("hello"), []byte("world!")}
	b, s := AppendDeliverStart(nil, Current, 7, 2)
	extra := 0
	var frame []byte
	for i, p := range payloads {
		b = AppendDeliverMessageHead(b, uint64(100+i), uint32(i), MsgRedelivered, []byte("ex"), []byte("rk"), nil, len(p))
		// Simulate writev: the payload is not in b, but goes out after it.
		frame = append(frame, b[len(frame):]...)
		frame = append(frame, p...)
		extra += len(p)
		b = b[:len(b):len(b)]
		b = append(b[:0:0], frame...)
		extra = 0
	}
	EndFrame(b, s, extra)
	_, body := mustNext(t, b)
	var d Deliver
	if err := DecodeDeliver(body, &d); err != nil {
		t.Fatal(err)
	}
	var m DeliverMessage
	i := 0
	for d.Next(&m) {
		if m.Tag != uint64(100+i) || !bytes.Equal(m.Payload, payloads[i]) || string(m.RoutingKey) != "rk" {
			t.Fatalf("msg %d: %+v", i, m)
		}
		i++
	}
	if i != 2 || d.ConsumerID != 7 {
		t.Fatalf("count %d consumer %d", i, d.ConsumerID)
	}
}

func TestSettleAndComplete(t *testing.T) {
	rs := []Range{{1, 5}, {9, 9}}
	_, body := mustNext(t, AppendSettle(nil, Current, TypeAccept, 3, 4, rs))
	var s Settle
	if err := DecodeSettle(body, &s); err != nil {
		t.Fatal(err)
	}
	if s.CommandID != 3 || s.ConsumerID != 4 || s.Tags.Len() != 2 || s.Tags.At(1) != (Range{9, 9}) {
		t.Fatalf("bad settle %+v", s)
	}
	_, body = mustNext(t, AppendComplete(nil, Current, rs))
	l, err := DecodeComplete(body)
	if err != nil || l.Len() != 2 || l.At(0) != (Range{1, 5}) {
		t.Fatalf("complete %v %v", l, err)
	}
	// A backwards range is malformed.
	_, body = mustNext(t, AppendComplete(nil, Current, []Range{{5, 1}}))
	if _, err := DecodeComplete(body); !errors.Is(err, ErrMalformed) {
		t.Fatalf("backwards range: %v", err)
	}
}

func TestCommandsRoundTrip(t *testing.T) {
	dq := DeclareQueue{CommandID: 1, Name: []byte("q"), Flags: QueuePassive, Options: QueueOptions{Durable: true, AutoDelete: true,
		MaxDeliveries: 3, MessageTTLMs: 10, MaxLength: 100, MaxLengthBytes: 1000, Overflow: OverflowDropHead,
		DeadLetterExchange: "dlx", DeadLetterKey: "dk", MaxPriority: 7}}
	_, body := mustNext(t, AppendDeclareQueue(nil, Current, &dq))
	var dq2 DeclareQueue
	if err := DecodeDeclareQueueVersion(body, Current, &dq2); err != nil || dq2.Options != dq.Options ||
		dq2.Flags != QueuePassive|QueueDurable|QueueAutoDelete || string(dq2.Name) != "q" {
		t.Fatalf("%+v %v", dq2, err)
	}
	de := DeclareExchange{CommandID: 2, Name: []byte("e"), Kind: ExchangeTopic, Flags: ExchangeDurable}
	_, body = mustNext(t, AppendDeclareExchange(nil, Current, &de))
	var de2 DeclareExchange
	if err := DecodeDeclareExchange(body, &de2); err != nil || de2.Kind != ExchangeTopic || string(de2.Name) != "e" {
		t.Fatalf("%+v %v", de2, err)
	}
	bd := Bind{CommandID: 3, Exchange: []byte("e"), Queue: []byte("q"), Key: []byte("a.*")}
	h, body := mustNext(t, AppendBind(nil, Current, TypeUnbind, &bd))
	var bd2 Bind
	if err := DecodeBind(body, &bd2); err != nil || h.Type != TypeUnbind || string(bd2.Key) != "a.*" {
		t.Fatalf("%+v %v", bd2, err)
	}
	del := Delete{CommandID: 4, What: DeleteExchange, Flags: DeleteIfUnused, Name: []byte("e")}
	_, body = mustNext(t, AppendDelete(nil, Current, &del))
	var del2 Delete
	if err := DecodeDelete(body, &del2); err != nil || del2.What != DeleteExchange || del2.Flags != DeleteIfUnused {
		t.Fatalf("%+v %v", del2, err)
	}
	sub := Subscribe{CommandID: 5, ConsumerID: 6, Queue: []byte("q"), Credit: 10, AckMode: AckNone, Flags: SubscribeExclusive}
	_, body = mustNext(t, AppendSubscribe(nil, Current, &sub))
	var sub2 Subscribe
	if err := DecodeSubscribe(body, &sub2); err != nil || sub2.Credit != 10 || sub2.ConsumerID != 6 || sub2.AckMode != AckNone {
		t.Fatalf("%+v %v", sub2, err)
	}
	_, body = mustNext(t, AppendError(nil, Current, 9, CodeNotFound, "no queue"))
	var e Error
	if err := DecodeError(body, &e); err != nil || e.CommandID != 9 || e.Code != CodeNotFound || string(e.Text) != "no queue" {
		t.Fatalf("%+v %v", e, err)
	}
	_, body = mustNext(t, AppendCredit(nil, Current, 6, 100))
	var c Credit
	if err := DecodeCredit(body, &c); err != nil || c.Credit != 100 {
		t.Fatalf("%+v %v", c, err)
	}
}

func TestHeaderErrors(t *testing.T) {
	b := AppendHeartbeat(nil, Current)
	bad := append([]byte(nil), b...)
	bad[0] = 0
	if _, _, _, err := Next(bad, FrameSizeDefault); !errors.Is(err, ErrMagic) {
		t.Fatalf("magic: %v", err)
	}
	big := append([]byte(nil), b...)
	big[8], big[9] = 0x7f, 0xff // 2 GiB body
	if _, _, _, err := Next(big, FrameSizeDefault); !errors.Is(err, ErrFrameTooBig) {
		t.Fatalf("size: %v", err)
	}
	maj := append([]byte(nil), b...)
	maj[2] = 9
	if _, _, _, err := Next(maj, FrameSizeDefault); !errors.Is(err, ErrMajorVersion) {
		t.Fatalf("major: %v", err)
	}
	if _, _, n, err := Next(b[:5], FrameSizeDefault); n != 0 || err != nil {
		t.Fatalf("partial: %d %v", n, err)
	}
}

// TestScheduleFields: a 1.2 PUBLISH carries a priority and a deliver-at
// time behind their flags, and a 1.2 DECLARE_QUEUE its max priority; a
// 1.1 session's frames are laid out as before, and the same flag bits in
// them add nothing.
func TestScheduleFields(t *testing.T) {
	b, s := AppendPublishStart(nil, VersionSchedule, 1, "", 4)
	b = AppendPublishMessageAt(b, MsgPriority, 0, 9, 0, "q", nil, []byte("a"))
	b = AppendPublishMessageAt(b, MsgDeliverAt|MsgPersistent, 5, 0, 1_700_000_000_123, "q", []byte{1}, []byte("b"))
	b = AppendPublishMessageAt(b, MsgPriority|MsgDeliverAt, 0, 3, 42, "q", nil, nil)
	b = AppendPublishMessageAt(b, 0, 0, 7, 99, "q", nil, []byte("d")) // no flags: the values are not sent
	EndFrame(b, s, 0)
	_, body := mustNext(t, b)
	var p Publish
	if err := DecodePublishVersion(body, VersionSchedule, &p); err != nil {
		t.Fatal(err)
	}
	want := []struct {
		prio uint8
		at   uint64
		pay  string
	}{{9, 0, "a"}, {0, 1_700_000_000_123, "b"}, {3, 42, ""}, {0, 0, "d"}}
	var m PublishMessage
	for i := 0; p.Next(&m); i++ {
		if m.Priority != want[i].prio || m.DeliverAtMs != want[i].at || string(m.Payload) != want[i].pay || string(m.RoutingKey) != "q" {
			t.Fatalf("message %d: %+v", i, m)
		}
	}
	// The same body read as 1.1 is malformed: the extra fields do not
	// parse as the 1.1 layout.
	if err := DecodePublish(body, &p); err == nil {
		t.Fatal("a 1.2 body with extension fields decoded as 1.1")
	}
	// In 1.1 the bits carry nothing and are cleared.
	b, s = AppendPublishStart(nil, VersionAuth, 1, "", 1)
	b = AppendPublishMessage(b, MsgPriority|MsgDeliverAt|MsgPersistent, 0, "q", nil, []byte("x"))
	EndFrame(b, s, 0)
	_, body = mustNext(t, b)
	if err := DecodePublish(body, &p); err != nil || !p.Next(&m) || m.Flags != MsgPersistent || m.Priority != 0 || string(m.Payload) != "x" {
		t.Fatalf("1.1 publish with extension bits: %+v %v", m, err)
	}
	// Truncated 1.2 messages fail whole.
	b, s = AppendPublishStart(nil, VersionSchedule, 1, "", 1)
	b = AppendPublishMessageAt(b, MsgPriority|MsgDeliverAt, 0, 1, 2, "q", nil, []byte("x"))
	EndFrame(b, s, 0)
	body = b[HeaderSize:]
	for i := 0; i < len(body); i++ {
		if err := DecodePublishVersion(body[:i], VersionSchedule, &p); err == nil {
			t.Fatalf("truncated at %d decoded", i)
		}
	}
	dq := DeclareQueue{CommandID: 1, Name: []byte("q"), Options: QueueOptions{MaxPriority: 5}}
	_, b11 := mustNext(t, AppendDeclareQueue(nil, VersionAuth, &dq))
	_, b12 := mustNext(t, AppendDeclareQueue(nil, VersionSchedule, &dq))
	if len(b12) != len(b11)+1 {
		t.Fatalf("1.2 declare is %d bytes, 1.1 %d", len(b12), len(b11))
	}
	var got DeclareQueue
	if err := DecodeDeclareQueue(b11, &got); err != nil || got.Options.MaxPriority != 0 {
		t.Fatalf("1.1 declare: %+v %v", got, err)
	}
	if err := DecodeDeclareQueueVersion(b12, VersionSchedule, &got); err != nil || got.Options.MaxPriority != 5 {
		t.Fatalf("1.2 declare: %+v %v", got, err)
	}
	if err := DecodeDeclareQueueVersion(b11, VersionSchedule, &got); err == nil {
		t.Fatal("a 1.1 declare decoded as 1.2")
	}
	bad := QueueOptions{MaxPriority: PriorityMax + 1}
	if bad.Check() == nil {
		t.Fatal("max priority above PriorityMax passed Check")
	}
}

func TestTruncatedBodiesFail(t *testing.T) {
	b, s := AppendPublishStart(nil, Current, 1, "ex", 1)
	b = AppendPublishMessage(b, 0, 0, "k", nil, []byte("payload"))
	EndFrame(b, s, 0)
	body := b[HeaderSize:]
	for i := 0; i < len(body); i++ {
		var p Publish
		if err := DecodePublish(body[:i], &p); err == nil {
			t.Fatalf("truncated at %d decoded", i)
		}
	}
	// Count larger than the messages present.
	body = append([]byte(nil), body...)
	body[8+2+2] = 0
	body[8+2+3] = 2
	var p Publish
	if err := DecodePublish(body, &p); err == nil {
		t.Fatal("count mismatch decoded")
	}
}

func TestAddIDAndAppendCompletes(t *testing.T) {
	var rs []Range
	for _, id := range []uint64{1, 2, 3, 5, 6, 9} {
		rs = AddID(rs, id)
	}
	if len(rs) != 3 || rs[0] != (Range{1, 3}) || rs[1] != (Range{5, 6}) || rs[2] != (Range{9, 9}) {
		t.Fatalf("ranges %v", rs)
	}
	many := make([]Range, RangesMax+1)
	for i := range many {
		many[i] = Range{uint64(2 * i), uint64(2 * i)}
	}
	b := AppendCompletes(nil, Current, many)
	frames, total := 0, 0
	for len(b) > 0 {
		_, body, n, err := Next(b, FrameSizeMax)
		if err != nil || n == 0 {
			t.Fatalf("frame %d: %v", frames, err)
		}
		l, err := DecodeComplete(body)
		if err != nil {
			t.Fatal(err)
		}
		frames++
		total += l.Len()
		b = b[n:]
	}
	if frames != 2 || total != RangesMax+1 {
		t.Fatalf("%d frames, %d ranges", frames, total)
	}
}

func TestReaderBoolAndCount(t *testing.T) {
	b := AppendBool(AppendBool(nil, true), false)
	b = AppendU32(b, 2)
	b = append(b, 1, 2, 3, 4)
	var r Reader
	r.Reset(b)
	if !r.Bool() || r.Bool() {
		t.Fatal("bools did not round-trip")
	}
	if n := r.Count(2); n != 2 || r.Err() != nil {
		t.Fatalf("count %d %v, want 2", n, r.Err())
	}
	r.Skip(4)
	if err := r.Done(); err != nil {
		t.Fatal(err)
	}
	// A boolean byte other than 0 or 1 is malformed.
	r.Reset([]byte{2})
	if r.Bool(); !errors.Is(r.Err(), ErrMalformed) {
		t.Fatalf("bool 2: %v", r.Err())
	}
	// A count the remaining bytes cannot hold is malformed before anyone
	// allocates for it, and the error sticks.
	r.Reset(append(AppendU32(nil, 3), 1, 2, 3, 4, 5))
	if n := r.Count(2); n != 0 || !errors.Is(r.Err(), ErrMalformed) {
		t.Fatalf("count 3 of 2 bytes in 5: %d %v", n, r.Err())
	}
	if r.U8() != 0 {
		t.Fatal("read after an error returned data")
	}
	r.Reset(AppendU32(nil, 1<<31))
	if n := r.Count(0); n != 0 || r.Err() == nil {
		t.Fatalf("huge count with size 0 accepted: %d", n)
	}
	r.Reset(append(AppendU32(nil, 5), 1, 2, 3, 4, 5))
	if n := r.Count(1); n != 5 || r.Err() != nil {
		t.Fatalf("count 5 of 1 byte in 5: %d %v", n, r.Err())
	}
}

func TestAuthRoundTripAndHelloHeader(t *testing.T) {
	h, body := mustNext(t, AppendAuth(nil, VersionAuth, []byte("r=abc,s=c2FsdA==,i=4096")))
	var a Auth
	if h.Type != TypeAuth || h.Version != VersionAuth || DecodeAuth(body, &a) != nil || string(a.Data) != "r=abc,s=c2FsdA==,i=4096" {
		t.Fatalf("AUTH round trip: %v %v %q", h.Type, h.Version, a.Data)
	}
	if err := DecodeAuth(append(body, 0), &a); err == nil {
		t.Fatal("AUTH with a trailing byte decoded")
	}
	// A 1.0 client's HELLO keeps its 1.0 header; a 1.1 client's says 1.1.
	if h, _ := mustNext(t, AppendHello(nil, []Version{Version10}, "a", MechNone, nil, 0, 0)); h.Version != Version10 {
		t.Fatalf("1.0 HELLO header %v", h.Version)
	}
	if h, _ := mustNext(t, AppendHello(nil, []Version{Version10, VersionAuth}, "a", MechScramSHA256, nil, 0, 0)); h.Version != VersionAuth {
		t.Fatalf("1.1 HELLO header %v", h.Version)
	}
	if v, ok := Negotiate([]Version{Version10, VersionAuth}); !ok || v != VersionAuth {
		t.Fatalf("negotiate 1.0,1.1 = %v", v)
	}
	if !IsClientType(TypeAuth) || CodeAuthFailed.String() != "auth-failed" {
		t.Fatal("AUTH or auth-failed unknown")
	}
}

func TestPublishProducerRoundTrip(t *testing.T) {
	b, s := AppendPublishStartProducer(nil, VersionProducer, 41, 0xfeed, "ex", 2)
	b = AppendPublishMessage(b, 0, 0, "k", nil, []byte("a"))
	b = AppendPublishMessage(b, 0, 0, "k", nil, []byte("b"))
	EndFrame(b, s, 0)
	h, body := mustNext(t, b)
	if h.Flags != PublishProducer {
		t.Fatalf("flags %#x", h.Flags)
	}
	var p Publish
	if err := DecodePublishFlags(body, h.Flags, &p); err != nil {
		t.Fatal(err)
	}
	var m PublishMessage
	if p.FirstID != 41 || p.Producer != 0xfeed || string(p.Exchange) != "ex" || p.Count != 2 || !p.Next(&m) || string(m.Payload) != "a" {
		t.Fatalf("bad publish %+v", p)
	}
	// Read without the flag, the producer id is taken for the exchange
	// length: malformed, not a wrong message.
	if err := DecodePublish(body, &p); err == nil {
		t.Fatal("a producer PUBLISH decoded without its flag")
	}
	if err := DecodePublishFlags(body, PublishProducer|2, &p); err == nil {
		t.Fatal("an unknown PUBLISH flag accepted")
	}
	zero, s := AppendPublishStartProducer(nil, VersionProducer, 1, 0, "", 1)
	zero = AppendPublishMessage(zero, 0, 0, "k", nil, nil)
	EndFrame(zero, s, 0)
	_, body = mustNext(t, zero)
	if err := DecodePublishFlags(body, PublishProducer, &p); err == nil {
		t.Fatal("producer id 0 accepted")
	}
	for i := 0; i < len(body); i++ {
		if err := DecodePublishFlags(body[:i], PublishProducer, &p); err == nil {
			t.Fatalf("truncated at %d accepted", i)
		}
	}
}

func TestCancelledRoundTrip(t *testing.T) {
	b := AppendCancelled(nil, VersionCancelled, 7, CodeUnavailable, "the master of the queue's group was lost; subscribe again")
	h, body := mustNext(t, b)
	if h.Type != TypeCancelled || h.Version != VersionCancelled || h.Type.String() != "CANCELLED" {
		t.Fatalf("header %+v", h)
	}
	var c Cancelled
	if err := DecodeCancelled(body, &c); err != nil || c.ConsumerID != 7 || c.Code != CodeUnavailable ||
		string(c.Reason) != "the master of the queue's group was lost; subscribe again" {
		t.Fatalf("%+v %v", c, err)
	}
	// Truncated or padded bodies fail; a reason is cut to TextLenMax.
	for i := range len(body) {
		if err := DecodeCancelled(body[:i], &c); err == nil {
			t.Fatalf("truncated at %d decoded", i)
		}
	}
	if err := DecodeCancelled(append(append([]byte(nil), body...), 0), &c); err == nil {
		t.Fatal("a byte past the reason decoded")
	}
	long := make([]byte, TextLenMax+100)
	for i := range long {
		long[i] = 'x'
	}
	_, body = mustNext(t, AppendCancelled(nil, Current, 1, CodeNotFound, string(long)))
	if err := DecodeCancelled(body, &c); err != nil || len(c.Reason) != TextLenMax {
		t.Fatalf("long reason: %d bytes, %v", len(c.Reason), err)
	}
	if !IsClientType(TypeCancelled) {
		t.Fatal("CANCELLED is not a client type")
	}
}

// TestOutcomeUnknownCode: outcome-unknown (16) is sent as it is in a
// session of 1.4 or later, and as unavailable (15), with the same text,
// to an older one, by every frame that carries a code; no other code is
// changed for any version.
func TestOutcomeUnknownCode(t *testing.T) {
	if CodeOutcomeUnknown != 16 || CodeOutcomeUnknown.String() != "outcome-unknown" || VersionOutcome != MakeVersion(1, 4) || Current < VersionOutcome {
		t.Fatalf("code %d %q, version %v, current %v", CodeOutcomeUnknown, CodeOutcomeUnknown, VersionOutcome, Current)
	}
	const text = "forward lost; the publish may or may not have taken effect"
	for _, tc := range []struct {
		v    Version
		want ErrorCode
	}{{Current, CodeOutcomeUnknown}, {VersionOutcome, CodeOutcomeUnknown}, {VersionCancelled, CodeUnavailable}, {VersionProducer, CodeUnavailable}, {Version10, CodeUnavailable}} {
		var e Error
		h, body := mustNext(t, AppendError(nil, tc.v, 9, CodeOutcomeUnknown, text))
		if err := DecodeError(body, &e); err != nil || h.Version != tc.v || e.CommandID != 9 || e.Code != tc.want || string(e.Text) != text {
			t.Errorf("ERROR in %v: %+v %v, want code %v", tc.v, e, err, tc.want)
		}
		var c Close
		_, body = mustNext(t, AppendClose(nil, tc.v, CodeOutcomeUnknown, text))
		if err := DecodeClose(body, &c); err != nil || c.Code != tc.want || string(c.Reason) != text {
			t.Errorf("CLOSE in %v: %+v %v, want code %v", tc.v, c, err, tc.want)
		}
		var cc Cancelled
		_, body = mustNext(t, AppendCancelled(nil, tc.v, 3, CodeOutcomeUnknown, text))
		if err := DecodeCancelled(body, &cc); err != nil || cc.Code != tc.want || string(cc.Reason) != text {
			t.Errorf("CANCELLED in %v: %+v %v, want code %v", tc.v, cc, err, tc.want)
		}
		for c := CodeOK; c < 64; c++ {
			if c != CodeOutcomeUnknown && c.For(tc.v) != c {
				t.Errorf("%v sent as %v in %v", c, c.For(tc.v), tc.v)
			}
		}
	}
}

// TestErrorCodeOutcome: what each code says of the command it answers,
// as docs/PROTOCOL.md 1.4 has it (client/protocol_doc_test.go checks the
// document against Outcome).
func TestErrorCodeOutcome(t *testing.T) {
	want := map[ErrorCode]Outcome{
		CodeOK: OutcomeNone, CodeHeartbeatTimeout: OutcomeNone,
		CodeMalformed: OutcomeNotCarriedOut, CodeVersion: OutcomeNotCarriedOut, CodeFrameTooLarge: OutcomeNotCarriedOut,
		CodeNotFound: OutcomeNotCarriedOut, CodePreconditionFailed: OutcomeNotCarriedOut, CodeResourceLimit: OutcomeNotCarriedOut,
		CodeNotAllowed: OutcomeNotCarriedOut, CodeInvalid: OutcomeNotCarriedOut, CodeShutdown: OutcomeNotCarriedOut,
		CodeUnexpected: OutcomeNotCarriedOut, CodeAuthFailed: OutcomeNotCarriedOut, CodeUnavailable: OutcomeNotCarriedOut,
		CodeStore: OutcomeUnknown, CodeInternal: OutcomeUnknown, CodeOutcomeUnknown: OutcomeUnknown,
		CodeOutcomeUnknown + 1: OutcomeUnknown, 999: OutcomeUnknown, // codes this build does not know
	}
	for c, o := range want {
		if c.Outcome() != o {
			t.Errorf("%v: %v, want %v", c, c.Outcome(), o)
		}
	}
}
