"""Reading agent logs defensively: regular files only, bounded sizes, detected encodings.

Agent logs are written by other programs and sometimes copied, converted or replaced by hand:
a log folder can hold a FIFO (opening it for reading blocks until a writer comes), a symlink to
/dev/zero (reading it never ends), a 2 GB line, or a file saved as UTF-16 or Latin-1. Every
reader here opens with O_NONBLOCK and checks the open descriptor (not the path, which can be
swapped after a check) before reading a byte.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import orjson

MB = 1024 * 1024
# Sane defaults; `[memory] max_file_mb` / `max_line_mb` override them.
MAX_FILE_BYTES = 1024 * MB  # a JSON document is read whole, so this bounds memory too
MAX_LINE_BYTES = 64 * MB  # Claude Code lines carrying pasted images reach a few MB
SNIFF_BYTES = 4096  # what encoding detection looks at
SKIP_CHUNK = 1 * MB  # an oversize line is skipped in chunks of this size, never held whole

UTF8_BOM = b"\xef\xbb\xbf"
UTF16_LE_BOM = b"\xff\xfe"
UTF16_BE_BOM = b"\xfe\xff"
# A \uD800-\uDFFF escape: JS-based CLIs write a lone one when they cut a string inside an emoji.
SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
LONE_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True)
class ReadLimits:
    max_file_bytes: int = MAX_FILE_BYTES
    max_line_bytes: int = MAX_LINE_BYTES


class SkippedFile(Exception):
    """A store file that is deliberately not read (not a regular file, over the size bound)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def open_regular(path: Path, limits: ReadLimits) -> BinaryIO:
    """`path` opened for binary reading when it is a regular file within the size bound.

    O_NONBLOCK makes opening a FIFO without a writer return at once instead of hanging; fstat on
    the descriptor then rejects FIFOs, devices and sockets (a symlink to /dev/zero included).
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SkippedFile("not a regular file")
        if st.st_size > limits.max_file_bytes:
            raise SkippedFile(f"over {size_text(limits.max_file_bytes)}")
        # Regular files never block; clear the flag so reads behave as usual.
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def size_text(n: int) -> str:
    return f"{n // MB} MB" if n >= MB and n % MB == 0 else f"{n:,} bytes"


def is_regular(path: Path) -> bool:
    """True when `path` (symlinks followed) is a regular file; for stores opened by other libraries (SQLite)."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def read_bounded(path: Path, limits: ReadLimits) -> bytes:
    """A whole regular file's bytes, at most `max_file_bytes` (a file that grew meanwhile is cut there)."""
    with open_regular(path, limits) as fh:
        return fh.read(limits.max_file_bytes + 1)[: limits.max_file_bytes]


# -- encodings -----------------------------------------------------------------------------------


def sniff_utf16(head: bytes) -> str | None:
    """'utf-16-le' / 'utf-16-be' when the first bytes say so: a BOM, or (JSON being mostly ASCII)
    zero bytes in nearly every other position of the sample. A UTF-8 file that merely opens with
    one UTF-16 line does not qualify; that line is decoded on its own (`parse_line`)."""
    if head.startswith(UTF16_LE_BOM):
        return "utf-16-le"
    if head.startswith(UTF16_BE_BOM):
        return "utf-16-be"
    sample = head[: len(head) - len(head) % 2]
    if len(sample) < 4:
        return None
    half = len(sample) // 2
    if sample[1::2].count(0) >= 0.9 * half and sample[0::2].count(0) < 0.1 * half:
        return "utf-16-le"
    if sample[0::2].count(0) >= 0.9 * half and sample[1::2].count(0) < 0.1 * half:
        return "utf-16-be"
    return None


def decode_text(data: bytes) -> str:
    """Bytes of a log -> text: a BOM decides, then UTF-16 by its zero bytes, then UTF-8 or Latin-1
    by which the bytes mostly are (`utf8_or_latin1`)."""
    if data.startswith(UTF8_BOM):
        return data[3:].decode("utf-8", errors="replace")
    enc = sniff_utf16(data[:SNIFF_BYTES])
    if enc is not None:
        body = data[2:] if data[:2] in (UTF16_LE_BOM, UTF16_BE_BOM) else data
        return body.decode(enc, errors="replace")
    return utf8_or_latin1(data)


def utf8_or_latin1(data: bytes) -> str:
    """UTF-8 bytes (a bad byte becomes U+FFFD, the rest of the text kept), or Latin-1 ones.

    Latin-1 is for logs a person saved in a legacy encoding (which maps every byte, so nothing is
    dropped; a Windows-1252 file reads close enough): there every accented letter is an invalid
    UTF-8 sequence. A UTF-8 log with one cut or stray byte has more valid non-ASCII characters than
    bad sequences, and reading it as Latin-1 would garble all of them (`café` -> `cafÃ©`).
    """
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        pass
    text = data.decode("utf-8", errors="replace")
    already = data.count("\ufffd".encode())  # replacement characters that were in the bytes
    bad = text.count("\ufffd") - already
    valid = sum(1 for ch in text if ch > "\x7f") - bad
    return text if valid >= bad else data.decode("latin-1")


def json_loads(data: bytes | str) -> Any:
    """orjson's parse, or for JSON it refuses that the standard allows (a lone surrogate escape,
    `"\ud83d"`) the stdlib's, each lone surrogate then replaced by U+FFFD so the text can be
    stored as UTF-8. Raises orjson.JSONDecodeError (a ValueError) when it is not JSON."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
        if not SURROGATE_ESCAPE.search(raw):  # the fast path stays the only one for other bad input
            raise
        first = exc
    try:
        value = json.loads(data, parse_constant=_no_constant)
    except (ValueError, RecursionError):
        raise first from None
    return _without_surrogates(value)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # NaN, Infinity: orjson refuses them too


def _without_surrogates(value: Any) -> Any:
    if isinstance(value, str):
        return LONE_SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [_without_surrogates(v) for v in value]
    if isinstance(value, dict):
        return {_without_surrogates(k): _without_surrogates(v) for k, v in value.items()}
    return value


def load_json(data: bytes) -> Any:
    """One JSON value from bytes in any encoding `decode_text` knows; raises ValueError when not JSON."""
    try:
        return json_loads(data)
    except orjson.JSONDecodeError:
        pass
    text = decode_text(data)
    return json_loads(text.lstrip("\ufeff"))


# -- JSONL ---------------------------------------------------------------------------------------

# What `lines` yields in place of a line that was over the bound (it was skipped, not read).
OVERSIZE = b""


def lines(path: Path, start: int, limits: ReadLimits, encoding: str | None) -> Iterator[tuple[int, int, bytes]]:
    """(offset, end offset, line) from byte `start`; a line over `max_line_bytes` comes as OVERSIZE.

    UTF-8 and Latin-1 files are read line by line; a UTF-16 file (`encoding`) is decoded from
    `start` to its end and its lines are yielded re-encoded as UTF-8, offsets staying in file bytes.
    """
    with open_regular(path, limits) as fh:
        fh.seek(start)
        if encoding is not None:
            yield from _utf16_lines(fh.read(limits.max_file_bytes), start, encoding)
            return
        offset = start
        while True:
            line = fh.readline(limits.max_line_bytes + 1)
            if not line:
                return
            if len(line) > limits.max_line_bytes and not line.endswith(b"\n"):
                end = offset + len(line)
                while True:  # skip the rest of the line without keeping it
                    chunk = fh.readline(SKIP_CHUNK)
                    end += len(chunk)
                    if not chunk or chunk.endswith(b"\n"):
                        break
                yield offset, end, OVERSIZE
                offset = end
                continue
            yield offset, offset + len(line), line
            offset += len(line)


def _utf16_lines(data: bytes, start: int, encoding: str) -> Iterator[tuple[int, int, bytes]]:
    offset = start
    if start == 0 and data[:2] in (UTF16_LE_BOM, UTF16_BE_BOM):
        offset, data = 2, data[2:]
    data = data[: len(data) - len(data) % 2]
    newline = "\n".encode(encoding)
    pos = 0
    while pos < len(data):
        end = pos
        while True:  # the next newline at an even position (a code unit, not a byte inside one)
            end = data.find(newline, end)
            if end < 0 or end % 2 == 0:
                break
            end += 1
        stop = len(data) if end < 0 else end + 2
        raw = data[pos:stop]
        text = raw.decode(encoding, errors="replace")
        yield offset + pos, offset + stop, text.encode("utf-8")
        pos = stop


def parse_line(line: bytes) -> tuple[Any, str]:
    """(value, "") for a JSON line in UTF-8, Latin-1 or UTF-16 (one converted line in a UTF-8
    file), else (None, reason)."""
    try:
        return json_loads(line), ""
    except orjson.JSONDecodeError:
        pass
    body = line.rstrip(b"\r\n")
    if b"\x00" in body:
        for candidate, enc in ((body.lstrip(b"\x00"), "utf-16-le"), (body.rstrip(b"\x00"), "utf-16-be"),
                               (body.strip(b"\x00"), "utf-16-le")):
            if len(candidate) % 2 and enc == "utf-16-le":
                candidate += b"\x00"
            try:
                return json_loads(candidate.decode(enc)), ""
            except (UnicodeDecodeError, orjson.JSONDecodeError):
                continue
        return None, "not JSON"
    try:
        line.decode("utf-8")
    except UnicodeDecodeError:
        try:
            return json_loads(utf8_or_latin1(line)), ""
        except orjson.JSONDecodeError:
            return None, "not JSON"
    if len(body) > 1 and body.lstrip()[:1] in (b"{", b"[") and not body.rstrip().endswith((b"}", b"]")):
        return None, "truncated JSON"
    return None, "not JSON"


__all__ = [
    "MAX_FILE_BYTES",
    "MAX_LINE_BYTES",
    "OVERSIZE",
    "ReadLimits",
    "SkippedFile",
    "decode_text",
    "is_regular",
    "json_loads",
    "lines",
    "load_json",
    "open_regular",
    "parse_line",
    "read_bounded",
    "size_text",
    "sniff_utf16",
    "utf8_or_latin1",
]
