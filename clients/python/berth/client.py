"""An asyncio client for the Berth broker (PROTOCOL.md version 1.0).

One :class:`Connection` is one session on one TCP connection. All its
methods must be called from the event loop that created it.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import functools
import logging
import struct
import time
from typing import Any, Callable, Iterable, Sequence

from . import errors as E
from . import wire

log = logging.getLogger("berth")

_U32 = struct.Struct(">I")


class ExchangeKind(enum.IntEnum):
    DIRECT = 0
    FANOUT = 1
    TOPIC = 2


class Overflow(enum.IntEnum):
    REJECT_PUBLISH = 0
    DROP_HEAD = 1


class AckMode(enum.IntEnum):
    EXPLICIT = 0
    NONE = 1


# Connection states.
_HANDSHAKE, _OPEN, _CLOSING, _CLOSED = range(4)


def _parse_addr(addr: str | tuple[str, int]) -> tuple[str, int]:
    if isinstance(addr, tuple):
        return addr[0], int(addr[1])
    addr = addr.strip()
    if addr.startswith("["):  # [v6]:port
        host, _, port = addr[1:].partition("]:")
    else:
        host, _, port = addr.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"address {addr!r} is not host:port")
    return host, int(port)


def _split_addrs(addresses) -> list:
    if isinstance(addresses, str):
        return [a for a in addresses.split(",") if a.strip()]
    if isinstance(addresses, tuple) and len(addresses) == 2 and isinstance(addresses[1], int):
        return [addresses]
    return list(addresses)


async def connect(
    addresses: str | Sequence[str | tuple[str, int]],
    *,
    client_name: str = "berth-python",
    heartbeat_ms: int = 0,
    frame_size_max: int = 0,
    connect_timeout: float = 5.0,
    on_error: Callable[[E.BerthError], Any] | None = None,
) -> "Connection":
    """Open a session with the first address that accepts one.

    ``addresses`` is ``"host:port"``, a comma-separated list of them, or a
    sequence of ``"host:port"`` strings or ``(host, port)`` tuples; they are
    tried in turn, each for at most ``connect_timeout`` seconds (TCP
    connect plus HELLO/WELCOME). Raises :class:`~berth.errors.ConnectError`
    listing every failure when none succeeds.

    ``heartbeat_ms`` and ``frame_size_max`` are requests (0 = the server's
    default); the negotiated values are in ``connection.welcome``.
    ``on_error`` receives ERROR frames that concern the connection rather
    than a command (command id 0); by default they are logged.
    """
    failures: list[tuple[str, BaseException]] = []
    for addr in _split_addrs(addresses):
        name = addr if isinstance(addr, str) else f"{addr[0]}:{addr[1]}"
        conn = None
        try:
            host, port = _parse_addr(addr)
            conn = Connection(client_name, heartbeat_ms, frame_size_max, on_error)
            await asyncio.wait_for(conn._open(host, port), connect_timeout)
            return conn
        except (OSError, asyncio.TimeoutError, E.BerthError, ValueError) as e:
            if isinstance(e, asyncio.TimeoutError):
                e = TimeoutError(f"no session within {connect_timeout} s")
            if conn is not None:
                conn._abort()
            failures.append((name.strip(), e))
            log.debug("berth: connect %s failed: %r", name, e)
    raise E.ConnectError(failures)


class _Proto(asyncio.Protocol):
    """Feeds bytes to the connection; keeps the write-pause state."""

    def __init__(self, conn: "Connection"):
        self.conn = conn

    def connection_made(self, transport):
        self.conn._transport = transport

    def data_received(self, data):
        self.conn._data_received(data)

    def connection_lost(self, exc):
        self.conn._connection_lost(exc)

    def pause_writing(self):
        self.conn._write_paused = self.conn._loop.create_future()

    def resume_writing(self):
        f, self.conn._write_paused = self.conn._write_paused, None
        if f is not None and not f.done():
            f.set_result(None)


class Connection:
    """A session. Create it with :func:`connect`."""

    def __init__(self, client_name, heartbeat_ms, frame_size_max, on_error):
        self._loop = asyncio.get_running_loop()
        self._client_name = client_name
        self._req_heartbeat = heartbeat_ms
        self._req_frame = frame_size_max
        self._on_error = on_error
        self._transport: asyncio.Transport | None = None
        self._state = _HANDSHAKE
        self._welcome_fut: asyncio.Future = self._loop.create_future()
        self._close_fut: asyncio.Future = self._loop.create_future()
        self._closed_exc: E.ConnectionClosedError | None = None
        self.welcome: wire.Welcome | None = None
        self.address: str = ""
        self.last_connection_error: E.BerthError | None = None
        # Inbound.
        self._rbuf = bytearray()
        self._frame_max = wire.FRAME_SIZE_DEFAULT  # until WELCOME
        self._last_recv = time.monotonic()
        # Outbound.
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._write_paused: asyncio.Future | None = None
        self._last_sent = time.monotonic()
        self._pub_ex: bytes | None = None
        self._pub_first = 0
        self._pub_msgs: list[bytes] = []
        self._pub_size = 0
        # Commands.
        self._next_id = 1
        self._pending: dict[int, asyncio.Future] = {}
        self._window = 0
        self._inflight = 0
        self._window_waiters: collections.deque[asyncio.Future] = collections.deque()
        # Consumers.
        self._next_consumer = 1
        self._consumers: dict[int, Consumer] = {}
        self._hb_handle: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------ opening

    async def _open(self, host: str, port: int) -> None:
        await self._loop.create_connection(lambda: _Proto(self), host, port)
        self.address = f"{host}:{port}"
        self._transport.write(wire.hello(self._client_name, frame_size_max=self._req_frame,
                                         heartbeat_ms=self._req_heartbeat))
        self._last_sent = time.monotonic()
        w: wire.Welcome = await asyncio.shield(self._welcome_fut)
        # PROTOCOL.md 3.2: reject a WELCOME we cannot live with.
        problem = None
        if w.version != wire.VERSION_1_0:
            problem = f"WELCOME chose version {w.version:#06x}, not offered"
        elif not wire.FRAME_SIZE_MIN <= w.frame_size_max <= wire.FRAME_SIZE_MAX:
            problem = f"WELCOME frame size {w.frame_size_max} outside {wire.FRAME_SIZE_MIN}..{wire.FRAME_SIZE_MAX}"
        elif w.window_max == 0 or w.credit_max == 0:
            problem = "WELCOME with a zero window or credit maximum"
        if problem:
            code = E.VERSION if "version" in problem else E.MALFORMED
            self._protocol_error(code, problem)
            raise E.ProtocolError(code, problem)
        self.welcome = w
        self._frame_max = w.frame_size_max
        self._window = w.window_max
        self._state = _OPEN
        if w.heartbeat_ms:
            self._hb_handle = self._loop.call_later(w.heartbeat_ms / 2000, self._heartbeat_tick)

    def _abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()
        self._finish(E.ConnectionClosedError(None, "connect aborted"))

    # ------------------------------------------------------------ reading

    def _data_received(self, data: bytes) -> None:
        self._last_recv = time.monotonic()
        buf = self._rbuf
        buf += data
        pos, n = 0, len(buf)
        try:
            while n - pos >= wire.HEADER_LEN and self._state != _CLOSED:
                h = wire.decode_header(buf, pos)
                limit = self._frame_max
                if h.type == wire.DELIVER and h.major == wire.MAJOR:
                    # PROTOCOL.md 2.3: one DELIVER may be as large as the
                    # server's own maximum, above what this session asked for.
                    limit = wire.FRAME_SIZE_MAX
                if wire.HEADER_LEN + h.length > limit:
                    raise E.ProtocolError(E.FRAME_TOO_LARGE,
                                          f"frame of {wire.HEADER_LEN + h.length} bytes, maximum {limit}")
                end = pos + wire.HEADER_LEN + h.length
                if end > n:
                    break
                start, pos = pos + wire.HEADER_LEN, end
                self._frame(h, buf, start, end)
        except wire.MalformedFrame as e:
            self._protocol_error(E.MALFORMED, str(e))
            return
        except E.ProtocolError as e:
            self._protocol_error(e.code, e.text)
            return
        if self._state == _CLOSED:
            buf.clear()
        else:
            del buf[:pos]

    def _frame(self, h: wire.Header, buf, start: int, end: int) -> None:
        if h.major != wire.MAJOR:
            raise E.ProtocolError(E.VERSION, f"frame of major version {h.major}")
        if h.minor > wire.MINOR:
            return  # rule 4: a newer minor's frame, skipped whole
        t = h.type
        if self._state == _HANDSHAKE and t not in (wire.WELCOME, wire.ERROR, wire.CLOSE, wire.HEARTBEAT):
            raise E.ProtocolError(E.UNEXPECTED, f"frame type {t:#04x} before WELCOME")
        if t == wire.DELIVER:
            self._on_deliver(buf, start, end)
        elif t == wire.COMPLETE:
            self._on_complete(wire.decode_complete(buf, start, end))
        elif t == wire.ERROR:
            self._on_error_frame(*wire.decode_error(buf, start, end))
        elif t == wire.HEARTBEAT:
            if end != start:
                raise wire.MalformedFrame("HEARTBEAT with a body")
        elif t == wire.CLOSE:
            self._on_close(*wire.decode_close(buf, start, end))
        elif t == wire.WELCOME and self._state == _HANDSHAKE:
            w = wire.decode_welcome(buf, start, end)
            if not self._welcome_fut.done():
                self._welcome_fut.set_result(w)
        elif t == wire.WELCOME:
            raise E.ProtocolError(E.UNEXPECTED, "a second WELCOME")
        else:
            raise E.ProtocolError(E.MALFORMED, f"frame type {t:#04x} is not valid from a server")

    def _on_complete(self, ranges: list[tuple[int, int]]) -> None:
        pending = self._pending
        done = 0
        for first, last in ranges:
            if last - first < 2 * len(pending):
                for cid in range(first, last + 1):
                    f = pending.pop(cid, None)
                    if f is not None:
                        done += 1
                        if not f.done():
                            f.set_result(None)
            else:  # a huge range: look only at what is outstanding
                for cid in [c for c in pending if first <= c <= last]:
                    f = pending.pop(cid)
                    done += 1
                    if not f.done():
                        f.set_result(None)
        if done:
            self._release(done)

    def _on_error_frame(self, cid: int, code: int, text: str) -> None:
        err = E.error_for(code, text, cid)
        if cid == 0:
            self.last_connection_error = err
            if self._state == _HANDSHAKE and not self._welcome_fut.done():
                self._welcome_fut.set_exception(err)
            elif self._on_error is not None:
                try:
                    self._on_error(err)
                except Exception:
                    log.exception("berth: on_error callback failed")
            else:
                log.warning("berth: connection error from %s: %s", self.address, err)
            return
        f = self._pending.pop(cid, None)
        if f is None:
            return
        if not f.done():
            f.set_exception(err)
        self._release(1)

    def _on_close(self, code: int, reason: str) -> None:
        if self._state == _CLOSING:
            # The answer to our CLOSE.
            self._finish(E.ConnectionClosedError(E.OK, "closed by the client"))
        else:
            self._send_raw(wire.close(E.OK, ""))
            err = self.last_connection_error if code and self.last_connection_error else None
            self._finish(E.ConnectionClosedError(code, reason or (err.text if err else "")))
            if not self._welcome_fut.done():
                self._welcome_fut.set_exception(self._closed_exc)

    def _on_deliver(self, buf, start: int, end: int) -> None:
        if end - start < 4:
            raise wire.MalformedFrame("DELIVER too short")
        cons = self._consumers.get(_U32.unpack_from(buf, start)[0])
        if cons is None:
            wire.decode_deliver(buf, start, end)  # still checked; then dropped
            return
        _, msgs = wire.decode_deliver(buf, start, end, cons._make)
        cons._deliver(msgs)

    def _protocol_error(self, code: int, text: str) -> None:
        log.warning("berth: protocol error from %s: %s", self.address, text)
        self._send_raw(wire.close(code, text[: wire.TEXT_LEN_MAX]))
        err = E.ProtocolError(code, text)
        if not self._welcome_fut.done():
            self._welcome_fut.set_exception(err)
        self._finish(E.ConnectionClosedError(code, f"protocol error: {text}"))

    def _connection_lost(self, exc) -> None:
        if self._state != _CLOSED:
            self._finish(E.ConnectionClosedError(None, f"connection lost: {exc or 'closed by peer'}"))
            if not self._welcome_fut.done():
                self._welcome_fut.set_exception(self._closed_exc)

    def _finish(self, exc: E.ConnectionClosedError) -> None:
        """End the session: fail everything outstanding with ``exc``."""
        if self._state == _CLOSED:
            return
        self._state = _CLOSED
        self._closed_exc = exc
        if self._hb_handle is not None:
            self._hb_handle.cancel()
        if self._transport is not None:
            self._flush()
            self._transport.close()
        pending, self._pending = self._pending, {}
        for cid, f in pending.items():
            if not f.done():
                f.set_exception(E.ClosedOutcomeUnknownError(exc.code, f"session ended before command {cid} was answered: {exc.text}", cid))
                f.exception()  # a fire-and-forget publish is not "never retrieved"
        waiters, self._window_waiters = self._window_waiters, collections.deque()
        for f in waiters:
            if not f.done():
                f.set_exception(exc)
        for c in list(self._consumers.values()):
            c._end(exc)
        self._consumers.clear()
        if self._write_paused is not None and not self._write_paused.done():
            self._write_paused.set_result(None)
        if not self._close_fut.done():
            self._close_fut.set_result(None)
        if not self._welcome_fut.done():
            self._welcome_fut.set_exception(exc)
            self._welcome_fut.exception()

    # ------------------------------------------------------------ heartbeats

    def _heartbeat_tick(self) -> None:
        if self._state in (_CLOSED,):
            return
        hb = self.welcome.heartbeat_ms / 1000
        now = time.monotonic()
        if now - self._last_recv > 3 * hb:
            self._send_raw(wire.close(E.HEARTBEAT_TIMEOUT, "no traffic for 3 heartbeat intervals"))
            self._finish(E.ConnectionClosedError(E.HEARTBEAT_TIMEOUT,
                                                 f"nothing from the server for {now - self._last_recv:.3f} s"))
            return
        # Send at half the interval of silence: timers are late under load.
        if now - self._last_sent >= hb / 2 and not self._out and not self._pub_msgs:
            self._send_raw(wire.heartbeat())
        self._hb_handle = self._loop.call_later(hb / 2, self._heartbeat_tick)

    # ------------------------------------------------------------ writing

    def _send_raw(self, frame: bytes) -> None:
        if self._transport is None or self._transport.is_closing():
            return
        self._out.append(frame)
        self._flush()

    def _queue(self, frame: bytes) -> None:
        self._out.append(frame)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _close_batch(self) -> None:
        if self._pub_msgs:
            self._out.append(wire.publish(self._pub_first, self._pub_ex, self._pub_msgs))
            self._pub_msgs = []
            self._pub_size = 0
            self._pub_ex = None

    def _flush(self) -> None:
        self._flush_scheduled = False
        self._close_batch()
        if self._out:
            data = b"".join(self._out) if len(self._out) > 1 else self._out[0]
            self._out = []
            t = self._transport
            if t is not None and not t.is_closing():
                t.write(data)
                self._last_sent = time.monotonic()

    # ------------------------------------------------------------ commands

    def _check_open(self) -> None:
        if self._state != _OPEN:
            raise self._closed_exc or E.ConnectionClosedError(None, "the session is closing")

    async def _acquire(self) -> None:
        """Take one slot of the window (PROTOCOL.md 2.5), waiting for one."""
        self._check_open()
        if self._inflight < self._window and not self._window_waiters:
            self._inflight += 1
            return
        f = self._loop.create_future()
        self._window_waiters.append(f)
        try:
            await f
        except asyncio.CancelledError:
            if f.done() and not f.cancelled() and f.exception() is None:
                self._release(1)  # the slot was handed to us: give it back
            raise
        self._check_open()

    def _release(self, n: int) -> None:
        self._inflight -= n
        waiters = self._window_waiters
        while waiters and self._inflight < self._window:
            f = waiters.popleft()
            if not f.done():
                self._inflight += 1
                f.set_result(None)

    def _command(self, encode: Callable[[int], bytes]) -> asyncio.Future:
        """Number a command, queue its frame, return its completion future.
        The caller holds a window slot."""
        self._close_batch()  # ids must go out in order
        cid = self._next_id
        self._next_id = cid + 1
        f = self._loop.create_future()
        self._pending[cid] = f
        self._queue(encode(cid))
        return f

    async def _call(self, encode: Callable[[int], bytes]) -> None:
        await self._acquire()
        await self._command(encode)

    @property
    def in_flight(self) -> int:
        """Commands sent and not yet answered."""
        return len(self._pending)

    @property
    def closed(self) -> bool:
        return self._state == _CLOSED

    async def declare_queue(
        self,
        name: str,
        *,
        durable: bool = False,
        exclusive: bool = False,
        auto_delete: bool = False,
        passive: bool = False,
        no_replicate: bool = False,
        max_deliveries: int = 0,
        message_ttl_ms: int = 0,
        max_length: int = 0,
        max_length_bytes: int = 0,
        overflow: Overflow = Overflow.REJECT_PUBLISH,
        dead_letter_exchange: str = "",
        dead_letter_key: str = "",
    ) -> None:
        """DECLARE_QUEUE (4.1); returns once the broker completed it."""
        flags = ((wire.QF_DURABLE if durable else 0) | (wire.QF_EXCLUSIVE if exclusive else 0)
                 | (wire.QF_AUTO_DELETE if auto_delete else 0) | (wire.QF_PASSIVE if passive else 0)
                 | (wire.QF_NO_REPLICATE if no_replicate else 0))
        await self._call(lambda cid: wire.declare_queue(
            cid, name, flags, max_deliveries, message_ttl_ms, max_length, max_length_bytes,
            int(overflow), dead_letter_exchange, dead_letter_key))

    async def declare_exchange(self, name: str, kind: ExchangeKind = ExchangeKind.DIRECT, *,
                               durable: bool = False, auto_delete: bool = False,
                               passive: bool = False) -> None:
        """DECLARE_EXCHANGE (4.2)."""
        flags = ((wire.EF_DURABLE if durable else 0) | (wire.EF_AUTO_DELETE if auto_delete else 0)
                 | (wire.EF_PASSIVE if passive else 0))
        await self._call(lambda cid: wire.declare_exchange(cid, name, int(kind), flags))

    async def bind(self, exchange: str, queue: str, key: str = "") -> None:
        """BIND (4.3)."""
        await self._call(lambda cid: wire.bind(cid, exchange, queue, key))

    async def unbind(self, exchange: str, queue: str, key: str = "") -> None:
        """UNBIND (4.3)."""
        await self._call(lambda cid: wire.bind(cid, exchange, queue, key, unbind=True))

    async def delete_queue(self, name: str, *, if_unused: bool = False, if_empty: bool = False) -> None:
        """DELETE of a queue (4.4)."""
        flags = (wire.DF_IF_UNUSED if if_unused else 0) | (wire.DF_IF_EMPTY if if_empty else 0)
        await self._call(lambda cid: wire.delete(cid, 0, name, flags))

    async def delete_exchange(self, name: str, *, if_unused: bool = False) -> None:
        """DELETE of an exchange (4.4)."""
        await self._call(lambda cid: wire.delete(cid, 1, name, wire.DF_IF_UNUSED if if_unused else 0))

    async def purge(self, queue: str) -> None:
        """PURGE (4.5): drop the queue's ready messages."""
        await self._call(lambda cid: wire.purge(cid, queue))

    # ------------------------------------------------------------ publishing

    async def publish_async(self, exchange: str, routing_key: str, payload: bytes | str, *,
                            props: bytes = b"", persistent: bool = False,
                            ttl_ms: int = 0) -> asyncio.Future:
        """Send one message; return a future that completes when the broker
        completes it (or raises its error).

        Waits only while the window is full or the socket's write buffer is
        over its high-water mark, so many messages can be in flight;
        consecutive messages to one exchange go out in one PUBLISH frame.
        """
        if isinstance(payload, str):
            payload = payload.encode("utf-8")
        ex = exchange.encode("utf-8")
        if len(ex) > wire.NAME_LEN_MAX:
            raise ValueError(f"exchange name is {len(ex)} bytes, at most {wire.NAME_LEN_MAX}")
        msg = wire.publish_message(routing_key.encode("utf-8"), bytes(payload), bytes(props),
                                   persistent, ttl_ms)
        overhead = wire.publish_overhead(ex)
        if overhead + len(msg) > self._frame_max:
            raise E.FrameTooLargeError(
                E.FRAME_TOO_LARGE,
                f"a message of {len(msg)} bytes does not fit the {self._frame_max}-byte frame maximum")
        if self._write_paused is not None:
            await self._write_paused
        await self._acquire()
        if self._pub_msgs and (ex != self._pub_ex or len(self._pub_msgs) == wire.BATCH_MAX
                               or overhead + self._pub_size + len(msg) > self._frame_max):
            self._flush()  # a full frame: write it now, not when the caller yields
        if not self._pub_msgs:
            self._pub_ex = ex
            self._pub_first = self._next_id
        cid = self._next_id
        self._next_id = cid + 1
        self._pub_msgs.append(msg)
        self._pub_size += len(msg)
        f = self._loop.create_future()
        self._pending[cid] = f
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)
        return f

    async def publish(self, exchange: str, routing_key: str, payload: bytes | str, *,
                      props: bytes = b"", persistent: bool = False, ttl_ms: int = 0) -> None:
        """Send one message and wait for its completion (5.1). A persistent
        message on a durable queue completes once it is durable."""
        await (await self.publish_async(exchange, routing_key, payload, props=props,
                                        persistent=persistent, ttl_ms=ttl_ms))

    async def wait_completions(self) -> None:
        """Wait until every command sent so far is answered (errors are left
        on their own futures)."""
        self._flush()
        if self._pending:
            await asyncio.wait(list(self._pending.values()))

    # ------------------------------------------------------------ consuming

    async def subscribe(self, queue: str, *, credit: int = 0, prefetch: int = 0,
                        ack_mode: AckMode = AckMode.EXPLICIT, exclusive: bool = False,
                        buffer: int = 0) -> "Consumer":
        """SUBSCRIBE (6.1). Returns once the broker completed it.

        ``credit``: initial credit, given back only by :meth:`Consumer.add_credit`.
        ``prefetch``: keep up to this many messages outstanding: initial
        credit ``prefetch``, and credit given back as messages are settled
        (explicit acks) or taken from the consumer (ack mode none).
        """
        if credit and prefetch:
            raise ValueError("give credit or prefetch, not both")
        cmax = self.welcome.credit_max
        if max(credit, prefetch) > cmax:
            raise ValueError(f"credit {max(credit, prefetch)} above the server's CreditMax {cmax}")
        await self._acquire()
        cons = Consumer(self, self._next_consumer, queue, ack_mode, prefetch)
        self._next_consumer += 1
        # Register before SUBSCRIBE: deliveries may precede its completion.
        self._consumers[cons.id] = cons
        flags = 1 if exclusive else 0
        try:
            await self._command(lambda cid: wire.subscribe(cid, cons.id, queue, credit or prefetch,
                                                           int(ack_mode), flags))
        except BaseException:
            self._consumers.pop(cons.id, None)
            raise
        return cons

    def _add_credit(self, consumer_id: int, n: int) -> None:
        self._check_open()
        self._close_batch()
        self._queue(wire.credit(consumer_id, n))

    async def _settle(self, ftype: int, consumer_id: int, tags: Iterable[int]) -> None:
        ranges = wire.to_ranges(tags)
        futs = []
        for i in range(0, len(ranges), wire.RANGES_MAX):
            chunk = ranges[i:i + wire.RANGES_MAX]
            await self._acquire()
            futs.append(self._command(lambda cid: wire.settle(ftype, cid, consumer_id, chunk)))
        for f in futs:
            await f

    # ------------------------------------------------------------ closing

    async def close(self, *, timeout: float = 5.0, wait: bool = True) -> None:
        """End the session: wait for outstanding completions (``wait``),
        send CLOSE and wait for the server's CLOSE, at most ``timeout``
        seconds in all; then close the socket."""
        if self._state == _CLOSED:
            return
        deadline = self._loop.time() + timeout
        if wait and self._state == _OPEN:
            try:
                await asyncio.wait_for(self.wait_completions(), max(0.0, deadline - self._loop.time()))
            except asyncio.TimeoutError:
                pass
        if self._state == _OPEN:
            self._state = _CLOSING
            self._send_raw(wire.close(E.OK, "bye"))
            try:
                await asyncio.wait_for(asyncio.shield(self._close_fut), max(0.0, deadline - self._loop.time()))
            except asyncio.TimeoutError:
                pass
        self._finish(E.ConnectionClosedError(E.OK, "closed by the client"))

    async def wait_closed(self) -> E.ConnectionClosedError:
        """Wait until the session ends; return why it ended."""
        await asyncio.shield(self._close_fut)
        return self._closed_exc

    async def __aenter__(self) -> "Connection":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


class Message:
    """A delivered message (6.4)."""

    __slots__ = ("consumer", "tag", "delivery_count", "flags", "exchange", "routing_key",
                 "props", "payload", "_settled")

    def __init__(self, consumer, tag, delivery_count, flags, exchange, routing_key, props, payload):
        self.consumer = consumer
        self.tag = tag
        self.delivery_count = delivery_count
        self.flags = flags
        self.exchange = exchange
        self.routing_key = routing_key
        self.props = props
        self.payload = payload
        self._settled = consumer.ack_mode == AckMode.NONE

    @property
    def redelivered(self) -> bool:
        return bool(self.flags & wire.MF_REDELIVERED)

    @property
    def persistent(self) -> bool:
        return bool(self.flags & wire.MF_PERSISTENT)

    async def accept(self) -> None:
        await self.consumer.accept(self)

    async def release(self) -> None:
        await self.consumer.release(self)

    async def reject(self) -> None:
        await self.consumer.reject(self)

    def __repr__(self) -> str:
        return (f"Message(tag={self.tag}, delivery_count={self.delivery_count}, "
                f"redelivered={self.redelivered}, key={self.routing_key!r}, payload={self.payload[:32]!r})")


_END = object()


class Consumer:
    """A subscription. Iterate it (``async for msg in consumer``) or call
    :meth:`get`; settle with :meth:`accept`, :meth:`release`, :meth:`reject`
    (or the same methods of a :class:`Message`)."""

    def __init__(self, conn: Connection, cid: int, queue: str, ack_mode: AckMode, prefetch: int):
        self.conn = conn
        self.id = cid
        self.queue = queue
        self.ack_mode = AckMode(ack_mode)
        self.prefetch = prefetch
        self._buf: collections.deque = collections.deque()
        self._waiter: asyncio.Future | None = None
        self._ended: BaseException | None = None
        self._done = False
        self._owed = 0  # credit to give back (prefetch mode)
        self.delivered = 0
        self._make = functools.partial(Message, self)


    def _deliver(self, msgs: list[Message]) -> None:
        self.delivered += len(msgs)
        self._buf.extend(msgs)
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _end(self, exc: BaseException | None) -> None:
        if not self._done:
            self._done = True
            self._ended = exc
            self._buf.append(_END)
            w = self._waiter
            if w is not None and not w.done():
                w.set_result(None)

    def _took(self, n: int) -> None:
        if self.prefetch and self.ack_mode == AckMode.NONE:
            self._give_back(n)

    def _give_back(self, n: int) -> None:
        self._owed += n
        if self._owed >= max(1, self.prefetch // 2) and self.id in self.conn._consumers:
            owed, self._owed = self._owed, 0
            self.conn._add_credit(self.id, owed)

    @property
    def pending(self) -> int:
        """Messages received and not yet taken by :meth:`get`."""
        return sum(1 for m in self._buf if m is not _END)

    async def get(self, timeout: float | None = None) -> Message:
        """The next message. Raises :class:`asyncio.TimeoutError` after
        ``timeout`` seconds, :class:`StopAsyncIteration` once the consumer
        was cancelled and drained, and the session's
        :class:`~berth.errors.ConnectionClosedError` once it ended."""
        while not self._buf:
            self._waiter = self.conn._loop.create_future()
            try:
                if timeout is None:
                    await self._waiter
                else:
                    await asyncio.wait_for(self._waiter, timeout)
            finally:
                self._waiter = None
        m = self._buf[0]
        if m is _END:
            if self._ended is not None:
                raise self._ended
            raise StopAsyncIteration
        self._buf.popleft()
        self._took(1)
        return m

    def get_nowait(self, max_count: int = 1 << 30) -> list[Message]:
        """Up to ``max_count`` messages already received, without waiting."""
        out = []
        buf = self._buf
        while buf and len(out) < max_count and buf[0] is not _END:
            out.append(buf.popleft())
        if out:
            self._took(len(out))
        return out

    def __aiter__(self):
        return self

    async def __anext__(self) -> Message:
        return await self.get()

    def add_credit(self, n: int) -> None:
        """CREDIT (6.3): allow ``n`` more deliveries (capped by the server at CreditMax)."""
        if n > 0:
            self.conn._add_credit(self.id, n)

    async def _settle(self, ftype: int, items) -> None:
        tags = []
        fresh = 0  # settled now for the first time, as far as we know
        for m in items:
            if isinstance(m, Message):
                if not m._settled:
                    m._settled = True
                    fresh += 1
                tags.append(m.tag)
            else:
                tags.append(int(m))
                fresh += 1
        if not tags:
            return
        if self.prefetch and self.ack_mode == AckMode.EXPLICIT and fresh:
            self._give_back(fresh)
        await self.conn._settle(ftype, self.id, tags)

    async def accept(self, *messages: Message | int) -> None:
        """ACCEPT (6.5) messages or tags; returns once the dequeue is durable."""
        await self._settle(wire.ACCEPT, messages)

    async def release(self, *messages: Message | int) -> None:
        """RELEASE: back to the queue at their old place, redelivered later."""
        await self._settle(wire.RELEASE, messages)

    async def reject(self, *messages: Message | int) -> None:
        """REJECT: to the dead-letter exchange, or dropped."""
        await self._settle(wire.REJECT, messages)

    async def cancel(self) -> None:
        """CANCEL (6.2). Messages already received stay readable and
        settleable; iteration ends once they are taken."""
        try:
            await self.conn._call(lambda cid: wire.cancel(cid, self.id))
        except E.NotFoundError:
            # The server has no such consumer (its queue was deleted: 4.4).
            self.conn._consumers.pop(self.id, None)
            self._end(None)
            raise
        self.conn._consumers.pop(self.id, None)
        self._end(None)
