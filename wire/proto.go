package wire

import "fmt"

// Client protocol frame types (v1).
const (
	TypeHello           Type = 0x01
	TypeWelcome         Type = 0x02
	TypeHeartbeat       Type = 0x03
	TypeClose           Type = 0x04
	TypeComplete        Type = 0x05
	TypeError           Type = 0x06
	TypeAuth            Type = 0x07 // 1.1: a SASL step in the handshake, both ways
	TypeDeclareQueue    Type = 0x10
	TypeDeclareExchange Type = 0x11
	TypeBind            Type = 0x12
	TypeUnbind          Type = 0x13
	TypeDelete          Type = 0x14
	TypePurge           Type = 0x15
	TypePublish         Type = 0x20
	TypeSubscribe       Type = 0x21
	TypeCancel          Type = 0x22
	TypeCredit          Type = 0x23
	TypeDeliver         Type = 0x24
	TypeAccept          Type = 0x25
	TypeRelease         Type = 0x26
	TypeReject          Type = 0x27
	TypeCancelled       Type = 0x28 // 1.3: the broker ended a consumer, server to client
)

var typeNames = [256]string{
	TypeHello: "HELLO", TypeWelcome: "WELCOME", TypeHeartbeat: "HEARTBEAT",
	TypeClose: "CLOSE", TypeComplete: "COMPLETE", TypeError: "ERROR", TypeAuth: "AUTH",
	TypeDeclareQueue: "DECLARE_QUEUE", TypeDeclareExchange: "DECLARE_EXCHANGE",
	TypeBind: "BIND", TypeUnbind: "UNBIND", TypeDelete: "DELETE", TypePurge: "PURGE",
	TypePublish: "PUBLISH", TypeSubscribe: "SUBSCRIBE", TypeCancel: "CANCEL",
	TypeCredit: "CREDIT", TypeDeliver: "DELIVER", TypeAccept: "ACCEPT",
	TypeRelease: "RELEASE", TypeReject: "REJECT", TypeCancelled: "CANCELLED",
}

func (t Type) String() string {
	if s := typeNames[t]; s != "" {
		return s
	}
	return "UNKNOWN"
}

// IsClientType reports whether t is a client protocol type known to v1.
func IsClientType(t Type) bool { return t < 0x80 && typeNames[t] != "" }

// ErrorCode is carried by ERROR and CLOSE.
type ErrorCode uint16

const (
	CodeOK                 ErrorCode = 0
	CodeMalformed          ErrorCode = 1  // frame could not be decoded; connection closes
	CodeVersion            ErrorCode = 2  // no common protocol version
	CodeFrameTooLarge      ErrorCode = 3  // frame larger than negotiated maximum
	CodeNotFound           ErrorCode = 4  // queue, exchange or consumer does not exist
	CodePreconditionFailed ErrorCode = 5  // redeclare with other options, delete if-unused/if-empty
	CodeResourceLimit      ErrorCode = 6  // queue full (reject-publish), credit or window exceeded
	CodeNotAllowed         ErrorCode = 7  // exclusive queue of another session, bad state
	CodeStore              ErrorCode = 8  // journal write or fsync failed; the command did not complete
	CodeInvalid            ErrorCode = 9  // well-formed frame with an invalid argument
	CodeHeartbeatTimeout   ErrorCode = 10 // peer missed its heartbeats
	CodeShutdown           ErrorCode = 11 // server shutting down
	CodeInternal           ErrorCode = 12
	CodeUnexpected         ErrorCode = 13 // frame not valid in this state (e.g. before HELLO)
	CodeAuthFailed         ErrorCode = 14 // login refused: bad credentials, unknown user or refused mechanism
	CodeUnavailable        ErrorCode = 15 // a replicated queue's group cannot take the command now: not taken; retry
	// CodeOutcomeUnknown (1.4): the broker lost track of the command
	// (its queue's master was lost with it in flight): it may or may not
	// have been carried out. Sessions before 1.4 get CodeUnavailable.
	CodeOutcomeUnknown ErrorCode = 16
)

// For is the code a session of version v is sent for c: a code v does
// not know is replaced by the older code that stood for it, so
// outcome-unknown is unavailable before 1.4 (whose text says that the
// outcome is unknown). AppendError, AppendClose and AppendCancelled apply
// it to the code they are given.
func (c ErrorCode) For(v Version) ErrorCode {
	if c == CodeOutcomeUnknown && v < VersionOutcome {
		return CodeUnavailable
	}
	return c
}

// Outcome is what an error code says of the command an ERROR with it
// answers: whether the broker carried it out (docs/PROTOCOL.md 1.4).
type Outcome uint8

const (
	// OutcomeNone: the code never answers a command (ok, heartbeat-timeout:
	// CLOSE only).
	OutcomeNone Outcome = iota
	// OutcomeNotCarriedOut: nothing of the command took effect; sending
	// it again does it once.
	OutcomeNotCarriedOut
	// OutcomeUnknown: the command may or may not have taken effect (or,
	// for store, may or may not hold after a restart); sending it again
	// may do it twice.
	OutcomeUnknown
)

func (o Outcome) String() string {
	switch o {
	case OutcomeNone:
		return "none"
	case OutcomeNotCarriedOut:
		return "not carried out"
	case OutcomeUnknown:
		return "unknown"
	}
	return "outcome(" + itoa(int(o)) + ")"
}

// Outcome says whether a command answered by an ERROR with code c was
// carried out, in a session of 1.4 or later (before 1.4, unavailable
// also stood for outcome-unknown, which only its text told apart). A code
// this build does not know is OutcomeUnknown: a newer peer's code for a
// command that was not carried out is sent to older sessions as an older
// code (For).
func (c ErrorCode) Outcome() Outcome {
	switch c {
	case CodeOK, CodeHeartbeatTimeout:
		return OutcomeNone
	case CodeMalformed, CodeVersion, CodeFrameTooLarge, CodeNotFound, CodePreconditionFailed,
		CodeResourceLimit, CodeNotAllowed, CodeInvalid, CodeShutdown, CodeUnexpected,
		CodeAuthFailed, CodeUnavailable:
		return OutcomeNotCarriedOut
	}
	return OutcomeUnknown // store, internal, outcome-unknown, and codes this build does not know
}

var codeNames = map[ErrorCode]string{
	CodeOK: "ok", CodeMalformed: "malformed", CodeVersion: "version",
	CodeFrameTooLarge: "frame-too-large", CodeNotFound: "not-found",
	CodePreconditionFailed: "precondition-failed", CodeResourceLimit: "resource-limit",
	CodeNotAllowed: "not-allowed", CodeStore: "store", CodeInvalid: "invalid",
	CodeHeartbeatTimeout: "heartbeat-timeout", CodeShutdown: "shutdown",
	CodeInternal: "internal", CodeUnexpected: "unexpected", CodeAuthFailed: "auth-failed",
	CodeUnavailable: "unavailable", CodeOutcomeUnknown: "outcome-unknown",
}

func (c ErrorCode) String() string {
	if s, ok := codeNames[c]; ok {
		return s
	}
	return "code-" + itoa(int(c))
}

func itoa(v int) string {
	if v == 0 {
		return "0"
	}
	var b [20]byte
	i := len(b)
	neg := v < 0
	if neg {
		v = -v
	}
	for v > 0 {
		i--
		b[i] = byte('0' + v%10)
		v /= 10
	}
	if neg {
		i--
		b[i] = '-'
	}
	return string(b[i:])
}

// Hello opens a session. Sent by the client first.
type Hello struct {
	Versions     []Version // offered, any order; decoded into a fixed array
	versionsBuf  [VersionsMax]Version
	ClientName   []byte
	Mechanism    []byte // MechNone (or ""), MechPlain, MechScramSHA256 or MechExternal
	Auth         []byte
	FrameSizeMax uint32 // requested maximum frame size; 0 = default
	HeartbeatMs  uint32 // requested heartbeat interval; 0 = server default
}

// SASL mechanisms a client may name in HELLO.
const (
	// MechNone logs in as the default user, which exists only while no
	// user is defined and only for clients on a loopback address.
	MechNone = "none"
	// MechPlain carries RFC 4616's authzid NUL authcid NUL password in
	// HELLO's auth field; servers refuse it without TLS unless told not to.
	MechPlain = "PLAIN"
	// MechScramSHA256 (RFC 5802, RFC 7677): HELLO's auth field holds the
	// client-first message, then AUTH frames carry the rest (version 1.1).
	MechScramSHA256 = "SCRAM-SHA-256"
	// MechExternal takes the user from the TLS client certificate's
	// subject common name; HELLO's auth field is empty or that same name.
	MechExternal = "EXTERNAL"
)

// AppendHello appends a HELLO. Its header carries the highest version
// of our major offered (a 1.0 client's HELLO stays byte for byte what it
// was).
func AppendHello(b []byte, versions []Version, name, mechanism string, auth []byte, frameMax, heartbeatMs uint32) []byte {
	hv := Version10
	for _, v := range versions {
		if v.Major() == VersionMajor {
			hv = max(hv, v)
		}
	}
	b, s := StartFrame(b, hv, TypeHello, 0)
	b = AppendU8(b, uint8(len(versions)))
	for _, v := range versions {
		b = AppendU16(b, uint16(v))
	}
	b = AppendStr(b, name)
	b = AppendStr(b, mechanism)
	b = AppendBytes(b, auth)
	b = AppendU32(b, frameMax)
	b = AppendU32(b, heartbeatMs)
	EndFrame(b, s, 0)
	return b
}

func DecodeHello(body []byte, h *Hello) error {
	var r Reader
	r.Reset(body)
	n := int(r.U8())
	if n == 0 || n > VersionsMax {
		return ErrMalformed
	}
	for i := 0; i < n; i++ {
		h.versionsBuf[i] = Version(r.U16())
	}
	h.Versions = h.versionsBuf[:n]
	h.ClientName = r.Str(NameLenMax)
	h.Mechanism = r.Str(NameLenMax)
	h.Auth = r.Bytes(TextLenMax)
	h.FrameSizeMax = r.U32()
	h.HeartbeatMs = r.U32()
	return r.Done()
}

// Negotiate picks the highest offered version whose major equals ours and
// whose minor is not above ours. ok is false when there is none.
func Negotiate(offered []Version) (Version, bool) {
	var best Version
	found := false
	for _, v := range offered {
		if v.Major() != VersionMajor || v.Minor() > VersionMinor {
			continue
		}
		if !found || v > best {
			best, found = v, true
		}
	}
	return best, found
}

// Welcome answers HELLO.
type Welcome struct {
	Version      Version
	FrameSizeMax uint32
	HeartbeatMs  uint32
	CreditMax    uint32 // most credit a consumer may hold
	WindowMax    uint32 // most uncompleted commands a session may have
	ServerName   []byte
	Addrs        [][]byte // cluster addresses for failover
	addrsBuf     [AddrsMax][]byte
}

func AppendWelcome(b []byte, w *Welcome) []byte {
	b, s := StartFrame(b, w.Version, TypeWelcome, 0)
	b = AppendU16(b, uint16(w.Version))
	b = AppendU32(b, w.FrameSizeMax)
	b = AppendU32(b, w.HeartbeatMs)
	b = AppendU32(b, w.CreditMax)
	b = AppendU32(b, w.WindowMax)
	b = AppendStrBytes(b, w.ServerName)
	b = AppendU16(b, uint16(len(w.Addrs)))
	for _, a := range w.Addrs {
		b = AppendStrBytes(b, a)
	}
	EndFrame(b, s, 0)
	return b
}

func DecodeWelcome(body []byte, w *Welcome) error {
	var r Reader
	r.Reset(body)
	w.Version = Version(r.U16())
	w.FrameSizeMax = r.U32()
	w.HeartbeatMs = r.U32()
	w.CreditMax = r.U32()
	w.WindowMax = r.U32()
	w.ServerName = r.Str(NameLenMax)
	n := int(r.U16())
	if n > AddrsMax {
		return ErrTooMany
	}
	for i := 0; i < n; i++ {
		w.addrsBuf[i] = r.Str(NameLenMax)
	}
	w.Addrs = w.addrsBuf[:n]
	return r.Done()
}

// AppendHeartbeat appends an empty HEARTBEAT frame.
func AppendHeartbeat(b []byte, v Version) []byte {
	b, s := StartFrame(b, v, TypeHeartbeat, 0)
	EndFrame(b, s, 0)
	return b
}

// Auth is one step of a SASL exchange during the handshake (version
// 1.1): server to client a challenge, client to server a response. Data
// aliases the decoded body.
type Auth struct {
	Data []byte
}

// AppendAuth appends an AUTH frame.
func AppendAuth(b []byte, v Version, data []byte) []byte {
	b, s := StartFrame(b, v, TypeAuth, 0)
	b = AppendBytes(b, data)
	EndFrame(b, s, 0)
	return b
}

func DecodeAuth(body []byte, a *Auth) error {
	var r Reader
	r.Reset(body)
	a.Data = r.Bytes(TextLenMax)
	return r.Done()
}

// Close ends a session; the sender closes the connection after it.
type Close struct {
	Code   ErrorCode
	Reason []byte
}

// AppendClose appends a CLOSE frame; code is sent as code.For(v).
func AppendClose(b []byte, v Version, code ErrorCode, reason string) []byte {
	b, s := StartFrame(b, v, TypeClose, 0)
	b = AppendU16(b, uint16(code.For(v)))
	b = AppendStr(b, truncate(reason, TextLenMax))
	EndFrame(b, s, 0)
	return b
}

func DecodeClose(body []byte, c *Close) error {
	var r Reader
	r.Reset(body)
	c.Code = ErrorCode(r.U16())
	c.Reason = r.Str(TextLenMax)
	return r.Done()
}

// Error reports that a command failed. CommandID 0 means the error concerns
// the connection, not one command.
type Error struct {
	CommandID uint64
	Code      ErrorCode
	Text      []byte
}

// AppendError appends an ERROR frame; code is sent as code.For(v), so
// that a session never gets a code of a later version.
func AppendError(b []byte, v Version, id uint64, code ErrorCode, text string) []byte {
	b, s := StartFrame(b, v, TypeError, 0)
	b = AppendU64(b, id)
	b = AppendU16(b, uint16(code.For(v)))
	b = AppendStr(b, truncate(text, TextLenMax))
	EndFrame(b, s, 0)
	return b
}

func DecodeError(body []byte, e *Error) error {
	var r Reader
	r.Reset(body)
	e.CommandID = r.U64()
	e.Code = ErrorCode(r.U16())
	e.Text = r.Str(TextLenMax)
	return r.Done()
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// Range is an inclusive range of command ids or delivery tags.
type Range struct{ First, Last uint64 }

// RangeList is a decoded list of ranges that aliases the frame body.
type RangeList struct {
	b []byte
	n int
}

// Len is the number of ranges.
func (l RangeList) Len() int { return l.n }

// At returns range i.
func (l RangeList) At(i int) Range {
	var r Reader
	r.Reset(l.b[i*16:])
	return Range{First: r.U64(), Last: r.U64()}
}

func readRanges(r *Reader) RangeList {
	n := int(r.U16())
	if n > RangesMax {
		r.err = ErrTooMany
		return RangeList{}
	}
	start := r.off
	r.Skip(n * 16)
	if r.err != nil {
		return RangeList{}
	}
	l := RangeList{b: r.b[start:r.off], n: n}
	for i := 0; i < n; i++ {
		if rg := l.At(i); rg.First > rg.Last {
			r.fail()
			return RangeList{}
		}
	}
	return l
}

func appendRanges(b []byte, rs []Range) []byte {
	b = AppendU16(b, uint16(len(rs)))
	for _, rg := range rs {
		b = AppendU64(b, rg.First)
		b = AppendU64(b, rg.Last)
	}
	return b
}

// AddID adds id to a list of ranges, extending the last range when id
// follows it. Completions mostly come in id order, so lists stay short.
func AddID(rs []Range, id uint64) []Range {
	if n := len(rs); n > 0 && rs[n-1].Last+1 == id {
		rs[n-1].Last = id
		return rs
	}
	return append(rs, Range{First: id, Last: id})
}

// AppendCompletes appends as many COMPLETE frames as rs needs, each with
// at most RangesMax ranges.
func AppendCompletes(b []byte, v Version, rs []Range) []byte {
	for len(rs) > 0 {
		n := min(len(rs), RangesMax)
		b = AppendComplete(b, v, rs[:n])
		rs = rs[n:]
	}
	return b
}

// AppendComplete appends a COMPLETE for the given ranges of command ids.
func AppendComplete(b []byte, v Version, rs []Range) []byte {
	b, s := StartFrame(b, v, TypeComplete, 0)
	b = appendRanges(b, rs)
	EndFrame(b, s, 0)
	return b
}

// DecodeComplete decodes a COMPLETE body.
func DecodeComplete(body []byte) (RangeList, error) {
	var r Reader
	r.Reset(body)
	l := readRanges(&r)
	return l, r.Done()
}

// Queue declaration flags.
const (
	QueueDurable     uint16 = 1 << 0
	QueueExclusive   uint16 = 1 << 1
	QueueAutoDelete  uint16 = 1 << 2
	QueuePassive     uint16 = 1 << 3 // only check that it exists
	QueueNoReplicate uint16 = 1 << 4 // cluster: keep on one broker
)

// Overflow policies for a queue at its max length.
const (
	OverflowRejectPublish uint8 = 0
	OverflowDropHead      uint8 = 1
)

// DeclareQueue creates a queue, or checks that an existing one has the same
// options.
type DeclareQueue struct {
	CommandID uint64
	Name      []byte
	// Flags as sent: QueuePassive and QueueNoReplicate, and the option
	// flags of Options (set in Options when decoded, merged in when
	// encoded).
	Flags   uint16
	Options QueueOptions
}

// QueueOptions are a queue's options, fixed when it is declared. It is the
// one definition that the wire, the shards, the wiring and the controller
// share; zero values mean "none" or "unlimited".
type QueueOptions struct {
	Durable            bool
	Exclusive          bool
	AutoDelete         bool
	MaxDeliveries      uint32 // dead-letter a message delivered this often
	MessageTTLMs       uint64 // per-queue message TTL
	MaxLength          uint64 // messages
	MaxLengthBytes     uint64 // payload bytes
	Overflow           uint8  // OverflowRejectPublish or OverflowDropHead
	DeadLetterExchange string
	DeadLetterKey      string // "" keeps each message's routing key
	// MaxPriority makes a priority queue: messages carry a priority from
	// 0 to MaxPriority (a higher one is capped), and higher ones are
	// delivered first. 0 = a plain queue. At most PriorityMax.
	MaxPriority uint8
}

// PriorityMax is the largest max_priority a queue may have: 11 levels,
// 0 to 10, as RabbitMQ advises for x-max-priority.
const PriorityMax = 10

// TTLNanos is the per-queue message TTL in nanoseconds, 0 for none.
func (o *QueueOptions) TTLNanos() int64 { return int64(o.MessageTTLMs) * 1e6 }

// Check reports options that no queue may have.
func (o *QueueOptions) Check() error {
	switch {
	case o.Overflow > OverflowDropHead:
		return fmt.Errorf("unknown overflow policy %d", o.Overflow)
	case len(o.DeadLetterExchange) > NameLenMax:
		return fmt.Errorf("dead-letter exchange name longer than %d bytes", NameLenMax)
	case len(o.DeadLetterKey) > RoutingKeyLenMax:
		return fmt.Errorf("dead-letter key longer than %d bytes", RoutingKeyLenMax)
	case o.MaxPriority > PriorityMax:
		return fmt.Errorf("max priority %d above %d", o.MaxPriority, PriorityMax)
	}
	return nil
}

func (o *QueueOptions) flags() uint16 {
	var f uint16
	if o.Durable {
		f |= QueueDurable
	}
	if o.Exclusive {
		f |= QueueExclusive
	}
	if o.AutoDelete {
		f |= QueueAutoDelete
	}
	return f
}

func AppendDeclareQueue(b []byte, v Version, d *DeclareQueue) []byte {
	o := &d.Options
	b, s := StartFrame(b, v, TypeDeclareQueue, 0)
	b = AppendU64(b, d.CommandID)
	b = AppendStrBytes(b, d.Name)
	b = AppendU16(b, d.Flags|o.flags())
	b = AppendU32(b, o.MaxDeliveries)
	b = AppendU64(b, o.MessageTTLMs)
	b = AppendU64(b, o.MaxLength)
	b = AppendU64(b, o.MaxLengthBytes)
	b = AppendU8(b, o.Overflow)
	b = AppendStr(b, o.DeadLetterExchange)
	b = AppendStr(b, o.DeadLetterKey)
	if v >= VersionSchedule {
		b = AppendU8(b, o.MaxPriority)
	}
	EndFrame(b, s, 0)
	return b
}

// DecodeDeclareQueue decodes a DECLARE_QUEUE body of a session below 1.2
// (no max_priority). Name aliases body; the options' strings are copies.
func DecodeDeclareQueue(body []byte, d *DeclareQueue) error {
	return DecodeDeclareQueueVersion(body, VersionAuth, d)
}

// DecodeDeclareQueueVersion decodes a DECLARE_QUEUE body of a session of
// version v: from 1.2 on it ends with max_priority.
func DecodeDeclareQueueVersion(body []byte, v Version, d *DeclareQueue) error {
	var r Reader
	r.Reset(body)
	o := &d.Options
	d.CommandID = r.U64()
	d.Name = r.Str(NameLenMax)
	d.Flags = r.U16()
	o.Durable, o.Exclusive, o.AutoDelete = d.Flags&QueueDurable != 0, d.Flags&QueueExclusive != 0, d.Flags&QueueAutoDelete != 0
	o.MaxDeliveries = r.U32()
	o.MessageTTLMs = r.U64()
	o.MaxLength = r.U64()
	o.MaxLengthBytes = r.U64()
	o.Overflow = r.U8()
	o.DeadLetterExchange = string(r.Str(NameLenMax))
	o.DeadLetterKey = string(r.Str(RoutingKeyLenMax))
	o.MaxPriority = 0
	if v >= VersionSchedule {
		o.MaxPriority = r.U8()
	}
	return r.Done()
}

// Exchange kinds.
const (
	ExchangeDirect uint8 = 0
	ExchangeFanout uint8 = 1
	ExchangeTopic  uint8 = 2
)

// Exchange declaration flags.
const (
	ExchangeDurable    uint16 = 1 << 0
	ExchangeAutoDelete uint16 = 1 << 2
	ExchangePassive    uint16 = 1 << 3
)

type DeclareExchange struct {
	CommandID uint64
	Name      []byte
	Kind      uint8
	Flags     uint16
}

func AppendDeclareExchange(b []byte, v Version, d *DeclareExchange) []byte {
	b, s := StartFrame(b, v, TypeDeclareExchange, 0)
	b = AppendU64(b, d.CommandID)
	b = AppendStrBytes(b, d.Name)
	b = AppendU8(b, d.Kind)
	b = AppendU16(b, d.Flags)
	EndFrame(b, s, 0)
	return b
}

func DecodeDeclareExchange(body []byte, d *DeclareExchange) error {
	var r Reader
	r.Reset(body)
	d.CommandID = r.U64()
	d.Name = r.Str(NameLenMax)
	d.Kind = r.U8()
	d.Flags = r.U16()
	return r.Done()
}

// Bind is BIND or UNBIND.
type Bind struct {
	CommandID uint64
	Exchange  []byte
	Queue     []byte
	Key       []byte
}

// AppendBind appends a BIND (t = TypeBind) or UNBIND (t = TypeUnbind).
func AppendBind(b []byte, v Version, t Type, d *Bind) []byte {
	b, s := StartFrame(b, v, t, 0)
	b = AppendU64(b, d.CommandID)
	b = AppendStrBytes(b, d.Exchange)
	b = AppendStrBytes(b, d.Queue)
	b = AppendStrBytes(b, d.Key)
	EndFrame(b, s, 0)
	return b
}

func DecodeBind(body []byte, d *Bind) error {
	var r Reader
	r.Reset(body)
	d.CommandID = r.U64()
	d.Exchange = r.Str(NameLenMax)
	d.Queue = r.Str(NameLenMax)
	d.Key = r.Str(RoutingKeyLenMax)
	return r.Done()
}

// What DELETE removes, and its flags.
const (
	DeleteQueue    uint8 = 0
	DeleteExchange uint8 = 1

	DeleteIfUnused uint16 = 1 << 0
	DeleteIfEmpty  uint16 = 1 << 1
)

type Delete struct {
	CommandID uint64
	What      uint8
	Flags     uint16
	Name      []byte
}

func AppendDelete(b []byte, v Version, d *Delete) []byte {
	b, s := StartFrame(b, v, TypeDelete, 0)
	b = AppendU64(b, d.CommandID)
	b = AppendU8(b, d.What)
	b = AppendU16(b, d.Flags)
	b = AppendStrBytes(b, d.Name)
	EndFrame(b, s, 0)
	return b
}

func DecodeDelete(body []byte, d *Delete) error {
	var r Reader
	r.Reset(body)
	d.CommandID = r.U64()
	d.What = r.U8()
	d.Flags = r.U16()
	d.Name = r.Str(NameLenMax)
	return r.Done()
}

type Purge struct {
	CommandID uint64
	Queue     []byte
}

func AppendPurge(b []byte, v Version, id uint64, queue string) []byte {
	b, s := StartFrame(b, v, TypePurge, 0)
	b = AppendU64(b, id)
	b = AppendStr(b, queue)
	EndFrame(b, s, 0)
	return b
}

func DecodePurge(body []byte, p *Purge) error {
	var r Reader
	r.Reset(body)
	p.CommandID = r.U64()
	p.Queue = r.Str(NameLenMax)
	return r.Done()
}

// Message flags, in PUBLISH and DELIVER.
const (
	MsgPersistent  uint8 = 1 << 0
	MsgRedelivered uint8 = 1 << 1 // DELIVER only
	// MsgPriority (PUBLISH, 1.2): a u8 priority follows ttl_ms.
	MsgPriority uint8 = 1 << 2
	// MsgDeliverAt (PUBLISH, 1.2): a u64 deliver_at_ms (unix
	// milliseconds) follows ttl_ms and the priority, if any: the message
	// is not delivered before then.
	MsgDeliverAt uint8 = 1 << 3
)

// PublishProducer is a PUBLISH header flag (version 1.2 and later): the
// body carries a producer id right after first_id, and message i of the
// frame has sequence number first_id+i for that producer. A broker that
// already enqueued a message of this producer with an equal or higher
// sequence number on a queue skips it there and completes it.
const PublishProducer uint8 = 1 << 0

// msgExtension is the flags that add fields to a 1.2 PUBLISH message.
const msgExtension = MsgPriority | MsgDeliverAt

// Publish is a decoded PUBLISH frame: one exchange, Count messages whose
// command ids are FirstID, FirstID+1, ... Iterate with Next. Decoding checks
// every message up front, so Next cannot fail and a malformed frame has no
// partial effect.
type Publish struct {
	FirstID uint64
	// Producer is the producer id of a frame with the PublishProducer
	// flag, else 0. The sequence number of message i is FirstID+i.
	Producer uint64
	Exchange []byte
	Count    int
	r        Reader
	next     int
	ext      bool // 1.2: MsgPriority and MsgDeliverAt add fields
}

// PublishMessage is one message of a PUBLISH. Its slices alias the frame.
type PublishMessage struct {
	Flags    uint8
	TTLMs    uint64 // 0 = none
	Priority uint8  // with MsgPriority (1.2); else 0
	// DeliverAtMs is the unix time in milliseconds before which the
	// message is not delivered, with MsgDeliverAt (1.2); else 0.
	DeliverAtMs uint64
	RoutingKey  []byte
	Props       []byte // opaque to the broker; handed to consumers unchanged
	Payload     []byte
}

// AppendPublishStart begins a PUBLISH of count messages; append each with
// AppendPublishMessage, then call EndFrame(b, start, 0).
func AppendPublishStart(b []byte, v Version, firstID uint64, exchange string, count int) ([]byte, int) {
	b, s := StartFrame(b, v, TypePublish, 0)
	b = AppendU64(b, firstID)
	b = AppendStr(b, exchange)
	b = AppendU16(b, uint16(count))
	return b, s
}

// AppendPublishStartProducer is AppendPublishStart for a PUBLISH with the
// PublishProducer flag (version 1.2 and later; producer is not 0).
func AppendPublishStartProducer(b []byte, v Version, firstID, producer uint64, exchange string, count int) ([]byte, int) {
	b, s := StartFrame(b, v, TypePublish, PublishProducer)
	b = AppendU64(b, firstID)
	b = AppendU64(b, producer)
	b = AppendStr(b, exchange)
	b = AppendU16(b, uint16(count))
	return b, s
}

// PublishProducerOverhead is what the producer id adds to a PUBLISH.
const PublishProducerOverhead = 8

// PublishMessageOverhead is the encoded size of a message besides its
// routing key, props and payload.
const PublishMessageOverhead = 1 + 8 + 2 + 4 + 4

func AppendPublishMessage(b []byte, flags uint8, ttlMs uint64, key string, props, payload []byte) []byte {
	b = AppendU8(b, flags)
	b = AppendU64(b, ttlMs)
	b = AppendStr(b, key)
	b = AppendBytes(b, props)
	b = AppendBytes(b, payload)
	return b
}

// PublishExtensionBytes is what MsgPriority and MsgDeliverAt add to a
// message at most.
const PublishExtensionBytes = 1 + 8

// AppendPublishMessageAt is AppendPublishMessage for a 1.2 session: flags
// MsgPriority and MsgDeliverAt add the priority and deliverAtMs. Never
// set them in a session below 1.2.
func AppendPublishMessageAt(b []byte, flags uint8, ttlMs uint64, priority uint8, deliverAtMs uint64, key string, props, payload []byte) []byte {
	b = AppendU8(b, flags)
	b = AppendU64(b, ttlMs)
	if flags&MsgPriority != 0 {
		b = AppendU8(b, priority)
	}
	if flags&MsgDeliverAt != 0 {
		b = AppendU64(b, deliverAtMs)
	}
	b = AppendStr(b, key)
	b = AppendBytes(b, props)
	b = AppendBytes(b, payload)
	return b
}

// DecodePublish decodes a PUBLISH body of a session below 1.2, without
// header flags; its message flags add no fields.
func DecodePublish(body []byte, p *Publish) error {
	return DecodePublishSession(body, 0, VersionAuth, p)
}

// DecodePublishVersion decodes a PUBLISH body without header flags of a
// session of version v: from 1.2 on, MsgPriority and MsgDeliverAt add
// fields to a message.
func DecodePublishVersion(body []byte, v Version, p *Publish) error {
	return DecodePublishSession(body, 0, v, p)
}

// DecodePublishFlags decodes a 1.2 PUBLISH whose header carried flags.
func DecodePublishFlags(body []byte, flags uint8, p *Publish) error {
	return DecodePublishSession(body, flags, VersionProducer, p)
}

// DecodePublishSession decodes a PUBLISH of a session of version v whose
// header carried flags. Flags other than PublishProducer, that flag below
// 1.2, or a producer id of 0 are malformed.
func DecodePublishSession(body []byte, flags uint8, v Version, p *Publish) error {
	r := &p.r
	r.Reset(body)
	if flags&^PublishProducer != 0 || (flags != 0 && v < VersionProducer) {
		return ErrMalformed
	}
	p.ext = v >= VersionSchedule
	p.FirstID = r.U64()
	p.Producer = 0
	if flags&PublishProducer != 0 {
		p.Producer = r.U64()
		if p.Producer == 0 && r.err == nil {
			return ErrMalformed
		}
	}
	p.Exchange = r.Str(NameLenMax)
	p.Count = int(r.U16())
	p.next = 0
	if r.err != nil {
		return r.err
	}
	if p.Count == 0 || p.Count > BatchMax {
		return ErrMalformed
	}
	start := r.off
	for i := 0; i < p.Count; i++ {
		flags := r.U8()
		r.Skip(8)
		if p.ext {
			if flags&MsgPriority != 0 {
				r.Skip(1)
			}
			if flags&MsgDeliverAt != 0 {
				r.Skip(8)
			}
		}
		r.Str(RoutingKeyLenMax)
		r.Bytes(PropsLenMax)
		r.Bytes(len(body))
	}
	if err := r.Done(); err != nil {
		return err
	}
	r.off = start
	return nil
}

// Next decodes the next message into m; false when none are left.
func (p *Publish) Next(m *PublishMessage) bool {
	if p.next >= p.Count {
		return false
	}
	p.next++
	r := &p.r
	m.Flags = r.U8()
	m.TTLMs = r.U64()
	m.Priority, m.DeliverAtMs = 0, 0
	if !p.ext {
		m.Flags &^= msgExtension // bits a session below 1.2 may not give a meaning
	}
	if m.Flags&MsgPriority != 0 {
		m.Priority = r.U8()
	}
	if m.Flags&MsgDeliverAt != 0 {
		m.DeliverAtMs = r.U64()
	}
	m.RoutingKey = r.Str(RoutingKeyLenMax)
	m.Props = r.Bytes(PropsLenMax)
	m.Payload = r.Bytes(len(r.b))
	return true
}

// Ack modes for SUBSCRIBE.
const (
	AckExplicit uint8 = 0 // messages stay acquired until ACCEPT, RELEASE or REJECT
	AckNone     uint8 = 1 // at-most-once: accepted on delivery
)

// Subscribe flags.
const SubscribeExclusive uint8 = 1 << 0

type Subscribe struct {
	CommandID  uint64
	ConsumerID uint32 // chosen by the client, unique within its session
	Queue      []byte
	Credit     uint32
	AckMode    uint8
	Flags      uint8
}

func AppendSubscribe(b []byte, v Version, d *Subscribe) []byte {
	b, s := StartFrame(b, v, TypeSubscribe, 0)
	b = AppendU64(b, d.CommandID)
	b = AppendU32(b, d.ConsumerID)
	b = AppendStrBytes(b, d.Queue)
	b = AppendU32(b, d.Credit)
	b = AppendU8(b, d.AckMode)
	b = AppendU8(b, d.Flags)
	EndFrame(b, s, 0)
	return b
}

func DecodeSubscribe(body []byte, d *Subscribe) error {
	var r Reader
	r.Reset(body)
	d.CommandID = r.U64()
	d.ConsumerID = r.U32()
	d.Queue = r.Str(NameLenMax)
	d.Credit = r.U32()
	d.AckMode = r.U8()
	d.Flags = r.U8()
	return r.Done()
}

type Cancel struct {
	CommandID  uint64
	ConsumerID uint32
}

func AppendCancel(b []byte, v Version, id uint64, consumer uint32) []byte {
	b, s := StartFrame(b, v, TypeCancel, 0)
	b = AppendU64(b, id)
	b = AppendU32(b, consumer)
	EndFrame(b, s, 0)
	return b
}

func DecodeCancel(body []byte, c *Cancel) error {
	var r Reader
	r.Reset(body)
	c.CommandID = r.U64()
	c.ConsumerID = r.U32()
	return r.Done()
}

// Cancelled (1.3, server to client) says that the broker ended a
// consumer without the client asking: no DELIVER for it follows, its
// deliveries not yet accepted go back to the queue, and a settle naming it
// fails. Reason aliases the decoded body.
type Cancelled struct {
	ConsumerID uint32
	Code       ErrorCode
	Reason     []byte
}

// AppendCancelled appends a CANCELLED frame; reason is cut to TextLenMax,
// code is sent as code.For(v).
func AppendCancelled(b []byte, v Version, consumer uint32, code ErrorCode, reason string) []byte {
	b, s := StartFrame(b, v, TypeCancelled, 0)
	b = AppendU32(b, consumer)
	b = AppendU16(b, uint16(code.For(v)))
	b = AppendStr(b, truncate(reason, TextLenMax))
	EndFrame(b, s, 0)
	return b
}

// DecodeCancelled decodes a CANCELLED body.
func DecodeCancelled(body []byte, c *Cancelled) error {
	var r Reader
	r.Reset(body)
	c.ConsumerID = r.U32()
	c.Code = ErrorCode(r.U16())
	c.Reason = r.Str(TextLenMax)
	return r.Done()
}

// Credit adds credit to a consumer. It has no command id and no completion.
type Credit struct {
	ConsumerID uint32
	Credit     uint32
}

func AppendCredit(b []byte, v Version, consumer, credit uint32) []byte {
	b, s := StartFrame(b, v, TypeCredit, 0)
	b = AppendU32(b, consumer)
	b = AppendU32(b, credit)
	EndFrame(b, s, 0)
	return b
}

func DecodeCredit(body []byte, c *Credit) error {
	var r Reader
	r.Reset(body)
	c.ConsumerID = r.U32()
	c.Credit = r.U32()
	return r.Done()
}

// Deliver is a decoded DELIVER frame: Count messages for one consumer.
type Deliver struct {
	ConsumerID uint32
	Count      int
	r          Reader
	next       int
}

// DeliverMessage is one delivered message. Its slices alias the frame.
type DeliverMessage struct {
	Tag           uint64 // delivery tag, unique per consumer; ACCEPT/RELEASE/REJECT name it
	DeliveryCount uint32 // deliveries before this one
	Flags         uint8
	Exchange      []byte
	RoutingKey    []byte
	Props         []byte
	Payload       []byte
}

// AppendDeliverStart begins a DELIVER of count messages.
func AppendDeliverStart(b []byte, v Version, consumer uint32, count int) ([]byte, int) {
	b, s := StartFrame(b, v, TypeDeliver, 0)
	b = AppendU32(b, consumer)
	b = AppendU16(b, uint16(count))
	return b, s
}

// AppendDeliverMessageHead appends one message up to and including its
// payload length; the payload bytes follow out of band (writev) or through
// append by the caller.
func AppendDeliverMessageHead(b []byte, tag uint64, deliveryCount uint32, flags uint8, exchange, key, props []byte, payloadLen int) []byte {
	b = AppendU64(b, tag)
	b = AppendU32(b, deliveryCount)
	b = AppendU8(b, flags)
	b = AppendStrBytes(b, exchange)
	b = AppendStrBytes(b, key)
	b = AppendBytes(b, props)
	b = AppendU32(b, uint32(payloadLen))
	return b
}

// DeliverMessageOverhead is the encoded size of a delivered message besides
// its exchange, routing key, props and payload.
const DeliverMessageOverhead = 8 + 4 + 1 + 2 + 2 + 4 + 4

func DecodeDeliver(body []byte, d *Deliver) error {
	r := &d.r
	r.Reset(body)
	d.ConsumerID = r.U32()
	d.Count = int(r.U16())
	d.next = 0
	if r.err != nil {
		return r.err
	}
	if d.Count == 0 || d.Count > BatchMax {
		return ErrMalformed
	}
	start := r.off
	for i := 0; i < d.Count; i++ {
		r.Skip(8 + 4 + 1)
		r.Str(NameLenMax)
		r.Str(RoutingKeyLenMax)
		r.Bytes(PropsLenMax)
		r.Bytes(len(body))
	}
	if err := r.Done(); err != nil {
		return err
	}
	r.off = start
	return nil
}

// Next decodes the next message into m; false when none are left.
func (d *Deliver) Next(m *DeliverMessage) bool {
	if d.next >= d.Count {
		return false
	}
	d.next++
	r := &d.r
	m.Tag = r.U64()
	m.DeliveryCount = r.U32()
	m.Flags = r.U8()
	m.Exchange = r.Str(NameLenMax)
	m.RoutingKey = r.Str(RoutingKeyLenMax)
	m.Props = r.Bytes(PropsLenMax)
	m.Payload = r.Bytes(len(r.b))
	return true
}

// Settle is ACCEPT, RELEASE or REJECT over ranges of one consumer's tags.
type Settle struct {
	CommandID  uint64
	ConsumerID uint32
	Tags       RangeList
}

// AppendSettle appends an ACCEPT, RELEASE or REJECT (t).
func AppendSettle(b []byte, v Version, t Type, id uint64, consumer uint32, tags []Range) []byte {
	b, s := StartFrame(b, v, t, 0)
	b = AppendU64(b, id)
	b = AppendU32(b, consumer)
	b = appendRanges(b, tags)
	EndFrame(b, s, 0)
	return b
}

func DecodeSettle(body []byte, d *Settle) error {
	var r Reader
	r.Reset(body)
	d.CommandID = r.U64()
	d.ConsumerID = r.U32()
	d.Tags = readRanges(&r)
	return r.Done()
}
