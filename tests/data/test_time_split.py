"""Splits by time (requirement D7): documents dated on or after data.split_time are held out,
undated ones go to train and are counted, and a near-duplicate cluster never straddles
the cut. Real JSONL and Parquet files through the real data stage."""

from __future__ import annotations

import datetime as dt
import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cli_runner import ledgerlm
from data_config import data_config
from ledgerlm.config import BuiltinCorpusConfig, DataConfig, InputConfig, RecipeError, parse_time
from ledgerlm.data.passes import held_split
from ledgerlm.data.pipeline import DataError, check_inputs, data_version, prepare_data
from ledgerlm.data.read.find import expand_inputs
from ledgerlm.data.read.reader import read_shard
from ledgerlm.data.read.shard import Quarantined
from ledgerlm.workspace import Workspace

CUT = "2024-01-01"
CUT_US = parse_time(CUT)
VOCAB = [f"w{i}{c}" for i in range(400) for c in "ab"]


def _body(rng: random.Random, n: int = 120) -> str:
    words = [rng.choice(VOCAB) for _ in range(n)]
    return "\n".join(" ".join(words[i : i + 20]) for i in range(0, n, 20))


def _edited(body: str) -> str:
    words = body.split(" ")
    words[7] = "zzz"
    return " ".join(words)


def make_corpus(folder: Path) -> dict:
    """A JSONL file of dated (ISO, Unix seconds), undated and badly dated records, and a
    Parquet file with native dates and timestamps; returns what a time split must give."""
    rng = random.Random(0)
    lines: list[str] = []
    dates: dict[str, str | int | None] = {}
    for i in range(60):
        date = f"{2021 + i % 5}-{1 + i % 12:02d}-{1 + i % 28:02d}"  # 2021 .. 2025
        if i % 10 == 3:
            date = None  # undated
        elif i % 10 == 7:
            date = f"{date}T10:00:00Z"
        record = {"id": f"j{i}", "text": _body(rng)}
        if date is not None:
            record["date"] = date
        dates[record["id"]] = date
        lines.append(json.dumps(record))
    for k, ts in enumerate((1_600_000_000, 1_750_000_000)):  # 2020-09 and 2025-06
        dates[f"u{k}"] = ts
        lines.append(json.dumps({"id": f"u{k}", "text": _body(rng), "date": ts}))
    for doc_id, date in (("at-cut", CUT), ("before-cut", "2023-12-31T23:59:59.999999Z")):
        dates[doc_id] = date  # on the cut: held out; a microsecond before: train
        lines.append(json.dumps({"id": doc_id, "text": _body(rng), "date": date}))
    lines.insert(4, json.dumps({"id": "bad1", "text": _body(rng), "date": "yesterday"}))  # line 5
    lines.insert(9, json.dumps({"id": "bad2", "text": _body(rng), "date": "2024-02-30"}))  # 10
    lines.insert(11, json.dumps({"id": "bad3", "text": _body(rng), "date": True}))  # line 12
    # a near-duplicate pair across the cut, the later one first in input order (so the
    # default keeper, the first, is the one dated after the cut): the pair goes to train
    pair = _body(rng)
    lines.append(json.dumps({"id": "late", "text": pair, "date": "2024-06-01"}))
    lines.append(json.dumps({"id": "early", "text": _edited(pair), "date": "2023-06-01"}))
    # a pair wholly after the cut, and an undated copy of it: all held out
    after = _body(rng)
    lines.append(json.dumps({"id": "after1", "text": after, "date": "2024-03-01"}))
    lines.append(json.dumps({"id": "after2", "text": _edited(after), "date": "2025-03-01"}))
    lines.append(json.dumps({"id": "after-undated", "text": after.upper()}))
    (folder / "a.jsonl").write_text("\n".join(lines) + "\n")
    days = [dt.date(2022, 5, 1) + dt.timedelta(days=97 * k) for k in range(12)]  # to 2025
    table = pa.table(
        {
            "id": [f"p{k}" for k in range(12)] + ["p-bad"],
            "text": [_body(rng) for _ in range(13)],
            "published": [d.isoformat() for d in days] + ["not a date"],
            "when": pa.array(
                [dt.datetime(d.year, d.month, d.day, 12) for d in days] + [None],
                pa.timestamp("us"),
            ),
        }
    )
    pq.write_table(table, folder / "b.parquet")
    for k, d in enumerate(days):
        dates[f"p{k}"] = d.isoformat()
    return {
        "dates": dates,
        "records_in": len(lines) + 13,
        "bad": {("a.jsonl", 5), ("a.jsonl", 10), ("a.jsonl", 12), ("b.parquet", 13)},
    }


def _config(folder: Path, **kw) -> DataConfig:
    web = {"path": str(folder / "a.jsonl"), "domain": "web"}
    dated = {"path": str(folder / "b.parquet"), "domain": "pq", "date_field": "published"}
    keys = {"val_fraction": None, "split": "time", "split_time": CUT, **kw}
    return data_config(web, dated, **keys, near_dedup={"verify": True})


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    folder = tmp_path_factory.mktemp("time")
    expected = make_corpus(folder)
    result = prepare_data(_config(folder), Workspace(folder / "ws"))
    return folder, expected, result


def _rows(result) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for f in result.manifest["files"]:
        out.setdefault(f["split"], []).extend(pq.read_table(result.path / f["path"]).to_pylist())
    return out


def _time(row: dict) -> int | None:
    return None if row["date"] is None else parse_time(row["date"])


def test_the_cut_holds_out_the_future_and_keeps_every_record(built):
    _, expected, result = built
    c = result.manifest["counts"]
    dropped = sum(d["documents"] for d in c["dropped"])
    assert c["records_in"] == expected["records_in"]
    assert c["records_in"] == c["kept"] + dropped + c["quarantined"]
    rows = _rows(result)
    assert set(rows) == {"train", "val"}  # no test split asked for: held out is val
    assert sum(len(r) for r in rows.values()) == c["kept"]
    pulled = {"late"}  # dated after the cut, in train with its earlier near-duplicate
    for row in rows["train"]:
        when = _time(row)
        assert when is None or when < CUT_US or row["id"] in pulled, row["id"]
    assert rows["val"] and all(_time(r) >= CUT_US for r in rows["val"] if r["date"])
    # every dated document of the inputs is on the side of its date, but the pair
    for doc_id, date in expected["dates"].items():
        if date is None or doc_id in pulled:
            continue
        side = "train" if parse_time(date) < CUT_US else "val"
        assert doc_id in {r["id"] for r in rows[side]}, doc_id
    # a Unix time is read as one, and kept as its ISO text
    by_id = {r["id"]: r for split in rows.values() for r in split}
    assert by_id["u1"]["date"] == "2025-06-15T15:06:40+00:00"
    assert {r["id"] for r in rows["val"]} >= {"u1"} and "u0" in {r["id"] for r in rows["train"]}


def test_undated_documents_go_to_train_and_are_counted(built):
    _, expected, result = built
    rows = _rows(result)
    undated = {k for k, v in expected["dates"].items() if v is None and k.startswith("j")}
    assert len(undated) == 6 and undated <= {r["id"] for r in rows["train"]}
    time = result.manifest["split"]["time"]
    assert time["undated"] == {"train": 6, "val": 0, "test": 0}
    assert time["split_time"] == CUT and time["cut_utc"] == "2024-01-01T00:00:00+00:00"
    assert result.manifest["split"]["unit"] == "cluster"


def test_a_near_duplicate_cluster_goes_with_its_earliest_dated_member(built):
    _, _, result = built
    rows = _rows(result)
    train = {r["id"]: r for r in rows["train"]}
    val = {r["id"]: r for r in rows["val"]}
    drops = {d["id"]: d for d in pq.read_table(result.path / "drops.parquet").to_pylist()}
    # late (2024-06) is the keeper; early (2023-06) decides: the pair is train
    assert "late" in train and train["late"]["cluster_size"] == 2
    assert drops["early"]["kept"] == "late"
    assert result.manifest["split"]["time"]["train_dated_after_cut"] == 1
    # the pair after the cut and its undated copy are held out together
    assert "after1" in val and val["after1"]["cluster_size"] == 3
    assert drops["after2"]["kept"] == drops["after-undated"]["kept"] == "after1"


def test_a_bad_date_is_quarantined_with_its_file_and_line(built):
    _, expected, result = built
    quarantine = pq.read_table(result.path / "quarantine.parquet").to_pylist()
    found = {(Path(q["file"]).name, q["line"]) for q in quarantine if q["reason"] == "bad_date"}
    assert found == expected["bad"]
    assert result.manifest["counts"]["quarantined_by_reason"] == {"bad_date": 4}


def test_data_inspect_says_where_the_cut_is_and_counts_the_undated(built):
    folder, _, result = built
    out = ledgerlm("data", "inspect", result.version, "-w", str(folder / "ws")).stdout
    assert f"split by time: held out on or after {CUT}" in out
    assert "undated: 6 (train)" in out
    assert "  1 dated on or after it in train: with an earlier duplicate" in out


def test_a_test_split_takes_its_share_of_the_held_out_clusters(built, tmp_path):
    folder, _, plain = built
    cfg = _config(folder, val_fraction=0.5, test_fraction=0.5, split_seed=3)
    result = prepare_data(cfg, Workspace(tmp_path / "ws"))
    rows = _rows(result)
    assert rows["val"] and rows["test"]
    for split in ("val", "test"):
        for row in rows[split]:
            assert held_split(row["cluster_id"], 0.5, 3) == split
    # the cut decides what is held out; the shares only divide it
    held = {r["id"] for s in ("val", "test") for r in rows[s]}
    assert held == {r["id"] for r in _rows(plain)["val"]}
    assert {r["id"] for r in rows["train"]} == {r["id"] for r in _rows(plain)["train"]}


def test_the_records_dates_in_every_form(tmp_path):
    stamp = dt.datetime(2024, 5, 6, 7, 8, 9, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    pq.write_table(
        pa.table(
            {
                "text": ["a b c"] * 4,
                "date": pa.array(
                    [dt.date(2024, 1, 2), None, dt.date(1969, 12, 31), dt.date(2000, 1, 1)]
                ),
                "at": pa.array([stamp, None, stamp, stamp], pa.timestamp("s", tz="+02:00")),
            }
        ),
        tmp_path / "t.parquet",
    )
    dated = [
        r
        for s in expand_inputs([InputConfig(path="t.parquet")], tmp_path, dated=True)
        for r in read_shard(s, BuiltinCorpusConfig())
    ]
    assert [d.date for d in dated] == ["2024-01-02", None, "1969-12-31", "2000-01-01"]
    at = [
        r
        for s in expand_inputs([InputConfig(path="t.parquet", date_field="at")], tmp_path, True)
        for r in read_shard(s, BuiltinCorpusConfig())
    ]
    assert parse_time(at[0].date) == parse_time("2024-05-06T05:08:09Z") and at[1].date is None
    assert json.loads(at[0].meta)["date"] == "2024-01-02"  # the field not read as the date
    assert parse_time(1.5) == 1_500_000 and parse_time("1970-01-01T00:00:01+01:00") == -3599e6


def test_without_a_time_split_dates_are_read_as_before(tmp_path):
    (tmp_path / "a.jsonl").write_text(
        json.dumps({"text": "some words", "date": "yesterday"}) + "\n"
    )
    (doc,) = [
        r
        for s in expand_inputs([InputConfig(path="a.jsonl")], tmp_path)
        for r in read_shard(s, BuiltinCorpusConfig())
    ]
    assert doc.date == "yesterday"
    strict = [
        r
        for s in expand_inputs([InputConfig(path="a.jsonl")], tmp_path, dated=True)
        for r in read_shard(s, BuiltinCorpusConfig())
    ]
    assert isinstance(strict[0], Quarantined) and (strict[0].line, strict[0].reason) == (
        1,
        "bad_date",
    )


def test_version_ids_change_only_for_recipes_that_split_by_time(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"text":"hello world","date":"2024-01-02"}\n')

    def version(**kw) -> str:
        cfg = DataConfig.model_validate({"sources": ["a.jsonl"], "split": "document", **kw})
        return data_version(cfg, tmp_path)[0]

    def with_source(**kw) -> str:
        return version(sources=[{"path": "a.jsonl", **kw}])

    # the ids these recipes had before time splits existed
    assert version() == "327444432809a9e4"
    assert with_source() == "53d1efe7749ebff6"
    assert with_source(text_field="body", id_field="k") == "b99cb52d3aac2bd2"
    assert with_source(date_field="date") == "53d1efe7749ebff6"  # the default, written out
    ids = {
        version(),
        with_source(date_field="when"),
        version(split="time", split_time=CUT),
        version(split="time", split_time="2024-01-02"),
    }
    assert len(ids) == 4


def test_a_bad_split_time_is_one_line_naming_the_setting(tmp_path):
    for data, message in (
        ({"split": "time", "split_time": "2024-13-01"}, r"data\.split_time: '2024-13-01' is not"),
        ({"split": "time", "split_time": 20240101}, r"data\.split_time: 20240101 is not"),
        ({"split": "time"}, r'split = "time" needs split_time'),
        ({"split_time": CUT}, r'split_time is set but split = "cluster"'),
    ):
        with pytest.raises(RecipeError, match=message):
            from ledgerlm.config import recipe_from_dict

            recipe_from_dict({"data": data}, "r.toml")
    recipe = tmp_path / "r.toml"
    recipe.write_text('[data]\nsplit = "time"\nsplit_time = "01/02/2024"\n')
    proc = ledgerlm("data", "prepare", str(recipe), "-w", str(tmp_path / "ws"), check=False)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert proc.stderr.startswith(f"error: {recipe}: data.split_time: '01/02/2024' is not")
    recipe.write_text('[data]\nsplit = "time"\nsplit_time = 2024-01-01\n')  # a TOML date
    from ledgerlm.config import load_recipe

    assert load_recipe(recipe).data.split_time == CUT


def test_no_document_after_the_cut_stops_the_build_naming_the_setting(built, tmp_path):
    folder, _, _ = built
    with pytest.raises(DataError, match=r"the val split is empty: none of the .* 2100-01-01"):
        prepare_data(_config(folder, split_time="2100-01-01"), Workspace(tmp_path / "ws"))


def test_a_time_split_with_nowhere_to_hold_out_is_refused_before_any_work(built):
    folder, _, _ = built
    cfg = _config(folder).model_copy(update={"val_sources": [str(folder / "a.jsonl")]})
    with pytest.raises(DataError, match=r'data.split = "time" has no split to hold out into'):
        check_inputs(cfg)
    check_inputs(cfg.model_copy(update={"test_fraction": 0.1}))  # the held out go to test
