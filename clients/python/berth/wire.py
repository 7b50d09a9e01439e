"""Frame codecs for the Berth client protocol, version 1.0 (docs/PROTOCOL.md).

Pure functions: no I/O. Encoders return ``bytes`` (a whole frame, header
included); ``decode_*`` take a frame body and raise :class:`MalformedFrame`
when it does not decode exactly (PROTOCOL.md 1.1, rule 6).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Iterable, Sequence

MAGIC0 = 0xB3
MAGIC1 = 0x27
MAJOR = 1
MINOR = 0
VERSION_1_0 = (MAJOR << 8) | MINOR

HEADER_LEN = 12

# Limits (PROTOCOL.md 1.3).
FRAME_SIZE_MIN = 4096
FRAME_SIZE_DEFAULT = 1 << 20
FRAME_SIZE_MAX = 64 << 20
NAME_LEN_MAX = 255
ROUTING_KEY_LEN_MAX = 1024
TEXT_LEN_MAX = 4096
PROPS_LEN_MAX = 65536
VERSIONS_MAX = 16
ADDRS_MAX = 64
RANGES_MAX = 4096
BATCH_MAX = 4096

# Frame types (PROTOCOL.md 1.2).
HELLO = 0x01
WELCOME = 0x02
HEARTBEAT = 0x03
CLOSE = 0x04
COMPLETE = 0x05
ERROR = 0x06
DECLARE_QUEUE = 0x10
DECLARE_EXCHANGE = 0x11
BIND = 0x12
UNBIND = 0x13
DELETE = 0x14
PURGE = 0x15
PUBLISH = 0x20
SUBSCRIBE = 0x21
CANCEL = 0x22
CREDIT = 0x23
DELIVER = 0x24
ACCEPT = 0x25
RELEASE = 0x26
REJECT = 0x27

# Types a client may receive once the session is open.
SERVER_TYPES = frozenset({WELCOME, HEARTBEAT, CLOSE, COMPLETE, ERROR, DELIVER})

# Queue flags (4.1), exchange flags (4.2), delete flags (4.4).
QF_DURABLE = 0x0001
QF_EXCLUSIVE = 0x0002
QF_AUTO_DELETE = 0x0004
QF_PASSIVE = 0x0008
QF_NO_REPLICATE = 0x0010
EF_DURABLE = 0x0001
EF_AUTO_DELETE = 0x0004
EF_PASSIVE = 0x0008
DF_IF_UNUSED = 0x0001
DF_IF_EMPTY = 0x0002

# Message flags (5.1, 6.4).
MF_PERSISTENT = 0x01
MF_REDELIVERED = 0x02

_HDR = struct.Struct(">BBBBBBHI")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_RANGE = struct.Struct(">QQ")
_PUB_MSG_HEAD = struct.Struct(">BQ")  # flags, ttl_ms


class MalformedFrame(ValueError):
    """A frame body that does not decode exactly."""


# ---------------------------------------------------------------- encoding


def header(ftype: int, length: int, minor: int = MINOR) -> bytes:
    return _HDR.pack(MAGIC0, MAGIC1, MAJOR, minor, ftype, 0, 0, length)


def frame(ftype: int, body: bytes = b"") -> bytes:
    return header(ftype, len(body)) + body


def enc_str(s: str | bytes, limit: int, what: str = "string") -> bytes:
    b = s.encode("utf-8") if isinstance(s, str) else bytes(s)
    if len(b) > limit:
        raise ValueError(f"{what} is {len(b)} bytes, at most {limit} allowed")
    return _U16.pack(len(b)) + b


def enc_bytes(b: bytes, limit: int | None = None, what: str = "bytes") -> bytes:
    if limit is not None and len(b) > limit:
        raise ValueError(f"{what} is {len(b)} bytes, at most {limit} allowed")
    return _U32.pack(len(b)) + b


def enc_ranges(ranges: Sequence[tuple[int, int]]) -> bytes:
    if len(ranges) > RANGES_MAX:
        raise ValueError(f"{len(ranges)} ranges, at most {RANGES_MAX} allowed")
    parts = [_U16.pack(len(ranges))]
    for first, last in ranges:
        if first > last:
            raise ValueError(f"range {first}..{last}: first > last")
        parts.append(_RANGE.pack(first, last))
    return b"".join(parts)


def to_ranges(ids: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted, merged inclusive ranges covering ``ids``."""
    out: list[tuple[int, int]] = []
    for i in sorted(set(ids)):
        if out and out[-1][1] + 1 == i:
            out[-1] = (out[-1][0], i)
        else:
            out.append((i, i))
    return out


def hello(
    client_name: str,
    versions: Sequence[int] = (VERSION_1_0,),
    mechanism: str = "none",
    auth: bytes = b"",
    frame_size_max: int = 0,
    heartbeat_ms: int = 0,
) -> bytes:
    if not 1 <= len(versions) <= VERSIONS_MAX:
        raise ValueError("offer 1 to 16 versions")
    body = b"".join(
        [
            bytes([len(versions)]),
            b"".join(_U16.pack(v) for v in versions),
            enc_str(client_name, NAME_LEN_MAX, "client name"),
            enc_str(mechanism, NAME_LEN_MAX, "mechanism"),
            enc_bytes(auth, TEXT_LEN_MAX, "auth"),
            _U32.pack(frame_size_max),
            _U32.pack(heartbeat_ms),
        ]
    )
    newest_minor = max(v & 0xFF for v in versions if v >> 8 == MAJOR)
    return header(HELLO, len(body), newest_minor) + body


def heartbeat() -> bytes:
    return header(HEARTBEAT, 0)


def close(code: int, reason: str = "") -> bytes:
    return frame(CLOSE, _U16.pack(code) + enc_str(reason, TEXT_LEN_MAX, "reason"))


def declare_queue(
    cid: int,
    name: str,
    flags: int = 0,
    max_deliveries: int = 0,
    message_ttl_ms: int = 0,
    max_length: int = 0,
    max_length_bytes: int = 0,
    overflow: int = 0,
    dead_letter_exchange: str = "",
    dead_letter_key: str = "",
) -> bytes:
    body = b"".join(
        [
            _U64.pack(cid),
            enc_str(name, NAME_LEN_MAX, "queue name"),
            struct.pack(">HIQQQB", flags, max_deliveries, message_ttl_ms,
                        max_length, max_length_bytes, overflow),
            enc_str(dead_letter_exchange, NAME_LEN_MAX, "dead-letter exchange"),
            enc_str(dead_letter_key, ROUTING_KEY_LEN_MAX, "dead-letter key"),
        ]
    )
    return frame(DECLARE_QUEUE, body)


def declare_exchange(cid: int, name: str, kind: int, flags: int = 0) -> bytes:
    body = (_U64.pack(cid) + enc_str(name, NAME_LEN_MAX, "exchange name")
            + struct.pack(">BH", kind, flags))
    return frame(DECLARE_EXCHANGE, body)


def bind(cid: int, exchange: str, queue: str, key: str, unbind: bool = False) -> bytes:
    body = (_U64.pack(cid) + enc_str(exchange, NAME_LEN_MAX, "exchange name")
            + enc_str(queue, NAME_LEN_MAX, "queue name")
            + enc_str(key, ROUTING_KEY_LEN_MAX, "binding key"))
    return frame(UNBIND if unbind else BIND, body)


def delete(cid: int, what: int, name: str, flags: int = 0) -> bytes:
    body = _U64.pack(cid) + struct.pack(">BH", what, flags) + enc_str(name, NAME_LEN_MAX, "name")
    return frame(DELETE, body)


def purge(cid: int, queue: str) -> bytes:
    return frame(PURGE, _U64.pack(cid) + enc_str(queue, NAME_LEN_MAX, "queue name"))


def publish_message(routing_key: bytes, payload: bytes, props: bytes = b"",
                    persistent: bool = False, ttl_ms: int = 0) -> bytes:
    """One message of a PUBLISH body (5.1); ``routing_key`` already UTF-8."""
    if len(routing_key) > ROUTING_KEY_LEN_MAX:
        raise ValueError(f"routing key is {len(routing_key)} bytes, at most {ROUTING_KEY_LEN_MAX} allowed")
    if len(props) > PROPS_LEN_MAX:
        raise ValueError(f"props are {len(props)} bytes, at most {PROPS_LEN_MAX} allowed")
    return b"".join((
        _PUB_MSG_HEAD.pack(MF_PERSISTENT if persistent else 0, ttl_ms),
        _U16.pack(len(routing_key)), routing_key,
        _U32.pack(len(props)), props,
        _U32.pack(len(payload)), payload,
    ))


def publish_overhead(exchange: bytes) -> int:
    """Bytes of a PUBLISH frame besides its messages."""
    return HEADER_LEN + 8 + 2 + len(exchange) + 2


def publish(first_id: int, exchange: bytes, messages: Sequence[bytes]) -> bytes:
    """A PUBLISH frame of pre-encoded messages (see :func:`publish_message`)."""
    if not 1 <= len(messages) <= BATCH_MAX:
        raise ValueError("a PUBLISH carries 1 to 4096 messages")
    head = _U64.pack(first_id) + _U16.pack(len(exchange)) + exchange + _U16.pack(len(messages))
    length = len(head) + sum(len(m) for m in messages)
    return header(PUBLISH, length) + head + b"".join(messages)


def subscribe(cid: int, consumer_id: int, queue: str, credit: int,
              ack_mode: int = 0, flags: int = 0) -> bytes:
    body = (_U64.pack(cid) + _U32.pack(consumer_id)
            + enc_str(queue, NAME_LEN_MAX, "queue name")
            + struct.pack(">IBB", credit, ack_mode, flags))
    return frame(SUBSCRIBE, body)


def cancel(cid: int, consumer_id: int) -> bytes:
    return frame(CANCEL, _U64.pack(cid) + _U32.pack(consumer_id))


def credit(consumer_id: int, n: int) -> bytes:
    return frame(CREDIT, struct.pack(">II", consumer_id, n))


def settle(ftype: int, cid: int, consumer_id: int, ranges: Sequence[tuple[int, int]]) -> bytes:
    if ftype not in (ACCEPT, RELEASE, REJECT):
        raise ValueError("not a settling frame type")
    return frame(ftype, _U64.pack(cid) + _U32.pack(consumer_id) + enc_ranges(ranges))


# ---------------------------------------------------------------- decoding


@dataclass
class Header:
    major: int
    minor: int
    type: int
    flags: int
    channel: int
    length: int


def decode_header(buf, off: int = 0) -> Header:
    m0, m1, major, minor, ftype, flags, channel, length = _HDR.unpack_from(buf, off)
    if m0 != MAGIC0 or m1 != MAGIC1:
        raise MalformedFrame(f"bad magic {m0:02x} {m1:02x}")
    return Header(major, minor, ftype, flags, channel, length)


class Reader:
    """Reads fields from one frame body, refusing to run past its end."""

    __slots__ = ("buf", "pos", "end")

    def __init__(self, buf, pos: int = 0, end: int | None = None):
        self.buf = buf
        self.pos = pos
        self.end = len(buf) if end is None else end

    def _need(self, n: int) -> int:
        p = self.pos
        if p + n > self.end:
            raise MalformedFrame("field runs past the end of the body")
        self.pos = p + n
        return p

    def u8(self) -> int:
        return self.buf[self._need(1)]

    def u16(self) -> int:
        return _U16.unpack_from(self.buf, self._need(2))[0]

    def u32(self) -> int:
        return _U32.unpack_from(self.buf, self._need(4))[0]

    def u64(self) -> int:
        return _U64.unpack_from(self.buf, self._need(8))[0]

    def raw(self, n: int) -> bytes:
        p = self._need(n)
        return bytes(self.buf[p:p + n])

    def str(self, limit: int) -> str:
        n = self.u16()
        if n > limit:
            raise MalformedFrame(f"string of {n} bytes over its maximum {limit}")
        try:
            return self.raw(n).decode("utf-8")
        except UnicodeDecodeError as e:
            raise MalformedFrame(f"string is not UTF-8: {e}") from None

    def bytes(self, limit: int | None = None) -> bytes:
        n = self.u32()
        if limit is not None and n > limit:
            raise MalformedFrame(f"byte field of {n} bytes over its maximum {limit}")
        return self.raw(n)

    def ranges(self) -> list[tuple[int, int]]:
        n = self.u16()
        if n > RANGES_MAX:
            raise MalformedFrame(f"{n} ranges, at most {RANGES_MAX}")
        p = self._need(16 * n)
        out = []
        for i in range(n):
            first, last = _RANGE.unpack_from(self.buf, p + 16 * i)
            if first > last:
                raise MalformedFrame(f"range {first}..{last} has first > last")
            out.append((first, last))
        return out

    def done(self) -> None:
        if self.pos != self.end:
            raise MalformedFrame(f"{self.end - self.pos} bytes left over after the last field")


@dataclass
class Welcome:
    version: int
    frame_size_max: int
    heartbeat_ms: int
    credit_max: int
    window_max: int
    server_name: str
    addrs: list[str] = field(default_factory=list)


def decode_welcome(body, pos: int = 0, end: int | None = None) -> Welcome:
    r = Reader(body, pos, end)
    w = Welcome(r.u16(), r.u32(), r.u32(), r.u32(), r.u32(), r.str(NAME_LEN_MAX))
    n = r.u16()
    if n > ADDRS_MAX:
        raise MalformedFrame(f"{n} addresses, at most {ADDRS_MAX}")
    w.addrs = [r.str(NAME_LEN_MAX) for _ in range(n)]
    r.done()
    return w


def decode_close(body, pos: int = 0, end: int | None = None) -> tuple[int, str]:
    r = Reader(body, pos, end)
    code, reason = r.u16(), r.str(TEXT_LEN_MAX)
    r.done()
    return code, reason


def decode_error(body, pos: int = 0, end: int | None = None) -> tuple[int, int, str]:
    r = Reader(body, pos, end)
    cid, code, text = r.u64(), r.u16(), r.str(TEXT_LEN_MAX)
    r.done()
    return cid, code, text


def decode_complete(body, pos: int = 0, end: int | None = None) -> list[tuple[int, int]]:
    r = Reader(body, pos, end)
    ranges = r.ranges()
    r.done()
    return ranges


@dataclass
class Delivery:
    """One message of a DELIVER frame (6.4)."""

    tag: int
    delivery_count: int
    flags: int
    exchange: str
    routing_key: str
    props: bytes
    payload: bytes


_DLV_FRAME_HEAD = struct.Struct(">IH")  # consumer_id, count
_DLV_MSG_FIXED = struct.Struct(">QIBH")  # tag, delivery_count, flags, exchange length


def decode_deliver(body, pos: int = 0, end: int | None = None, make=Delivery) -> tuple[int, list]:
    """Consumer id and its messages, each built by ``make(tag, delivery_count,
    flags, exchange, routing_key, props, payload)``.

    Written out field by field (not with :class:`Reader`): this is the hot
    path of consuming.
    """
    if end is None:
        end = len(body)
    if end - pos < 6:
        raise MalformedFrame("DELIVER too short")
    consumer_id, n = _DLV_FRAME_HEAD.unpack_from(body, pos)
    if not 1 <= n <= BATCH_MAX:
        raise MalformedFrame(f"DELIVER of {n} messages, 1 to {BATCH_MAX} allowed")
    p = pos + 6
    out = []
    u16, u32 = _U16.unpack_from, _U32.unpack_from
    fixed = _DLV_MSG_FIXED.unpack_from
    try:
        for _ in range(n):
            if p + 15 > end:
                raise MalformedFrame("DELIVER message runs past the end of the body")
            tag, count, flags, exlen = fixed(body, p)
            p += 15
            if exlen > NAME_LEN_MAX or p + exlen + 2 > end:
                raise MalformedFrame("DELIVER exchange over its maximum or past the end")
            exchange = body[p:p + exlen].decode("utf-8")
            p += exlen
            klen = u16(body, p)[0]
            p += 2
            if klen > ROUTING_KEY_LEN_MAX or p + klen + 4 > end:
                raise MalformedFrame("DELIVER routing key over its maximum or past the end")
            key = body[p:p + klen].decode("utf-8")
            p += klen
            plen = u32(body, p)[0]
            p += 4
            if plen > PROPS_LEN_MAX or p + plen + 4 > end:
                raise MalformedFrame("DELIVER props over their maximum or past the end")
            props = bytes(body[p:p + plen])
            p += plen
            ylen = u32(body, p)[0]
            p += 4
            if p + ylen > end:
                raise MalformedFrame("DELIVER payload runs past the end of the body")
            payload = bytes(body[p:p + ylen])
            p += ylen
            out.append(make(tag, count, flags, exchange, key, props, payload))
    except UnicodeDecodeError as e:
        raise MalformedFrame(f"string is not UTF-8: {e}") from None
    if p != end:
        raise MalformedFrame(f"{end - p} bytes left over after the last field")
    return consumer_id, out
