"""Error codes and what they say of a command, against docs/PROTOCOL.md 1.4."""

import re
from pathlib import Path

import berth
from berth import errors as E
from berth import wire

PROTOCOL = Path(__file__).resolve().parents[3] / "docs" / "PROTOCOL.md"


def h(s: str) -> bytes:
    return bytes.fromhex(" ".join(s.split()))


def doc_error_table() -> dict[int, tuple[str, str]]:
    doc = PROTOCOL.read_text()
    section = doc[doc.index("### 1.4 Error codes"):doc.index("## 2. Session")]
    rows = {}
    for line in section.splitlines():
        m = re.match(r"^\|\s*(\d+)\s*\|\s*([a-z-]+)\s*\|\s*([^|]*?)\s*\|", line)
        if m:
            rows[int(m[1])] = (m[2], m[3])
    return rows


def test_codes_match_protocol_doc():
    rows = doc_error_table()
    assert sorted(rows) == sorted(E.CODE_NAMES), "one row per code this client knows"
    for code, (name, carried) in rows.items():
        assert E.code_name(code) == name
        assert E.carried_out(code) == {"—": None}.get(carried, carried), name


def test_error_classes_by_outcome():
    for code in (E.OUTCOME_UNKNOWN, E.STORE, E.INTERNAL, 99):
        err = E.error_for(code, "why", 7)
        assert isinstance(err, berth.OutcomeUnknownError), code
        assert (err.code, err.text, err.command_id) == (code, "why", 7)
        assert not isinstance(err, berth.ConnectionClosedError)
    assert type(E.error_for(E.OUTCOME_UNKNOWN, "x", 1)) is berth.OutcomeUnknownError
    for code in (E.UNAVAILABLE, E.NOT_FOUND, E.RESOURCE_LIMIT, E.SHUTDOWN, E.AUTH_FAILED):
        err = E.error_for(code, "x", 1)
        assert not isinstance(err, berth.OutcomeUnknownError), code
    assert isinstance(E.error_for(E.UNAVAILABLE, "x", 1), berth.UnavailableError)
    closed = berth.ClosedOutcomeUnknownError(None, "session ended", 3)
    assert isinstance(closed, berth.OutcomeUnknownError) and isinstance(closed, berth.ConnectionClosedError)


def test_outcome_unknown_error_example():
    frame = h("""b3 27 01 04 06 00 00 00 00 00 00 17  00 00 00 00 00 00 00 08  00 10
        00 0b 6d 61 73 74 65 72 20 6c 6f 73 74""")
    hd = wire.decode_header(frame)
    assert (hd.minor, hd.type, hd.length) == (4, wire.ERROR, len(frame) - 12)
    cid, code, text = wire.decode_error(frame, 12)
    assert (cid, code, text) == (8, E.OUTCOME_UNKNOWN, "master lost")
    assert isinstance(E.error_for(code, text, cid), berth.OutcomeUnknownError)
