package wire

import (
	"bytes"
	"strings"
	"testing"
)

// TestForwardFramesRoundTrip: each forwarding frame decodes to what was
// appended, and its header's length matches its body.
func TestForwardFramesRoundTrip(t *testing.T) {
	f := AppendForwardHello(nil, 7, Current)
	h, err := ReadHeader(f, FrameSizeDefault)
	if err != nil || h.Type != TypeForwardHello || int(h.Length) != len(f)-HeaderSize {
		t.Fatalf("hello header %+v err %v", h, err)
	}
	if id, v, err := DecodeForwardHello(f[HeaderSize:]); err != nil || id != 7 || v != Current {
		t.Fatalf("hello: %d %v %v", id, v, err)
	}
	for _, ev := range [][]byte{{'E'}, bytes.Repeat([]byte{9}, 5000)} {
		f := AppendForward(nil, 1<<40+3, 11, ev)
		if len(f) != ForwardSize(len(ev)) {
			t.Fatalf("frame of %d bytes, ForwardSize says %d", len(f), ForwardSize(len(ev)))
		}
		h, err := ReadHeader(f, FrameSizeDefault)
		if err != nil || h.Type != TypeForward || int(h.Length) != len(f)-HeaderSize {
			t.Fatalf("forward header %+v err %v", h, err)
		}
		id, g, got, err := DecodeForward(f[HeaderSize:])
		if err != nil || id != 1<<40+3 || g != 11 || !bytes.Equal(got, ev) {
			t.Fatalf("forward: %d %d %d bytes %v", id, g, len(got), err)
		}
	}
	for _, tc := range []struct {
		code ErrorCode
		text string
	}{{CodeOK, ""}, {CodeResourceLimit, `queue "q" is full`}} {
		f := AppendForwardResult(nil, 99, tc.code, tc.text)
		h, err := ReadHeader(f, FrameSizeDefault)
		if err != nil || h.Type != TypeForwardResult || int(h.Length) != len(f)-HeaderSize {
			t.Fatalf("result header %+v err %v", h, err)
		}
		id, code, text, err := DecodeForwardResult(f[HeaderSize:])
		if err != nil || id != 99 || code != tc.code || string(text) != tc.text {
			t.Fatalf("result: %d %v %q %v", id, code, text, err)
		}
	}
	// A text past the bound is cut, so the frame stays decodable.
	long := AppendForwardResult(nil, 1, CodeInternal, strings.Repeat("x", 3*ForwardTextMax))
	if _, _, text, err := DecodeForwardResult(long[HeaderSize:]); err != nil || len(text) != ForwardTextMax {
		t.Fatalf("long text: %d bytes, %v", len(text), err)
	}
}

// TestForwardDecodeRejectsTruncated: every truncation of a forwarding
// frame's body is refused, never read past.
func TestForwardDecodeRejectsTruncated(t *testing.T) {
	fwd := AppendForward(nil, 5, 2, []byte("event"))[HeaderSize:]
	for i := 0; i <= forwardPrefix; i++ {
		if _, _, _, err := DecodeForward(fwd[:i]); err == nil {
			t.Fatalf("forward truncated to %d decoded", i)
		}
	}
	res := AppendForwardResult(nil, 5, CodeInvalid, "why")[HeaderSize:]
	for i := 0; i < len(res); i++ {
		if _, _, _, err := DecodeForwardResult(res[:i]); err == nil {
			t.Fatalf("result truncated to %d decoded", i)
		}
	}
	if _, _, _, err := DecodeForwardResult(append(res[:len(res):len(res)], 0)); err == nil {
		t.Fatal("result with a trailing byte decoded")
	}
	hello := AppendForwardHello(nil, 1, Current)[HeaderSize:]
	if _, _, err := DecodeForwardHello(hello[:5]); err == nil {
		t.Fatal("short hello decoded")
	}
}

func FuzzForwardFrames(f *testing.F) {
	f.Add(AppendForward(nil, 1, 2, []byte("E"))[HeaderSize:])
	f.Add(AppendForwardResult(nil, 1, CodeResourceLimit, "full")[HeaderSize:])
	f.Fuzz(func(t *testing.T, body []byte) {
		if id, g, ev, err := DecodeForward(body); err == nil {
			if !bytes.Equal(AppendForward(nil, id, g, ev)[HeaderSize:], body) {
				t.Fatal("forward does not re-encode to its bytes")
			}
		}
		if id, code, text, err := DecodeForwardResult(body); err == nil {
			if !bytes.Equal(AppendForwardResult(nil, id, code, string(text))[HeaderSize:], body) {
				t.Fatal("result does not re-encode to its bytes")
			}
		}
	})
}

// TestProxyFramesRoundTrip: the proxy frames decode to what was appended,
// and truncated bodies are refused.
func TestProxyFramesRoundTrip(t *testing.T) {
	inner := AppendHeader(nil, Header{Version: Current, Type: TypeCredit, Length: 8})
	inner = AppendU32(AppendU32(inner, 1), 10)
	f := AppendProxyCommand(nil, 3, Current, 1<<20, inner)
	h, err := ReadHeader(f, FrameSizeDefault)
	if err != nil || h.Type != TypeProxyCommand || int(h.Length) != len(f)-HeaderSize {
		t.Fatalf("command header %+v err %v", h, err)
	}
	s, v, fm, frame, err := DecodeProxyCommand(f[HeaderSize:])
	if err != nil || s != 3 || v != Current || fm != 1<<20 || !bytes.Equal(frame, inner) {
		t.Fatalf("command: %d %v %d % x %v", s, v, fm, frame, err)
	}
	for i := 0; i < proxyCommandPrefix+HeaderSize; i++ {
		if _, _, _, _, err := DecodeProxyCommand(f[HeaderSize : HeaderSize+i]); err == nil {
			t.Fatalf("command truncated to %d decoded", i)
		}
	}
	out := append(AppendProxyOutputHeader(nil, 9, len(inner)), inner...)
	if h, err := ReadHeader(out, FrameSizeDefault); err != nil || h.Type != TypeProxyOutput || int(h.Length) != len(out)-HeaderSize {
		t.Fatalf("output header %+v err %v", h, err)
	}
	if s, frames, err := DecodeProxyOutput(out[HeaderSize:]); err != nil || s != 9 || !bytes.Equal(frames, inner) {
		t.Fatalf("output: %d % x %v", s, frames, err)
	}
	if _, _, err := DecodeProxyOutput(out[HeaderSize : HeaderSize+7]); err == nil {
		t.Fatal("short output decoded")
	}
	c := AppendProxyClose(nil, 5)
	if s, err := DecodeProxyClose(c[HeaderSize:]); err != nil || s != 5 {
		t.Fatalf("close: %d %v", s, err)
	}
	if _, err := DecodeProxyClose(c[HeaderSize : len(c)-1]); err == nil {
		t.Fatal("short close decoded")
	}
}
