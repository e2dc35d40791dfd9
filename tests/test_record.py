"""The line format: one table of (bytes, expected) cases, plus a scan of a log
fed whole, a byte at a time, torn and flipped."""
from __future__ import annotations

import json

import pytest

from sessionlog_store.eventstore.events import MessageCreated, MessageProgress, SessionCreated, SessionRenamed
from sessionlog_store.eventstore.record import scan
from sessionlog_store.eventstore.record import MAX_RECORD_BYTES, RecordError, decode_record, encode_record
from sessionlog_store.eventstore.errors import RecordTooLarge

EVENTS = [SessionCreated(session_id="s1", title="t"), MessageCreated(msg_id="m", content="hé\n\"x\""),
          MessageProgress(msg_id="m", content_delta="\u2028\x00", offset=3), SessionRenamed(title="")]


@pytest.mark.parametrize("event", EVENTS)
def test_record_roundtrips_and_is_valid_json(event):
    line = encode_record(7, 1764425600.25, event)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    obj = json.loads(line)
    assert obj["seq"] == 7 and obj["ts"] == 1764425600.25 and "crc" in obj and "type" in obj
    rec = decode_record(line)
    assert (rec.seq, rec.ts, rec.event) == (7, 1764425600.25, event)


GOOD = encode_record(1, 1.5, SessionRenamed(title="abc"))


@pytest.mark.parametrize("line,why", [
    (b"", "no checksum header"),
    (b"{}", "no checksum header"),
    (GOOD.replace(b"abc", b"abd"), "checksum mismatch"),
    (GOOD[:-5] + b"\n", "checksum mismatch"),
    (b'{"crc":"zzzzzzzz",' + GOOD[18:], "checksum is not hex"),
    (b"\x00" * 40, "no checksum header"),
])
def test_bad_lines_are_refused_with_a_reason(line, why):
    with pytest.raises(RecordError, match=why):
        decode_record(line)


def test_unknown_event_type_is_refused_not_guessed():
    import zlib
    rest = b'"seq":1,"ts":1.0,"type":"from_the_future","x":1}'
    line = b'{"crc":"%08x",%s' % (zlib.crc32(rest), rest)
    with pytest.raises(RecordError, match="invalid record"):
        decode_record(line)


def test_oversized_record_is_refused():
    with pytest.raises(RecordTooLarge):
        encode_record(1, 1.0, SessionRenamed(title="x" * MAX_RECORD_BYTES))


LOG = b"".join(encode_record(i, float(i), SessionRenamed(title=f"t{i}")) for i in range(1, 6))


def test_scan_whole_log():
    s = scan("s", LOG, expect_seq=1)
    assert [r.seq for r in s.records] == [1, 2, 3, 4, 5]
    assert s.good_end == len(LOG) and s.torn_bytes == 0 and s.corrupt is None


def test_scan_a_byte_at_a_time_sees_only_whole_lines():
    ends = [i + 1 for i, b in enumerate(LOG) if b == ord("\n")]
    for n in range(len(LOG) + 1):
        s = scan("s", LOG[:n], expect_seq=1)
        whole = sum(1 for e in ends if e <= n)
        assert len(s.records) == whole
        assert s.good_end == (ends[whole - 1] if whole else 0)
        assert s.torn_bytes == n - s.good_end
        assert s.corrupt is None


@pytest.mark.parametrize("tail", [b'{"crc":"1234', b"\x00" * 100, GOOD[:-1], b"garbage\n", b"\n\n"])
def test_scan_trailing_damage_is_a_torn_tail(tail):
    s = scan("s", LOG + tail, expect_seq=1)
    assert len(s.records) == 5 and s.corrupt is None
    assert s.good_end == len(LOG) and s.torn_bytes == len(tail)


def test_scan_flipped_byte_in_the_middle_is_corruption():
    i = LOG.index(b"t3")
    bad = LOG[:i] + b"T" + LOG[i + 1:]
    s = scan("s", bad, expect_seq=1)
    assert s.corrupt is not None and s.corrupt.line_no == 3
    assert [r.seq for r in s.records] == [1, 2]


def test_scan_seq_gap_is_corruption():
    gap = encode_record(1, 1.0, SessionRenamed(title="a")) + encode_record(3, 1.0, SessionRenamed(title="b"))
    s = scan("s", gap, expect_seq=1)
    assert s.corrupt is not None and "seq 3 where 2" in s.corrupt.reason
    # without expect_seq: consecutive from the first, on the fast path as on the line-by-line one
    s = scan("s", gap + encode_record(4, 1.0, SessionRenamed(title="c")))
    assert s.corrupt is not None and "seq 3 where 2" in s.corrupt.reason


def test_meta_only_decoding_checks_progress_records_without_reading_them():
    from sessionlog_store.eventstore.record import PROGRESS_STANDIN, decode_record_for_meta
    prog = encode_record(4, 2.5, MessageProgress(msg_id="m", content_delta='"type":"session_renamed"', offset=1))
    rec = decode_record_for_meta(prog)
    assert (rec.seq, rec.ts, rec.event) == (4, 2.5, PROGRESS_STANDIN)
    other = encode_record(5, 3.0, SessionRenamed(title='"type":"message_progress"'))
    assert decode_record_for_meta(other).event == SessionRenamed(title='"type":"message_progress"')
    i = prog.index(b'"o":')
    with pytest.raises(RecordError, match="checksum mismatch"):
        decode_record_for_meta(prog[:i] + b"O" + prog[i + 1:])
    s = scan("s", LOG + prog.replace(b'"seq":4', b'"seq":6'), expect_seq=1, meta_only=True)
    assert s.corrupt is None and s.torn_bytes  # a changed seq breaks the checksum: a torn tail here


def test_progress_records_are_written_short_and_old_long_ones_still_read():
    """Issue 12 item 5: the progress record's on-disk names are short; logs
    written before (`message_progress` with long names) read the same."""
    import zlib

    from sessionlog_store.eventstore.events import MessageProgress
    ev = MessageProgress(msg_id="m1", content_delta="ab", offset=4, partial_tokens_used={"input": 1, "output": 2})
    line = encode_record(3, 1.5, ev)
    # (issue 29: with its token counts a pair, `q`; issue 12's `p` with the object still read)
    assert b'"type":"q","m":"m1","d":"ab","o":4,"u":[1,2]}' in line
    p_rest = b'"seq":3,"ts":1.5,"type":"p","m":"m1","d":"ab","o":4,"u":{"input":1,"output":2}}'
    p_line = b'{"crc":"%08x",%s\n' % (zlib.crc32(p_rest), p_rest)
    assert decode_record(p_line).event == ev and type(decode_record(line).event) is MessageProgress
    odd = MessageProgress(msg_id="m1", offset=4, partial_tokens_used={"output": 2})  # (not exactly the two counts)
    assert b'"type":"p"' in encode_record(4, 1.5, odd) and decode_record(encode_record(4, 1.5, odd)).event == odd
    assert b'"type":"p"' in encode_record(4, 1.5, MessageProgress(msg_id="m1", content_delta="x"))
    from sessionlog_store.eventstore.record import PROGRESS_STANDIN, decode_lines, decode_record_for_meta
    assert [r.event for r in decode_lines([line[:-1], p_line[:-1]])] == [ev, ev]
    assert [r.event for r in decode_lines([line[:-1], p_line[:-1]], meta_only=True)] == [PROGRESS_STANDIN] * 2
    rest = b'"seq":3,"ts":1.5,"type":"message_progress","msg_id":"m1","content_delta":"ab","offset":4,' \
           b'"partial_tokens_used":{"input":1,"output":2}}'
    old = b'{"crc":"%08x",%s\n' % (zlib.crc32(rest), rest)
    assert decode_record(old).event == decode_record(line).event == ev
    assert type(decode_record(old).event) is MessageProgress
    assert decode_record_for_meta(old).event == decode_record_for_meta(line).event == PROGRESS_STANDIN


def test_the_one_pass_decoder_agrees_with_the_line_by_line_one():
    """scan decodes a good log without a Python loop a line; any line it cannot vouch
    for sends it back to the line-by-line path, which reports it."""
    from sessionlog_store.eventstore.record import decode_lines
    good = [encode_record(i, 1.0 + i, ev) for i, ev in enumerate(
        [SessionCreated(session_id="s"), MessageProgress(msg_id="m", content_delta="a,b}{", offset=0),
         SessionRenamed(title='x"},{"crc":"')], 1)]
    lines = [g[:-1] for g in good]
    assert decode_lines(lines) == [decode_record(g) for g in good]
    assert scan("s", b"".join(good), expect_seq=1).records == [decode_record(g) for g in good]
    # two records on one line (crc good over both), a line without its brace: not vouched for
    joined = lines[1][:-1] + b',"x":' + lines[2][:-1] + b"}"
    assert decode_lines([lines[0], joined]) is None
    assert decode_lines([lines[0], lines[1][:-1]]) is None
    bad = bytearray(b"".join(good))
    bad[len(good[0]) + 30] ^= 1
    s = scan("s", bytes(bad), expect_seq=1)
    assert s.corrupt is not None and s.corrupt.line_no == 2


def test_the_one_pass_decoder_never_reads_objects_across_lines():
    """Review finding: lines with good checksums whose JSON objects span or
    share lines (once decoded as one array); the fast path must hand them back."""
    import zlib

    from sessionlog_store.eventstore.record import decode_lines

    def line(rest: bytes) -> bytes:
        return b'{"crc":"%08x",%s' % (zlib.crc32(rest), rest)
    l1 = line(b'"seq":1,"ts":1.0,"type":"session_created","session_id":"s","created_at":1.0},'
              b'{"seq":2,"ts":1.0,"type":"session_renamed","title":"a"}')
    l2 = line(b'"seq":3,"ts":1.0,"type":"session_renamed","title":"b","x":[{}')
    l3 = line(b'"z":0}]}')
    assert decode_lines([l1, l2, l3]) is None
    data = l1 + b"\n" + l2 + b"\n" + l3 + b"\n"
    assert scan("s", data, expect_seq=1).records == []  # what the line-by-line path makes of it


def test_scan_meta_agrees_with_scan_and_keeps_no_progress_record(monkeypatch):
    """scan_meta (the registry's replay, issue 29) is scan(meta_only=True)
    without a Record a progress record: the same counts, ends, damage and
    first and last records, on good logs, torn ones, flipped ones, a seq gap
    and lines whose objects span lines (good checksums)."""
    import zlib

    from sessionlog_store.eventstore import record
    from sessionlog_store.eventstore.record import PROGRESS_STANDIN, decode_lines, scan_meta

    def line(rest: bytes) -> bytes:
        return b'{"crc":"%08x",%s\n' % (zlib.crc32(rest), rest)
    mixed = b"".join(encode_record(i, float(i), SessionRenamed(title=f"t{i}") if i % 3 == 1 else
                                   MessageProgress(msg_id="m", content_delta="x", offset=i)) for i in range(1, 9))
    flipped = bytearray(mixed)
    flipped[mixed.index(b'"o":5') + 4] ^= 1
    spans = (line(b'"seq":1,"ts":1.0,"type":"session_renamed","title":"a","x":[{}')
             + line(b'"z":0}]}') + encode_record(3, 3.0, SessionRenamed(title="c")))
    two = line(b'"seq":1,"ts":1.0,"type":"q","m":"m","d":"a","o":0},{"seq":2,"ts":1.0,"type":"q","m":"m","d":"b","o":1}')
    gap = mixed + encode_record(10, 10.0, SessionRenamed(title="late"))
    cases = [b"", LOG, mixed, mixed + b'{"crc":"12', mixed + b"\x00" * 40, bytes(flipped), spans, two + LOG, gap,
             mixed[:-1]]
    seen_fast = 0
    for data in cases:
        for start in (1, 4):
            if start != 1 and not data.startswith(encode_record(1, 1.0, SessionRenamed(title="t1"))):
                continue
            cut = len(b"".join(data.splitlines(keepends=True)[:start - 1]))
            with monkeypatch.context() as mp:  # the reference: scan's line-by-line path alone
                mp.setattr(record, "decode_lines", lambda *a, **k: None)
                s = scan("s", data[cut:], base_offset=cut, base_line=start - 1, expect_seq=start, meta_only=True)
            m = scan_meta("s", data[cut:], base_offset=cut, base_line=start - 1, expect_seq=start)
            assert m.records == [r for r in s.records if r.event is not PROGRESS_STANDIN], data
            assert not any(type(r.event) is MessageProgress or r.event is PROGRESS_STANDIN for r in m.records)
            assert (m.total, m.good_end, m.torn_bytes, m.corrupt and str(m.corrupt)) == \
                (len(s.records), s.good_end, s.torn_bytes, s.corrupt and str(s.corrupt)), data
            assert m.first_ts == (s.records[0].ts if s.records else 0.0)
            assert m.last_seq == (s.records[-1].seq if s.records else start - 1)
            seen_fast += m.total == 8 and not m.torn_bytes
    assert seen_fast
    # the fast path hands back what it cannot vouch for: a line holding two records, lines sharing one object
    assert decode_lines([two[:-1]], meta_only=True) is None
    assert decode_lines(spans.splitlines(), meta_only=True) is None


def test_the_checksum_check_of_many_lines_is_each_lines_exactly():
    """The lines' checksums are checked all at once in C (issue 29): the
    answer is that of each line's header compared on its own, for headers
    in capitals, short lines, a moved quote, a CRC of the next line, and one
    bad line among good ones at every place."""
    import zlib

    from sessionlog_store.eventstore.record import _checksums_hold

    def one(line: bytes) -> bool:
        return line[:18] == b'{"crc":"%08x",' % zlib.crc32(line[18:])
    good = [encode_record(i, float(i), SessionRenamed(title=f"t{i}"))[:-1] for i in range(1, 6)]
    crc = good[0][8:16]
    odd = [good[0][:8] + crc.upper() + good[0][16:], good[0][:17], b"", b'{"crc":"', good[0][:8] + crc,
           good[0][:16] + b"'," + good[0][18:], b'{"crc" :' + crc + b'",' + good[0][18:], good[1][:18] + good[0][18:],
           b"[" + good[0][1:], good[0] + b" "]
    assert _checksums_hold(good) and all(map(one, good))
    for bad in odd:
        assert not one(bad)
        for at in range(len(good) + 1):
            lines = good[:at] + [bad] + good[at:]
            assert _checksums_hold(lines) is False, (bad, at)
    assert _checksums_hold([])


def test_the_checksum_is_zlibs_crc32_made_by_isa_l():
    """Logs written with ISA-L's CRC are read with zlib's and back (the same
    values); ISA-L is a dependency, so a store here uses it, not the fallback."""
    import os
    import zlib

    from sessionlog_store.eventstore.checksum import crc32
    try:
        from isal import isal_zlib
    except ImportError:  # (a machine isal has no wheel for: zlib's own)
        assert crc32 is zlib.crc32
    else:
        assert crc32 is isal_zlib.crc32
    for n in (0, 1, 7, 64, 222, 4096, 100_000):
        data = os.urandom(n)
        assert crc32(data) == zlib.crc32(data)
        assert crc32(memoryview(data)[n // 3:]) == zlib.crc32(data[n // 3:])
    line = encode_record(3, 1.5, SessionRenamed(title="x"))
    assert int(line[8:16], 16) == zlib.crc32(line[18:-1])
