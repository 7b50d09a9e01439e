package client

import (
	"bufio"
	"encoding/hex"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/berthmq/berth/wire"
)

// TestProtocolDocExamples decodes every example frame in docs/PROTOCOL.md
// with the wire codecs, so the document cannot drift from the code.
func TestProtocolDocExamples(t *testing.T) {
	f, err := os.Open("../docs/PROTOCOL.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var frames [][]byte
	var cur []byte
	inBlock := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "```") {
			if inBlock && len(cur) > 0 {
				frames = append(frames, cur)
			}
			inBlock, cur = !inBlock, nil
			continue
		}
		if !inBlock {
			continue
		}
		fields := strings.Fields(line)
		if len(cur) == 0 && (len(fields) < 2 || fields[0] != "b3" || fields[1] != "27") {
			continue // not a frame dump
		}
		for _, w := range fields {
			b, err := hex.DecodeString(w)
			if err != nil || len(w) != 2 {
				break // the annotation starts
			}
			cur = append(cur, b...)
		}
	}
	if len(frames) < 17 {
		t.Fatalf("found %d example frames, expected one per frame type", len(frames))
	}
	seen := map[wire.Type]bool{}
	producerSeen := false
	for _, fr := range frames {
		h, body, n, err := wire.Next(fr, wire.FrameSizeDefault)
		if err != nil || n != len(fr) {
			t.Fatalf("example % x: n=%d of %d, err %v", fr, n, len(fr), err)
		}
		seen[h.Type] = true
		if h.Type == wire.TypePublish && h.Flags != 0 {
			var p wire.Publish
			if err := wire.DecodePublishSession(body, h.Flags, h.Version, &p); err != nil || p.Producer == 0 || h.Version < wire.VersionProducer {
				t.Errorf("producer PUBLISH example (version %v): producer %x, %v", h.Version, p.Producer, err)
			}
			producerSeen = true
			continue
		}
		if err := decodeAny(h.Type, h.Version, body); err != nil {
			t.Errorf("example %v: %v", h.Type, err)
		}
	}
	if !producerSeen {
		t.Error("no example of a PUBLISH with a producer id")
	}
	for _, typ := range []wire.Type{wire.TypeHello, wire.TypeWelcome, wire.TypeHeartbeat, wire.TypeClose, wire.TypeComplete,
		wire.TypeError, wire.TypeAuth, wire.TypeDeclareQueue, wire.TypeDeclareExchange, wire.TypeBind, wire.TypeDelete, wire.TypePurge,
		wire.TypePublish, wire.TypeSubscribe, wire.TypeCancel, wire.TypeCancelled, wire.TypeCredit, wire.TypeDeliver, wire.TypeAccept,
		wire.TypeForwardHello, wire.TypeForward, wire.TypeForwardResult, wire.TypeProxyCommand, wire.TypeProxyOutput, wire.TypeProxyClose} {
		if !seen[typ] {
			t.Errorf("no example for %v", typ)
		}
	}
}

func decodeAny(t wire.Type, v wire.Version, body []byte) error {
	switch t {
	case wire.TypeHello:
		return wire.DecodeHello(body, &wire.Hello{})
	case wire.TypeWelcome:
		return wire.DecodeWelcome(body, &wire.Welcome{})
	case wire.TypeHeartbeat:
		if len(body) != 0 {
			return wire.ErrMalformed
		}
		return nil
	case wire.TypeClose:
		return wire.DecodeClose(body, &wire.Close{})
	case wire.TypeComplete:
		_, err := wire.DecodeComplete(body)
		return err
	case wire.TypeError:
		var e wire.Error
		if err := wire.DecodeError(body, &e); err != nil {
			return err
		}
		if e.Code != e.Code.For(v) {
			return fmt.Errorf("an ERROR example with code %v in version %v, which gets %v instead", e.Code, v, e.Code.For(v))
		}
		return nil
	case wire.TypeAuth:
		return wire.DecodeAuth(body, &wire.Auth{})
	case wire.TypeDeclareQueue:
		var d wire.DeclareQueue
		if err := wire.DecodeDeclareQueueVersion(body, v, &d); err != nil {
			return err
		}
		if v >= wire.VersionSchedule && d.Options.MaxPriority == 0 {
			return fmt.Errorf("the 1.2 example declares no max priority")
		}
		return nil
	case wire.TypeDeclareExchange:
		return wire.DecodeDeclareExchange(body, &wire.DeclareExchange{})
	case wire.TypeBind, wire.TypeUnbind:
		return wire.DecodeBind(body, &wire.Bind{})
	case wire.TypeDelete:
		return wire.DecodeDelete(body, &wire.Delete{})
	case wire.TypePurge:
		return wire.DecodePurge(body, &wire.Purge{})
	case wire.TypePublish:
		var p wire.Publish
		if err := wire.DecodePublishVersion(body, v, &p); err != nil {
			return err
		}
		if v >= wire.VersionSchedule {
			// The 1.2 example: priority 7, then priority 2 with a
			// deliver-at time of 2026-01-01T00:00:00Z.
			var m wire.PublishMessage
			var got []string
			for p.Next(&m) {
				got = append(got, fmt.Sprintf("%d/%d", m.Priority, m.DeliverAtMs))
			}
			if want := "[7/0 2/1767225600000]"; fmt.Sprint(got) != want {
				return fmt.Errorf("the 1.2 example decodes as %v, want %s", got, want)
			}
		}
		return nil
	case wire.TypeSubscribe:
		return wire.DecodeSubscribe(body, &wire.Subscribe{})
	case wire.TypeCancel:
		return wire.DecodeCancel(body, &wire.Cancel{})
	case wire.TypeCancelled:
		var c wire.Cancelled
		if err := wire.DecodeCancelled(body, &c); err != nil {
			return err
		}
		if v < wire.VersionCancelled {
			return fmt.Errorf("a CANCELLED example in version %v, before %v", v, wire.VersionCancelled)
		}
		return nil
	case wire.TypeCredit:
		return wire.DecodeCredit(body, &wire.Credit{})
	case wire.TypeDeliver:
		return wire.DecodeDeliver(body, &wire.Deliver{})
	case wire.TypeAccept, wire.TypeRelease, wire.TypeReject:
		return wire.DecodeSettle(body, &wire.Settle{})
	case wire.TypeForwardHello: // broker to broker (section 9)
		_, _, err := wire.DecodeForwardHello(body)
		return err
	case wire.TypeForward:
		_, _, _, err := wire.DecodeForward(body)
		return err
	case wire.TypeForwardResult:
		_, _, _, err := wire.DecodeForwardResult(body)
		return err
	case wire.TypeProxyCommand, wire.TypeProxyOutput:
		_, inner, err := wire.DecodeProxyOutput(body)
		if t == wire.TypeProxyCommand {
			_, _, _, inner, err = wire.DecodeProxyCommand(body)
		}
		if err != nil {
			return err
		}
		for len(inner) > 0 { // whole client frames
			h, b, n, err := wire.Next(inner, wire.FrameSizeDefault)
			if err != nil || n == 0 {
				return wire.ErrMalformed
			}
			if err := decodeAny(h.Type, h.Version, b); err != nil {
				return err
			}
			inner = inner[n:]
		}
		return nil
	case wire.TypeProxyClose:
		_, err := wire.DecodeProxyClose(body)
		return err
	}
	return wire.ErrUnknownType
}

// TestProtocolDocErrorCodes checks the error code table of
// docs/PROTOCOL.md (section 1.4) against wire: one row for every code
// wire knows and none other, each with wire's name and a "carried out?"
// column that says what wire.ErrorCode.Outcome says; and the document's
// version is wire's.
func TestProtocolDocErrorCodes(t *testing.T) {
	raw, err := os.ReadFile("../docs/PROTOCOL.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	if want := fmt.Sprintf("# Berth client protocol, version %v\n", wire.Current); !strings.HasPrefix(doc, want) {
		t.Errorf("the document does not start with %q", want)
	}
	if want := fmt.Sprintf("This server speaks %v.", wire.Current); !strings.Contains(doc, want) {
		t.Errorf("the document does not say %q", want)
	}
	start := strings.Index(doc, "### 1.4 Error codes")
	end := strings.Index(doc, "## 2. Session")
	if start < 0 || end < start {
		t.Fatal("no section 1.4 Error codes")
	}
	row := regexp.MustCompile(`^\|\s*(\d+)\s*\|\s*([a-z-]+)\s*\|\s*([^|]*?)\s*\|\s*(.*)\|\s*$`)
	outcomes := map[string]wire.Outcome{"—": wire.OutcomeNone, "no": wire.OutcomeNotCarriedOut, "unknown": wire.OutcomeUnknown}
	rows := map[wire.ErrorCode]bool{}
	header := false
	for _, line := range strings.Split(doc[start:end], "\n") {
		if strings.HasPrefix(line, "| code | name | carried out? | meaning |") {
			header = true
		}
		m := row.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		n, _ := strconv.Atoi(m[1])
		c := wire.ErrorCode(n)
		if rows[c] {
			t.Errorf("code %d: two rows", n)
		}
		rows[c] = true
		if m[2] != c.String() {
			t.Errorf("code %d: named %q, wire calls it %q", n, m[2], c)
		}
		o, ok := outcomes[m[3]]
		switch {
		case !ok:
			t.Errorf("code %d (%s): carried out? %q, want one of no, unknown, —", n, m[2], m[3])
		case o != c.Outcome():
			t.Errorf("code %d (%s): carried out? %q, wire.ErrorCode.Outcome says %v", n, m[2], m[3], c.Outcome())
		}
		if strings.TrimSpace(m[4]) == "" {
			t.Errorf("code %d (%s): no meaning", n, m[2])
		}
	}
	if !header {
		t.Error("the error code table has no carried out? column")
	}
	for c := wire.ErrorCode(0); c < 1024; c++ {
		if known := !strings.HasPrefix(c.String(), "code-"); known != rows[c] {
			t.Errorf("code %d (%v): known to wire %v, in the table %v", c, c, known, rows[c])
		}
	}
}
