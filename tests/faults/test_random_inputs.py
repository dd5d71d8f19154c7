"""Random bytes and random JSON as JSONL, random Parquet tables and random text files:
no exception escapes the data stage and every record is counted exactly once."""

from __future__ import annotations

import datetime as dt
import gzip
import json
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from data_config import NO_TEMPLATES, data_config
from ledgerlm.config import InputConfig
from ledgerlm.data.pipeline import prepare_data, split_of
from ledgerlm.workspace import Workspace

FIELDS = ["id", "text", "source", "domain", "lang", "date", "extra"]
WORDS = st.sampled_from(["alpha", "beta", "gamma", "delta", "über", "日本", "x" * 30])

scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats()
    | st.text(max_size=20)
    | st.sampled_from(["", "   ", "\ud800 lone", "\x00", "\ufeff", "2024-01-02"])
    | st.lists(WORDS, min_size=3, max_size=40).map(" ".join)
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)
records = st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=4), json_values, max_size=6)
good_records = st.fixed_dictionaries(
    {"text": st.lists(WORDS, min_size=5, max_size=60).map(" ".join)},
    optional={"id": st.text(min_size=1, max_size=6) | st.integers(0, 5)},
)
lines = st.one_of(
    records.map(lambda r: json.dumps(r).encode()),
    good_records.map(lambda r: json.dumps(r).encode()),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=60),  # may hold newlines, invalid UTF-8, NULs
    st.just(b""),
)
jsonl_files = st.tuples(st.sampled_from(["", ".gz", ".zst"]), st.lists(lines, max_size=12))

ARROW = {
    "int": (pa.int64(), st.integers(-(2**63), 2**63 - 1)),
    "float": (pa.float64(), st.floats()),
    "bool": (pa.bool_(), st.booleans()),
    "string": (
        pa.string(),
        st.text(max_size=30) | st.lists(WORDS, min_size=5, max_size=30).map(" ".join),
    ),
    "binary": (pa.binary(), st.binary(max_size=20)),
    "list": (pa.list_(pa.int64()), st.lists(st.integers(0, 9), max_size=3)),
    "struct": (pa.struct([("a", pa.string())]), st.fixed_dictionaries({"a": st.text(max_size=5)})),
    "date": (pa.date32(), st.dates(dt.date(1970, 1, 1), dt.date(2100, 1, 1))),
    "timestamp": (
        pa.timestamp("us"),
        st.datetimes(dt.datetime(1970, 1, 1), dt.datetime(2100, 1, 1)),
    ),
}


@st.composite
def parquet_files(draw):
    if draw(st.integers(0, 5)) == 0:
        return ("garbage", draw(st.binary(max_size=100)))  # not Parquet at all
    n = draw(st.integers(0, 8))
    names = draw(
        st.lists(st.sampled_from(FIELDS) | st.text(min_size=1, max_size=3), max_size=4, unique=True)
    )
    columns = {}
    for name in names:
        kind = draw(st.sampled_from(sorted(ARROW)))
        typ, values = ARROW[kind]
        columns[name] = pa.array(draw(st.lists(st.none() | values, min_size=n, max_size=n)), typ)
    return ("table", (n, columns))


text_files = st.lists(
    st.binary(max_size=80)
    | st.lists(WORDS, min_size=5, max_size=40).map(lambda w: " ".join(w).encode()),
    min_size=1,
    max_size=4,
)


def _write_jsonl(path: Path, comp: str, items: list[bytes]) -> int:
    raw = b"\n".join(items)
    data = {
        "": raw,
        ".gz": gzip.compress(raw) if raw else b"",
        ".zst": zstandard.ZstdCompressor().compress(raw),
    }[comp]
    path.with_name(path.name + comp).write_bytes(data)
    return sum(1 for line in raw.split(b"\n") if line.strip())


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    jsonl=st.lists(jsonl_files, min_size=1, max_size=3),
    parquet=st.lists(parquet_files(), max_size=2),
    texts=text_files,
)
def test_random_inputs_are_all_counted(jsonl, parquet, texts):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "in").mkdir()
        expected = 0
        for i, (comp, items) in enumerate(jsonl):
            expected += _write_jsonl(root / "in" / f"j{i}.jsonl", comp, items)
        for i, (kind, payload) in enumerate(parquet):
            path = root / "in" / f"p{i}.parquet"
            if kind == "garbage":
                path.write_bytes(payload)
                expected += 1
            else:
                n, columns = payload
                pq.write_table(pa.table(columns) if columns else pa.table({}), path)
                expected += n if columns else 0
        # one document that lands in the validation split, which may not be empty
        anchor = next(
            f"anchor-{k}" for k in range(1000) if split_of(f"anchor-{k}", 0.3, 0) == "val"
        )
        line = {"id": anchor, "text": "an anchor document with enough plain words for every filter"}
        (root / "in" / "anchor.jsonl").write_text(json.dumps(line) + "\n")
        expected += 1
        folder = root / "folder"
        for i, data in enumerate(texts):
            (folder / ("sub" if i % 2 else "")).mkdir(parents=True, exist_ok=True)
            (folder / ("sub" if i % 2 else "") / f"t{i}.{'md' if i % 3 else 'txt'}").write_bytes(
                data
            )
        expected += len(texts)
        sources = [InputConfig(path=str(root / "in" / "*.jsonl*"), domain="web")]
        if parquet:
            sources.append(InputConfig(path=str(root / "in" / "*.parquet")))
        sources.append(InputConfig(path=str(folder), domain="prose"))
        cfg = data_config(
            *sources, val_fraction=0.3, templates=NO_TEMPLATES, near_dedup={"enabled": False}
        )
        result = prepare_data(cfg, Workspace(root / "ws"))
        c = result.manifest["counts"]
        dropped = sum(d["documents"] for d in c["dropped"])
        assert c["records_in"] == expected
        assert c["records_in"] == c["kept"] + dropped + c["quarantined"]
        assert c["quarantined"] == sum(c["quarantined_by_reason"].values())
        assert (
            pq.ParquetFile(result.path / "quarantine.parquet").metadata.num_rows == c["quarantined"]
        )
        assert not list((root / "ws" / "data").glob(".building-*"))
