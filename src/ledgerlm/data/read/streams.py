"""A file's bytes as lines: plain, a byte range of it, or gzip and zstd decoded member by
member so that damage ends the stream after every byte that still decoded."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any, BinaryIO

import zstandard

from ledgerlm.data.read.files import READ_SIZE

_COMPRESSED_READ_SIZE = 1 << 14  # small input steps bound what one decompress call emits


class CorruptStream(Exception):
    """The compressed bytes end early or are damaged; what came before is still good."""


def _plain_chunks(raw: BinaryIO) -> Iterator[bytes]:
    while chunk := raw.read(READ_SIZE):
        yield chunk


class _Members:
    """Decompress member after member (gzip) or frame after frame (zstd), as fed.

    Driving the decoders by hand, rather than through ``gzip.GzipFile`` or zstandard's
    stream reader, keeps every byte decoded before damage (GzipFile drops its partial
    read) and notices a stream that ends inside a frame (zstandard's reader does not).
    """

    def __init__(self, codec: str) -> None:
        self.codec = codec
        if codec == "gzip":
            self._new: Callable[[], Any] = lambda: zlib.decompressobj(16 + zlib.MAX_WBITS)
        else:
            self._new = zstandard.ZstdDecompressor().decompressobj
        self._decoder, self._fed = self._new(), False

    def feed(self, data: bytes) -> Iterator[bytes]:
        try:
            while data:
                if not self._fed and self.codec == "gzip":  # zero bytes between members
                    data = data.lstrip(b"\0")
                    if not data:
                        break
                out = self._decoder.decompress(data)
                self._fed = True
                if out:
                    yield out
                if not self._decoder.eof:
                    break
                data = self._decoder.unused_data
                self._decoder, self._fed = self._new(), False
        except (zlib.error, zstandard.ZstdError) as err:
            raise CorruptStream(f"{self.codec}: {err}") from err

    def finish(self) -> None:
        if self._fed:
            raise CorruptStream(f"{self.codec}: compressed stream ends inside a frame")


def codec_of(path: str) -> str | None:
    lower = path.lower()
    if lower.endswith(".gz"):
        return "gzip"
    if lower.endswith((".zst", ".zstd")):
        return "zstd"
    return None


def _member_chunks(raw: BinaryIO, codec: str) -> Iterator[bytes]:
    members = _Members(codec)
    while data := raw.read(_COMPRESSED_READ_SIZE):  # small steps bound each output
        yield from members.feed(data)
    members.finish()


def decoded_chunks(raw: BinaryIO, path: str) -> Iterator[bytes]:
    codec = codec_of(path)
    if codec is None:
        yield from _plain_chunks(raw)
    else:
        yield from _member_chunks(raw, codec)


def compressed_prefix(path: str, decoded: int) -> int:
    """The fewest leading bytes of a compressed file that decode to ``decoded`` bytes.

    After damage, the file size less this (for ``decoded`` = the bytes of the complete
    lines read) is what the reader did not use. One pass finds the step in which the
    output reaches ``decoded``; a second feeds that step byte by byte.
    """
    codec = codec_of(path)
    if codec is None:
        return decoded  # not compressed: a byte is a byte
    if decoded <= 0:
        return 0
    with open(path, "rb") as raw:
        steps, total = 0, 0
        members = _Members(codec)
        try:
            while total < decoded and (data := raw.read(_COMPRESSED_READ_SIZE)):
                steps += 1
                for out in members.feed(data):
                    total += len(out)
        except CorruptStream:
            pass
        if total < decoded:  # cannot happen for what a reader decoded: all of it is used
            return raw.tell()
        raw.seek(0)
        members, total = _Members(codec), 0
        for _ in range(steps - 1):
            for out in members.feed(raw.read(_COMPRESSED_READ_SIZE)):
                total += len(out)
        offset = raw.tell()
        for byte in raw.read(_COMPRESSED_READ_SIZE):
            if total >= decoded:
                break
            for out in members.feed(bytes((byte,))):
                total += len(out)
            offset += 1
        return offset


def split_lines(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """Lines without their newline; a partial line cut off by corruption is never yielded."""
    pending: list[bytes] = []
    for chunk in chunks:
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            pending.append(chunk[start:end])
            yield b"".join(pending)
            pending.clear()
            start = end + 1
        if start < len(chunk):
            pending.append(chunk[start:])
    if pending:
        yield b"".join(pending)


def range_chunks(raw: BinaryIO, start: int, stop: int | None) -> Iterator[bytes]:
    """The bytes [start, stop) of a plain file (to its end when ``stop`` is None)."""
    if start:
        raw.seek(start)
    left = None if stop is None else stop - start
    while left is None or left > 0:
        chunk = raw.read(READ_SIZE if left is None else min(READ_SIZE, left))
        if not chunk:
            return
        if left is not None:
            left -= len(chunk)
        yield chunk
