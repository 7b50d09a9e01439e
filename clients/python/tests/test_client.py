"""The client against a real berthd."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest
from conftest import run

import berth
from berth import AckMode, ExchangeKind, errors

_names = itertools.count()


def qname(prefix: str) -> str:
    return f"py-{prefix}-{next(_names)}-{time.monotonic_ns() % 1_000_000}"


async def nothing_arrives(cons: berth.Consumer, wait: float = 0.3) -> None:
    with pytest.raises(asyncio.TimeoutError):
        m = await cons.get(wait)
        pytest.fail(f"unexpected delivery {m!r}")


def test_round_trip(berthd):
    async def t():
        async with await berth.connect(berthd.addr, client_name="py-test") as c:
            assert c.welcome.version == 0x0100
            assert berthd.addr in c.welcome.addrs
            q = qname("rt")
            await c.declare_queue(q)
            await c.publish("", q, b"hello", props=b"\x01\x02")
            cons = await c.subscribe(q, credit=10)
            m = await cons.get(5)
            assert (m.payload, m.props, m.routing_key, m.exchange) == (b"hello", b"\x01\x02", q, "")
            assert (m.tag, m.delivery_count, m.redelivered, m.persistent) == (1, 0, False, False)
            await m.accept()
            await cons.cancel()
            # Accepted for good: a new consumer gets nothing.
            cons2 = await c.subscribe(q, credit=10)
            await nothing_arrives(cons2)
            # Iterating a cancelled consumer ends.
            await cons2.cancel()
            assert [m async for m in cons2] == []
    run(t())


def test_topic_exchange_routing(berthd):
    async def t():
        async with await berth.connect(berthd.addr) as c:
            ex, q = qname("logs"), qname("errors")
            await c.declare_exchange(ex, ExchangeKind.TOPIC)
            await c.declare_queue(q)
            await c.bind(ex, q, "*.error")
            await c.bind(ex, q, "audit.#")
            futs = [await c.publish_async(ex, k, k) for k in
                    ("db.error", "db.info", "audit", "audit.x.y", "a.b.error")]
            await asyncio.gather(*futs)  # unrouted messages complete too
            cons = await c.subscribe(q, credit=10, ack_mode=AckMode.NONE)
            got = [(await cons.get(5)).payload for _ in range(3)]
            assert got == [b"db.error", b"audit", b"audit.x.y"]
            await nothing_arrives(cons)
            await c.unbind(ex, q, "*.error")
            with pytest.raises(errors.NotFoundError):
                await c.unbind(ex, q, "*.error")
    run(t())


def test_persistent_publish_survives_restart(own_berthd):
    async def before():
        c = await berth.connect(own_berthd.addr)
        q = qname("durable")
        await c.declare_queue(q, durable=True)
        await asyncio.gather(*[await c.publish_async("", q, f"p{i}", persistent=True) for i in range(100)])
        await c.publish("", q, b"transient")  # not persistent: does not survive
        closed = asyncio.ensure_future(c.wait_closed())
        return c, q, closed

    async def after(q):
        async with await berth.connect(own_berthd.addr) as c:
            await c.declare_queue(q, durable=True)  # same options: completes
            cons = await c.subscribe(q, credit=1000)
            got = [(await cons.get(5)) for _ in range(100)]
            assert [m.payload for m in got] == [f"p{i}".encode() for i in range(100)]
            assert all(m.persistent for m in got)
            await nothing_arrives(cons)
            await cons.accept(*got)

    async def both():
        c, q, closed = await before()
        # A graceful stop ends the session with CLOSE(shutdown).
        await asyncio.get_running_loop().run_in_executor(None, own_berthd.restart)
        why = await asyncio.wait_for(closed, 5)
        assert why.code == errors.SHUTDOWN, why
        with pytest.raises(berth.ConnectionClosedError):
            await c.publish("", q, b"after")
        await after(q)
    run(both())


def test_credit_limits_deliveries(berthd):
    async def t():
        async with await berth.connect(berthd.addr) as c:
            q = qname("credit")
            await c.declare_queue(q)
            await asyncio.gather(*[await c.publish_async("", q, str(i)) for i in range(10)])
            cons = await c.subscribe(q, credit=3)
            await asyncio.sleep(0.3)
            assert cons.delivered == 3
            got = cons.get_nowait()
            assert [m.payload for m in got] == [b"0", b"1", b"2"]
            await cons.accept(*got)  # settling gives no credit back
            await asyncio.sleep(0.3)
            assert cons.delivered == 3
            cons.add_credit(2)
            got += [await cons.get(5), await cons.get(5)]
            await asyncio.sleep(0.3)
            assert cons.delivered == 5
            assert [m.payload for m in got] == [b"0", b"1", b"2", b"3", b"4"]
    run(t())


def test_prefetch_keeps_at_most_n_unsettled(berthd):
    async def t():
        async with await berth.connect(berthd.addr) as c:
            q = qname("prefetch")
            await c.declare_queue(q)
            await asyncio.gather(*[await c.publish_async("", q, str(i)) for i in range(50)])
            cons = await c.subscribe(q, prefetch=4)
            seen = []
            while len(seen) < 50:
                m = await cons.get(5)
                seen.append(int(m.payload))
                # received but unsettled never exceeds the prefetch
                assert cons.delivered - (len(seen) - 1) <= 4
                await m.accept()
            assert seen == list(range(50))
    run(t())


def test_release_redelivers(berthd):
    async def t():
        async with await berth.connect(berthd.addr) as c:
            q = qname("release")
            await c.declare_queue(q)
            await c.publish("", q, b"a")
            await c.publish("", q, b"b")
            cons = await c.subscribe(q, credit=1)
            m1 = await cons.get(5)
            assert (m1.payload, m1.tag, m1.delivery_count, m1.redelivered) == (b"a", 1, 0, False)
            await m1.release()
            cons.add_credit(1)  # the released delivery's credit is spent
            m2 = await cons.get(5)
            # Back at its old place, ahead of "b", with a new tag.
            assert (m2.payload, m2.tag, m2.delivery_count, m2.redelivered) == (b"a", 2, 1, True)

            # A session that ends with messages unsettled requeues them.
            async with await berth.connect(berthd.addr) as other:
                oc = await other.subscribe(q, credit=1)
                mb = await oc.get(5)
                assert (mb.payload, mb.redelivered) == (b"b", False)
            await m2.accept()
            cons.add_credit(1)
            m3 = await cons.get(5)
            assert (m3.payload, m3.delivery_count, m3.redelivered) == (b"b", 1, True)
            await m3.accept()
    run(t())


def test_max_deliveries_dead_letters(berthd):
    async def t():
        async with await berth.connect(berthd.addr) as c:
            q, dlx, dlq = qname("maxdel"), qname("dlx"), qname("dlq")
            await c.declare_exchange(dlx, ExchangeKind.FANOUT)
            await c.declare_queue(dlq)
            await c.bind(dlx, dlq)
            await c.declare_queue(q, max_deliveries=2, dead_letter_exchange=dlx)
            await c.publish("", q, b"poison")
            cons = await c.subscribe(q, credit=10)
            for count in (0, 1):
                m = await cons.get(5)
                assert m.delivery_count == count
                await m.release()
            await nothing_arrives(cons)  # delivered twice: dead-lettered, not redelivered
            dead = await (await c.subscribe(dlq, credit=10)).get(5)
            assert dead.payload == b"poison"
    run(t())


def test_reject(berthd):
    async def t():
        async with await berth.connect(berthd.addr) as c:
            q, dlx, dlq, plain = qname("rej"), qname("rdlx"), qname("rdlq"), qname("rplain")
            await c.declare_exchange(dlx, ExchangeKind.DIRECT)
            await c.declare_queue(dlq)
            await c.bind(dlx, dlq, "rejected")
            await c.declare_queue(q, dead_letter_exchange=dlx, dead_letter_key="rejected")
            await c.declare_queue(plain)
            await c.publish("", q, b"bad")
            await c.publish("", plain, b"gone")
            cons = await c.subscribe(q, credit=10)
            await (await cons.get(5)).reject()
            dead = await (await c.subscribe(dlq, credit=10)).get(5)
            assert (dead.payload, dead.routing_key) == (b"bad", "rejected")
            await nothing_arrives(cons)
            # Without a dead-letter exchange a rejected message is dropped.
            pc = await c.subscribe(plain, credit=10)
            await (await pc.get(5)).reject()
            await pc.cancel()
            pc2 = await c.subscribe(plain, credit=10)
            await nothing_arrives(pc2)
    run(t())


def test_errors_carry_wire_codes(berthd):
    async def t():
        async with await berth.connect(berthd.addr) as c:
            q = qname("err")
            await c.declare_queue(q, max_length=10)
            with pytest.raises(errors.PreconditionFailedError) as ei:
                await c.declare_queue(q, max_length=11)
            assert ei.value.code == 5 and ei.value.code_name == "precondition-failed"
            assert ei.value.command_id > 0
            with pytest.raises(errors.NotFoundError) as ei:
                await c.publish(qname("no-such-exchange"), "k", b"x")
            assert ei.value.code == 4
            with pytest.raises(errors.NotFoundError):
                await c.publish("", qname("no-such-queue"), b"x")
            with pytest.raises(errors.NotFoundError):
                await c.declare_queue(qname("missing"), passive=True)
            with pytest.raises(errors.InvalidError) as ei:
                await c.declare_exchange(qname("ex"), 7)
            assert ei.value.code == 9
            with pytest.raises(errors.NotAllowedError) as ei:
                await c.declare_exchange("", ExchangeKind.DIRECT)
            assert ei.value.code == 7
            await c.publish("", q, b"x")
            with pytest.raises(errors.PreconditionFailedError):
                await c.delete_queue(q, if_empty=True)
            # The session survives command errors.
            await c.purge(q)
            await c.delete_queue(q, if_empty=True)
            with pytest.raises(errors.NotFoundError):
                await c.purge(q)
            # Another session's exclusive queue.
            ex = qname("excl")
            await c.declare_queue(ex, exclusive=True)
            async with await berth.connect(berthd.addr) as other:
                with pytest.raises(errors.NotAllowedError):
                    await other.subscribe(ex, credit=1)
    run(t())


def test_reject_publish_overflow(berthd):
    async def t():
        async with await berth.connect(berthd.addr) as c:
            q = qname("full")
            await c.declare_queue(q, max_length=3)
            results = await asyncio.gather(*[await c.publish_async("", q, str(i)) for i in range(5)],
                                           return_exceptions=True)
            assert results[:3] == [None, None, None]
            assert all(isinstance(r, errors.ResourceLimitError) and r.code == 6 for r in results[3:])
    run(t())


def test_pipelined_publish_10000(berthd):
    n = 10_000

    async def t():
        async with await berth.connect(berthd.addr) as c:
            q = qname("pipe")
            await c.declare_queue(q)
            futs = [await c.publish_async("", q, i.to_bytes(4, "big")) for i in range(n)]
            assert c.in_flight > 0  # they really were in flight together
            await asyncio.gather(*futs)
            assert c.in_flight == 0
            cons = await c.subscribe(q, prefetch=2000, ack_mode=AckMode.NONE)
            got = []
            while len(got) < n:
                got += cons.get_nowait() or [await cons.get(10)]
            assert [int.from_bytes(m.payload, "big") for m in got] == list(range(n))
    run(t(), timeout=60)


def test_client_bounds_itself_to_the_window(berthd):
    async def t():
        async with await berth.connect(berthd.addr) as c:
            q = qname("window")
            await c.declare_queue(q)
            c._window = 8  # pretend WELCOME granted a window of 8
            peak = 0
            futs = []
            for i in range(200):
                futs.append(await c.publish_async("", q, b"w"))
                peak = max(peak, c.in_flight)
            await asyncio.gather(*futs)
            assert peak <= 8
    run(t())


def test_message_too_large_is_refused_before_sending(berthd):
    async def t():
        async with await berth.connect(berthd.addr, frame_size_max=4096) as c:
            assert c.welcome.frame_size_max == 4096
            q = qname("big")
            await c.declare_queue(q)
            with pytest.raises(errors.FrameTooLargeError) as ei:
                await c.publish("", q, b"x" * 5000)
            assert ei.value.code == 3
            # A 10 kB message published by a session with the default maximum
            # still reaches this one, in a DELIVER above its 4096 bytes.
            async with await berth.connect(berthd.addr) as big:
                await big.publish("", q, b"y" * 10_000)
            m = await (await c.subscribe(q, credit=1)).get(5)
            assert m.payload == b"y" * 10_000
    run(t())


def test_heartbeats_keep_an_idle_session(berthd):
    async def t():
        # 200 ms: a stall of 600 ms on either side ends the session, and a
        # shared, loaded machine stalls 150 ms now and then.
        async with await berth.connect(berthd.addr, heartbeat_ms=200) as c:
            assert c.welcome.heartbeat_ms == 200
            await asyncio.sleep(2.0)  # 10 intervals of silence from the application
            assert not c.closed, c._closed_exc
            await c.declare_queue(qname("hb"))
    run(t())


def test_server_closes_a_silent_client(berthd):
    async def t():
        c = await berth.connect(berthd.addr, heartbeat_ms=50)
        c._hb_handle.cancel()  # stop sending (and checking) heartbeats
        why = await asyncio.wait_for(c.wait_closed(), 3)
        assert why.code == errors.HEARTBEAT_TIMEOUT
    run(t())


def test_client_detects_a_silent_server(own_berthd):
    async def t():
        c = await berth.connect(own_berthd.addr, heartbeat_ms=200)
        q = qname("frozen")
        await c.declare_queue(q)
        own_berthd.pause()
        try:
            start = time.monotonic()
            pub = await c.publish_async("", q, b"lost?")
            with pytest.raises(berth.OutcomeUnknownError) as ei:
                await asyncio.wait_for(pub, 5)
            took = time.monotonic() - start
            assert ei.value.code == errors.HEARTBEAT_TIMEOUT
            assert 0.5 < took < 3.0, took  # 3 x 200 ms, plus timer slack
            assert c.closed
        finally:
            own_berthd.resume()
    run(t())


def test_connect_tries_addresses_in_turn(berthd):
    async def t():
        dead = "127.0.0.1:1"
        c = await berth.connect([dead, berthd.addr], connect_timeout=2)
        assert c.address == berthd.addr
        await c.close()
        with pytest.raises(berth.ConnectError) as ei:
            await berth.connect(f"{dead},127.0.0.1:2", connect_timeout=2)
        assert [a for a, _ in ei.value.errors] == [dead, "127.0.0.1:2"]
    run(t())


def test_close_waits_for_completions(berthd):
    async def t():
        c = await berth.connect(berthd.addr)
        q = qname("closewait")
        await c.declare_queue(q, durable=True)
        futs = [await c.publish_async("", q, b"p", persistent=True) for _ in range(500)]
        await c.close()
        assert all(f.done() and f.exception() is None for f in futs)
        with pytest.raises(berth.ConnectionClosedError):
            await c.declare_queue(q)
        async with await berth.connect(berthd.addr) as c2:
            await c2.delete_queue(q)
    run(t())


def test_deleting_a_queue_drops_its_consumers_silently(berthd):
    async def t():
        async with await berth.connect(berthd.addr) as c:
            q = qname("gone")
            await c.declare_queue(q)
            await c.publish("", q, b"held")
            cons = await c.subscribe(q, credit=10)
            m = await cons.get(5)
            await c.delete_queue(q)
            assert not c.closed  # no frame about it; the session goes on
            with pytest.raises(errors.NotFoundError):
                await m.accept()
            with pytest.raises(errors.NotFoundError):
                await cons.cancel()
    run(t())
