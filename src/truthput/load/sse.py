"""Incremental Server-Sent-Events parser for the streaming hot path.

Why hand-written: the client parses every chunk of every stream at high concurrency, so the parser
must never re-scan bytes it has already looked at (a naive `buffer.split(b"\\n\\n")` per read is
quadratic for long events) and must not build per-chunk objects beyond the payload bytes.

Handles: `data:` with or without the single leading space, multi-line `data:` (joined with "\\n"
as the SSE spec says), comment lines (`: keep-alive`), other fields (`event:`, `id:`, `retry:`,
ignored), CRLF line endings (also a CR/LF pair split across two reads), events split across reads
and many events in one read. Lone-CR line endings (allowed by the spec, sent by no LLM server we
know of) are not supported.
"""

from __future__ import annotations

_DATA = b"data:"
_SEP = b"\n\n"

MAX_EVENT_BYTES = 4 << 20
"""The longest event the parser holds (4 MiB): an LLM stream's chunk is a few hundred bytes to a
few KB; a server sending an endless line must not drive the client's memory up until it dies."""


class EventTooLarge(ValueError):
    """An unfinished event grew past MAX_EVENT_BYTES."""


class SSEParser:
    """Feed raw bytes, get back the `data` payload (bytes) of every complete event.

    Only the unscanned tail of the buffer is searched for the event separator; consumed bytes are
    dropped once per `feed` call (one memmove of the unconsumed remainder, usually a few bytes).
    """

    __slots__ = ("_buf", "_scan_from", "_pending_cr", "idle")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._scan_from = 0
        self._pending_cr = False
        # True when nothing is held back (no partial event, no pending CR): a caller may then take
        # a read that is exactly one whole one-line event without calling feed() (see
        # `single_event_payload`); False while bytes of an unfinished event are buffered.
        self.idle = True

    def feed(self, data: bytes) -> list[bytes]:
        """Append `data`; return the payloads of the events it completed (possibly none)."""
        # Fast path, the usual read of a client that keeps up: exactly one whole one-line event
        # `data: {...}\n\n` and nothing pending.
        if self.idle:
            one = single_event_payload(data)
            if one is not None:
                return [one]
        return self.feed_not_single(data)

    def feed_not_single(self, data: bytes) -> list[bytes]:
        """`feed` for a read the caller already found not to be one single event (that check is
        skipped: the client's hot path makes it inline)."""
        if self.idle and data[-2:] == b"\n\n" and data[:6] == b"data: " and b"\r" not in data:
            # Next most usual: several whole one-line events in one read (the client came back to
            # this socket after a few chunks). One C-level split; the newline count proves that
            # every event is one `data:` line (2 newlines per event, none inside a payload).
            payloads = data[6:-2].split(b"\n\ndata: ")
            if data.count(b"\n") == 2 * len(payloads):
                return payloads
        if self.idle and data.endswith(b"\n\n") and b"\r" not in data:
            # Whole events with comment lines, other fields or multi-line data: one split, no copies.
            parts = data.split(_SEP)
            parts.pop()  # after the final separator
            whole: list[bytes] = []
            for part in parts:
                if part.startswith(b"data: ") and b"\n" not in part:
                    whole.append(part[6:])
                else:
                    payload = _event_data(part, 0, len(part))
                    if payload is not None:
                        whole.append(payload)
            return whole
        if self._pending_cr:
            data = b"\r" + data
            self._pending_cr = False
        if b"\r" in data:
            if data.endswith(b"\r"):
                # The LF of a CRLF may arrive in the next read: hold the CR back.
                data = data[:-1]
                self._pending_cr = True
            data = data.replace(b"\r\n", b"\n")
        buf = self._buf
        buf += data
        out: list[bytes] = []
        start = 0
        find = buf.find
        pos = find(_SEP, self._scan_from)
        while pos != -1:
            payload = _event_data(buf, start, pos)
            if payload is not None:
                out.append(payload)
            start = pos + 2
            pos = find(_SEP, start)
        if start:
            del buf[:start]
        if len(buf) > MAX_EVENT_BYTES:
            size = len(buf)
            buf.clear()
            raise EventTooLarge(f"an SSE event longer than {MAX_EVENT_BYTES >> 20} MiB ({size} bytes without an "
                                "end of event)")
        # A separator may straddle this read and the next: rescan only the last byte.
        self._scan_from = max(len(buf) - 1, 0)
        self.idle = not buf and not self._pending_cr
        return out

    def flush(self) -> list[bytes]:
        """At end of stream: the payload of a final event that lacked its blank line, if any."""
        buf = self._buf
        if self._pending_cr:
            self._pending_cr = False
        while buf.endswith(b"\n"):
            del buf[-1:]
        if not buf:
            self.idle = True
            return []
        payload = _event_data(buf, 0, len(buf))
        buf.clear()
        self._scan_from = 0
        self.idle = True
        return [payload] if payload is not None else []

    @property
    def pending_bytes(self) -> int:
        """Bytes received but not yet part of a complete event (non-zero at EOF = truncated)."""
        return len(self._buf)


def single_event_payload(data: bytes) -> bytes | None:
    """The payload when `data` is exactly one whole one-line event `data: ...\\n\\n`, else None.

    The hot path of a client that keeps up (one network read = one event). Four C-level checks,
    cheapest first. A CR is only looked for just before the final blank line (the `\\r\\n\\n` of
    a CRLF stream): anywhere else a CRLF puts an LF before the end, which the `find` catches, and a
    lone CR (not supported, see the module docstring) is kept in the payload as `feed` keeps it.
    Only valid for a parser that is `idle` (nothing buffered).
    """
    if data[-2:] == b"\n\n" and data[:6] == b"data: " and data.find(b"\n", 6) == len(data) - 2 and data[-3] != 13:
        return data[6:-2]
    return None


def _event_data(buf: bytearray | bytes, start: int, end: int) -> bytes | None:
    """The joined `data` lines of the event in buf[start:end], or None if it has no data line."""
    # Fast path: the usual one-line event `data: {...}`.
    if buf.startswith(_DATA, start) and buf.find(b"\n", start, end) == -1:
        s = start + 5
        if s < end and buf[s] == 0x20:
            s += 1
        return bytes(buf[s:end])
    parts: list[bytes] = []
    for line in bytes(buf[start:end]).split(b"\n"):
        if line.startswith(_DATA):
            value = line[5:]
            if value.startswith(b" "):
                value = value[1:]
            parts.append(value)
        # comments (":...") and other fields are ignored
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else b"\n".join(parts)
