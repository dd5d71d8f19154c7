"""A .gz or .zst JSONL cut short or damaged: what came before is kept, the rest is one
quarantined record, and the compressed bytes not read are counted."""

from __future__ import annotations

import gzip
import json
import random
import zlib
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import zstandard

from data_config import NO_TEMPLATES, data_config
from ledgerlm.config import DataConfig, InputConfig
from ledgerlm.data.pipeline import prepare_data
from ledgerlm.data.read.find import expand_inputs
from ledgerlm.data.read.reader import read_shard
from ledgerlm.data.read.shard import Quarantined
from ledgerlm.data.read.streams import compressed_prefix
from ledgerlm.workspace import Workspace

WORDS = [f"{a}{b}" for a in "bcdfghklmnprst" for b in ("a", "e", "io", "u", "ar", "en")]


def _lines(n: int, seed: int = 0) -> list[bytes]:
    rng = random.Random(seed)
    return [
        json.dumps({"id": f"r{i}", "text": " ".join(rng.choices(WORDS, k=40))}).encode()
        for i in range(n)
    ]


def _compress(name: str, data: bytes) -> bytes:
    if name.endswith(".gz"):
        return gzip.compress(data)
    return zstandard.ZstdCompressor().compress(data)


def _decode_prefix(name: str, data: bytes) -> bytes:
    """What an independent streaming decoder gets from the first bytes of a stream."""
    if name.endswith(".gz"):
        return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(data)
    return zstandard.ZstdDecompressor().decompressobj().decompress(data)


def _read(tmp_path: Path, name: str) -> list:
    (shard,) = expand_inputs([InputConfig(path=name)], tmp_path)
    return list(read_shard(shard, DataConfig().builtin))


CUTS = [0.02, 0.25, 0.5, 0.77, 0.999]


@pytest.mark.parametrize("name", ["cut.jsonl.gz", "cut.jsonl.zst"])
@pytest.mark.parametrize("fraction", CUTS)
def test_unread_bytes_are_exactly_what_the_reader_did_not_use(tmp_path, name, fraction):
    lines = _lines(2500)
    full = _compress(name, b"\n".join(lines) + b"\n")
    cut = full[: int(len(full) * fraction)]
    (tmp_path / name).write_bytes(cut)

    out = _read(tmp_path, name)
    docs, last = out[:-1], out[-1]
    assert isinstance(last, Quarantined) and last.reason == "corrupt_stream"
    assert not any(isinstance(d, Quarantined) for d in docs)
    assert [d.id for d in docs] == [f"r{i}" for i in range(len(docs))]
    assert last.line == len(docs) + 1
    assert 0 < last.unread_bytes <= len(cut)
    assert last.snippet.startswith(f"{last.unread_bytes} of {len(cut)} compressed bytes not read")

    # the bytes read are the fewest that decode to every complete line kept
    used = len(b"".join(line + b"\n" for line in lines[: len(docs)]))
    read = len(cut) - last.unread_bytes
    assert read == compressed_prefix(str(tmp_path / name), used)
    decoded = _decode_prefix(name, cut[:read])
    assert len(decoded) >= used and decoded[:used] == b"".join(
        x + b"\n" for x in lines[: len(docs)]
    )
    if read:
        assert len(_decode_prefix(name, cut[: read - 1])) < used


@pytest.mark.parametrize("name", ["bad.jsonl.gz", "bad.jsonl.zst"])
def test_damage_in_the_middle_ends_in_one_quarantined_record(tmp_path, name):
    lines = _lines(2500, seed=1)
    data = bytearray(_compress(name, b"\n".join(lines) + b"\n"))
    middle = len(data) // 2
    data[middle : middle + 64] = bytes(64)  # sixty-four zero bytes over the stream
    (tmp_path / name).write_bytes(bytes(data))
    out = _read(tmp_path, name)
    last = out[-1]
    assert isinstance(last, Quarantined) and last.reason == "corrupt_stream"
    assert 0 < last.unread_bytes <= len(data)
    good = [x for x in out if not isinstance(x, Quarantined)]
    assert [d.id for d in good[:100]] == [f"r{i}" for i in range(100)]
    if name.endswith(".zst"):  # zstd notices the damage where it is: the rest is unread
        assert last.unread_bytes >= len(data) - middle
        assert [d.id for d in good] == [f"r{i}" for i in range(len(good))]
    # deflate may decode the zeros into garbage lines (quarantined one by one as bad
    # JSON) and only the gzip trailer's checksum tells: those bytes were read


def test_the_manifest_sums_unread_bytes_and_conservation_holds(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    lines = _lines(1500, seed=2)
    expected = 0
    for i, (name, fraction) in enumerate(
        [("a.jsonl.gz", 0.3), ("b.jsonl.zst", 0.6), ("c.jsonl.gz", 0.9), ("d.jsonl.zst", 1.0)]
    ):
        full = _compress(name, b"\n".join(lines[i::4]) + b"\n")
        (tmp_path / name).write_bytes(full[: int(len(full) * fraction)])
    for name in ("a.jsonl.gz", "b.jsonl.zst", "c.jsonl.gz"):
        expected += _read(tmp_path, name)[-1].unread_bytes
    cfg = data_config("*.jsonl.*", templates=NO_TEMPLATES, near_dedup={"enabled": False})
    result = prepare_data(cfg, Workspace(tmp_path / "ws"))
    c = result.manifest["counts"]
    assert c["unread_bytes"] == expected > 0
    assert c["quarantined_by_reason"] == {"corrupt_stream": 3}
    dropped = sum(d["documents"] for d in c["dropped"])
    assert c["records_in"] == c["kept"] + dropped + c["quarantined"]
    rows = pq.read_table(result.path / "quarantine.parquet").to_pylist()
    assert sum(int(r["snippet"].split(" of ")[0]) for r in rows) == expected
