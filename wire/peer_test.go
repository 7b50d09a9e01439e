package wire

import (
	"bytes"
	"testing"
)

func TestCtlRequestRoundTrip(t *testing.T) {
	for _, body := range [][]byte{nil, {1}, bytes.Repeat([]byte{7}, 1000)} {
		f := AppendCtlRequest(nil, CtlRequest{ID: 42, Op: 9, Body: body})
		h, err := ReadHeader(f, FrameSizeDefault)
		if err != nil || h.Type != TypeCtlRequest || int(h.Length) != len(f)-HeaderSize {
			t.Fatalf("header %+v err %v", h, err)
		}
		r, err := DecodeCtlRequest(f[HeaderSize:])
		if err != nil || r.ID != 42 || r.Op != 9 || !bytes.Equal(r.Body, body) {
			t.Fatalf("got %+v err %v", r, err)
		}
	}
}

func TestCtlResponseRoundTrip(t *testing.T) {
	f := AppendCtlResponse(nil, CtlResponse{ID: 7, Status: 3, Leader: "127.0.0.1:7402", Body: []byte("xyz")})
	h, err := ReadHeader(f, FrameSizeDefault)
	if err != nil || h.Type != TypeCtlResponse {
		t.Fatal(h, err)
	}
	r, err := DecodeCtlResponse(f[HeaderSize:])
	if err != nil || r.ID != 7 || r.Status != 3 || r.Leader != "127.0.0.1:7402" || string(r.Body) != "xyz" {
		t.Fatalf("got %+v err %v", r, err)
	}
}

func TestPeerDecodeRejectsTruncated(t *testing.T) {
	req := AppendCtlRequest(nil, CtlRequest{ID: 1, Op: 2, Body: []byte("hello")})[HeaderSize:]
	resp := AppendCtlResponse(nil, CtlResponse{ID: 1, Leader: "a:1", Body: []byte("hello")})[HeaderSize:]
	for i := 0; i < len(req); i++ {
		if _, err := DecodeCtlRequest(req[:i]); err == nil {
			t.Fatalf("request truncated to %d decoded", i)
		}
	}
	for i := 0; i < len(resp); i++ {
		if _, err := DecodeCtlResponse(resp[:i]); err == nil {
			t.Fatalf("response truncated to %d decoded", i)
		}
	}
}

func FuzzPeerCtl(f *testing.F) {
	f.Add(AppendCtlRequest(nil, CtlRequest{ID: 1, Body: []byte("x")})[HeaderSize:])
	f.Add(AppendCtlResponse(nil, CtlResponse{ID: 1, Leader: "l", Body: []byte("x")})[HeaderSize:])
	f.Fuzz(func(t *testing.T, b []byte) {
		if r, err := DecodeCtlRequest(b); err == nil {
			again := AppendCtlRequest(nil, r)[HeaderSize:]
			if !bytes.Equal(again, b) {
				t.Fatalf("request re-encode differs")
			}
		}
		if r, err := DecodeCtlResponse(b); err == nil {
			again := AppendCtlResponse(nil, r)[HeaderSize:]
			if !bytes.Equal(again, b) {
				t.Fatalf("response re-encode differs")
			}
		}
	})
}

func TestRaftHelloRoundTripAndMalformed(t *testing.T) {
	f := AppendRaftHello(nil, 7, "127.0.0.1:7402")
	h, err := ReadHeader(f, FrameSizeMax)
	if err != nil || h.Type != TypeRaftHello || int(h.Length) != len(f)-HeaderSize {
		t.Fatalf("header %+v %v", h, err)
	}
	id, addr, err := DecodeRaftHello(f[HeaderSize:])
	if err != nil || id != 7 || addr != "127.0.0.1:7402" {
		t.Fatalf("decoded %d %q %v", id, addr, err)
	}
	for _, bad := range [][]byte{nil, make([]byte, 8), f[HeaderSize : len(f)-1 : len(f)-1], append(append([]byte{}, f[HeaderSize:]...), 'x')} {
		if _, _, err := DecodeRaftHello(bad); err == nil {
			t.Fatalf("malformed hello %x decoded", bad)
		}
	}
}
