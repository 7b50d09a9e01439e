"""The codecs against the byte-exact examples of docs/PROTOCOL.md."""

import pytest

from berth import wire


def h(s: str) -> bytes:
    return bytes.fromhex(" ".join(s.split()))


def test_heartbeat_example():
    assert wire.heartbeat() == h("b3 27 01 00 03 00 00 00 00 00 00 00")


def test_hello_example():
    assert wire.hello("app") == h("""
        b3 27 01 00 01 00 00 00 00 00 00 1a  01  01 00  00 03 61 70 70
        00 04 6e 6f 6e 65  00 00 00 00  00 00 00 00  00 00 00 00""")


def test_welcome_example():
    frame = h("""
        b3 27 01 00 02 00 00 00 00 00 00 2c  01 00  00 10 00 00  00 00 13 88
        00 01 00 00  00 01 00 00  00 06 62 65 72 74 68 64  00 01
        00 0e 31 32 37 2e 30 2e 30 2e 31 3a 37 34 30 30""")
    hd = wire.decode_header(frame)
    assert (hd.type, hd.length) == (wire.WELCOME, len(frame) - 12)
    w = wire.decode_welcome(frame, 12)
    assert w == wire.Welcome(0x0100, 1 << 20, 5000, 65536, 65536, "berthd", ["127.0.0.1:7400"])


def test_close_example():
    assert wire.close(0, "bye") == h("b3 27 01 00 04 00 00 00 00 00 00 07 00 00 00 03 62 79 65")
    assert wire.decode_close(wire.close(0, "bye"), 12) == (0, "bye")


def test_complete_example():
    frame = h("""b3 27 01 00 05 00 00 00 00 00 00 22  00 02
        00 00 00 00 00 00 00 01  00 00 00 00 00 00 00 03
        00 00 00 00 00 00 00 05  00 00 00 00 00 00 00 05""")
    assert wire.decode_complete(frame, 12) == [(1, 3), (5, 5)]


def test_error_example():
    frame = h("""b3 27 01 00 06 00 00 00 00 00 00 16  00 00 00 00 00 00 00 07  00 04
        00 0a 6e 6f 20 71 75 65 75 65 20 71""")
    assert wire.decode_error(frame, 12) == (7, 4, "no queue q")


def test_declare_queue_example():
    assert wire.declare_queue(1, "orders", wire.QF_DURABLE, max_deliveries=5, message_ttl_ms=60000,
                              max_length=1000, overflow=1, dead_letter_exchange="dlx") == h("""
        b3 27 01 00 10 00 00 00 00 00 00 36  00 00 00 00 00 00 00 01
        00 06 6f 72 64 65 72 73  00 01  00 00 00 05  00 00 00 00 00 00 ea 60
        00 00 00 00 00 00 03 e8  00 00 00 00 00 00 00 00  01  00 03 64 6c 78  00 00""")


def test_declare_exchange_example():
    assert wire.declare_exchange(2, "logs", 2) == h("""
        b3 27 01 00 11 00 00 00 00 00 00 11  00 00 00 00 00 00 00 02
        00 04 6c 6f 67 73  02  00 00""")


def test_bind_example():
    assert wire.bind(3, "logs", "orders", "*.error") == h("""
        b3 27 01 00 12 00 00 00 00 00 00 1f  00 00 00 00 00 00 00 03
        00 04 6c 6f 67 73  00 06 6f 72 64 65 72 73  00 07 2a 2e 65 72 72 6f 72""")


def test_delete_example():
    assert wire.delete(4, 0, "orders", wire.DF_IF_EMPTY) == h("""
        b3 27 01 00 14 00 00 00 00 00 00 13  00 00 00 00 00 00 00 04  00  00 02
        00 06 6f 72 64 65 72 73""")


def test_purge_example():
    assert wire.purge(5, "orders") == h("""
        b3 27 01 00 15 00 00 00 00 00 00 10  00 00 00 00 00 00 00 05  00 06 6f 72 64 65 72 73""")


def test_publish_example():
    msgs = [wire.publish_message(b"q", b"hi"),
            wire.publish_message(b"q", b"yo", b"\xaa", persistent=True, ttl_ms=1000)]
    assert wire.publish(10, b"", msgs) == h("""
        b3 27 01 00 20 00 00 00 00 00 00 39  00 00 00 00 00 00 00 0a  00 00  00 02
        00  00 00 00 00 00 00 00 00  00 01 71  00 00 00 00  00 00 00 02 68 69
        01  00 00 00 00 00 00 03 e8  00 01 71  00 00 00 01 aa  00 00 00 02 79 6f""")


def test_subscribe_cancel_credit_examples():
    assert wire.subscribe(12, 1, "q", 100) == h("""
        b3 27 01 00 21 00 00 00 00 00 00 15  00 00 00 00 00 00 00 0c  00 00 00 01
        00 01 71  00 00 00 64  00  00""")
    assert wire.cancel(13, 1) == h(
        "b3 27 01 00 22 00 00 00 00 00 00 0c  00 00 00 00 00 00 00 0d  00 00 00 01")
    assert wire.credit(1, 50) == h(
        "b3 27 01 00 23 00 00 00 00 00 00 08  00 00 00 01  00 00 00 32")


def test_deliver_example():
    frame = h("""b3 27 01 00 24 00 00 00 00 00 00 22  00 00 00 01  00 01
        00 00 00 00 00 00 00 01  00 00 00 00  00  00 00  00 01 71  00 00 00 00
        00 00 00 02 68 69""")
    cid, msgs = wire.decode_deliver(frame, 12)
    assert cid == 1
    assert msgs == [wire.Delivery(1, 0, 0, "", "q", b"", b"hi")]


def test_accept_example():
    assert wire.settle(wire.ACCEPT, 14, 1, [(1, 4)]) == h("""
        b3 27 01 00 25 00 00 00 00 00 00 1e  00 00 00 00 00 00 00 0e  00 00 00 01
        00 01  00 00 00 00 00 00 00 01  00 00 00 00 00 00 00 04""")


def test_to_ranges():
    assert wire.to_ranges([5, 1, 2, 3, 3, 9, 10]) == [(1, 3), (5, 5), (9, 10)]


def test_decoders_refuse_bad_bodies():
    good = wire.close(0, "bye")[12:]
    with pytest.raises(wire.MalformedFrame):
        wire.decode_close(good + b"\x00")  # bytes left over
    with pytest.raises(wire.MalformedFrame):
        wire.decode_close(good[:-1])  # runs past the end
    with pytest.raises(wire.MalformedFrame):
        wire.decode_complete(b"\x00\x01" + (5).to_bytes(8, "big") + (4).to_bytes(8, "big"))  # first > last
    with pytest.raises(wire.MalformedFrame):
        wire.decode_header(b"\xb3\x28" + bytes(10))  # bad magic
    with pytest.raises(ValueError):
        wire.publish_message(b"k" * 1025, b"")


def test_deliver_decoder_refuses_bad_bodies():
    body = h("""00 00 00 01  00 01  00 00 00 00 00 00 00 01  00 00 00 00  00  00 00  00 01 71
        00 00 00 00  00 00 00 02 68 69""")
    assert wire.decode_deliver(body)[1][0].payload == b"hi"
    for bad in (body[:-1], body + b"\x00", body[:4] + b"\x00\x00" + body[6:],
                body.replace(b"\x00\x01\x71", b"\x00\x09\x71")):
        with pytest.raises(wire.MalformedFrame):
            wire.decode_deliver(bad)
    with pytest.raises(wire.MalformedFrame):
        wire.decode_deliver(body.replace(b"\x00\x01\x71", b"\x00\x01\xff"))  # not UTF-8
