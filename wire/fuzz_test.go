package wire

import "testing"

// decodeAny decodes one frame of any client type, as the server and client
// do, and walks every batched message.
func decodeAny(data []byte, maxFrame uint32) error {
	for len(data) > 0 {
		h, body, n, err := Next(data, maxFrame)
		if err != nil {
			return err
		}
		if n == 0 {
			return ErrShort
		}
		if len(body) > int(maxFrame) {
			panic("body beyond negotiated maximum")
		}
		data = data[n:]
		switch h.Type {
		case TypeHello:
			var v Hello
			err = DecodeHello(body, &v)
		case TypeWelcome:
			var v Welcome
			err = DecodeWelcome(body, &v)
		case TypeHeartbeat:
		case TypeClose:
			var v Close
			err = DecodeClose(body, &v)
		case TypeComplete:
			var l RangeList
			l, err = DecodeComplete(body)
			for i := 0; err == nil && i < l.Len(); i++ {
				if r := l.At(i); r.First > r.Last {
					panic("backwards range accepted")
				}
			}
		case TypeError:
			var v Error
			err = DecodeError(body, &v)
		case TypeDeclareQueue:
			var v DeclareQueue
			err = DecodeDeclareQueue(body, &v)
		case TypeDeclareExchange:
			var v DeclareExchange
			err = DecodeDeclareExchange(body, &v)
		case TypeBind, TypeUnbind:
			var v Bind
			err = DecodeBind(body, &v)
		case TypeDelete:
			var v Delete
			err = DecodeDelete(body, &v)
		case TypePurge:
			var v Purge
			err = DecodePurge(body, &v)
		case TypePublish:
			var p Publish
			if err = DecodePublish(body, &p); err == nil {
				var m PublishMessage
				n := 0
				for p.Next(&m) {
					n++
				}
				if n != p.Count || p.r.Err() != nil {
					panic("publish iteration disagrees with decode")
				}
			}
		case TypeSubscribe:
			var v Subscribe
			err = DecodeSubscribe(body, &v)
		case TypeCancel:
			var v Cancel
			err = DecodeCancel(body, &v)
		case TypeCancelled:
			var v Cancelled
			if err = DecodeCancelled(body, &v); err == nil && len(v.Reason) > TextLenMax {
				panic("CANCELLED reason beyond TextLenMax accepted")
			}
		case TypeCredit:
			var v Credit
			err = DecodeCredit(body, &v)
		case TypeDeliver:
			var d Deliver
			if err = DecodeDeliver(body, &d); err == nil {
				var m DeliverMessage
				n := 0
				for d.Next(&m) {
					n++
				}
				if n != d.Count || d.r.Err() != nil {
					panic("deliver iteration disagrees with decode")
				}
			}
		case TypeAccept, TypeRelease, TypeReject:
			var v Settle
			err = DecodeSettle(body, &v)
		default:
			err = ErrUnknownType
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func FuzzDecode(f *testing.F) {
	f.Add(AppendHello(nil, []Version{Current}, "c", "none", nil, 0, 0))
	f.Add(AppendHeartbeat(nil, Current))
	b, s := AppendPublishStart(nil, Current, 1, "", 2)
	b = AppendPublishMessage(b, MsgPersistent, 5, "q", []byte("p"), []byte("hello"))
	b = AppendPublishMessage(b, 0, 0, "q", nil, nil)
	EndFrame(b, s, 0)
	f.Add(b)
	b, s = AppendDeliverStart(nil, Current, 1, 1)
	b = AppendDeliverMessageHead(b, 1, 0, 0, []byte("x"), []byte("q"), nil, 3)
	b = append(b, "abc"...)
	EndFrame(b, s, 0)
	f.Add(b)
	f.Add(AppendSettle(nil, Current, TypeAccept, 1, 1, []Range{{1, 2}}))
	f.Add(AppendComplete(nil, Current, []Range{{1, 1}, {3, 7}}))
	f.Add(AppendDeclareQueue(nil, Current, &DeclareQueue{CommandID: 1, Name: []byte("q")}))
	f.Add(AppendError(nil, Current, 1, CodeInvalid, "x"))
	f.Add(AppendCancelled(nil, Current, 7, CodeUnavailable, "master lost"))
	f.Fuzz(func(t *testing.T, data []byte) {
		_ = decodeAny(data, FrameSizeMin)
	})
}

// FuzzCancelled: a CANCELLED body that decodes encodes back to the same
// bytes, and one that does not decode is refused without a panic.
func FuzzCancelled(f *testing.F) {
	f.Add(AppendCancelled(nil, VersionCancelled, 7, CodeUnavailable, "master lost")[HeaderSize:])
	f.Add(AppendCancelled(nil, VersionCancelled, 0, CodeNotFound, "")[HeaderSize:])
	f.Add([]byte{0, 0, 0, 1, 0, 15, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, body []byte) {
		var c Cancelled
		if DecodeCancelled(body, &c) != nil {
			return
		}
		again := AppendCancelled(nil, VersionCancelled, c.ConsumerID, c.Code, string(c.Reason))
		if string(again[HeaderSize:]) != string(body) {
			t.Fatalf("% x decodes as %+v, which encodes as % x", body, c, again[HeaderSize:])
		}
	})
}
