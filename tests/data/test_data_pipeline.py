"""The data stage end to end on a corpus with planted bad records, templates and duplicates."""

import gzip
import json
import random

import numpy as np
import pyarrow.parquet as pq
import pytest

from data_config import data_config
from ledgerlm.config import DataConfig, InputConfig, RecipeError, load_recipe
from ledgerlm.data import manifest, passes, pipeline
from ledgerlm.data.pipeline import DataError, check_inputs, prepare_data, split_of
from ledgerlm.workspace import Workspace, file_sha256

BANNER = "Copyright 2024 Example Corp. All rights reserved worldwide."
FOOTER = "Follow us on social media for more updates every single day."
VOCAB = [f"w{i}{c}" for i in range(400) for c in "ab"]
# the corpus fixture's files: one domain, near-duplicate clusters checked by exact Jaccard
WEB = {"domain": "web", "near_dedup": {"verify": True}}


def _body(rng: random.Random, n: int = 200) -> str:
    words = [rng.choice(VOCAB) for _ in range(n)]
    return "\n".join(" ".join(words[i : i + 20]) for i in range(0, n, 20))


def _doc(i: int, body: str, **extra) -> dict:
    return {"id": f"web-{i}", "text": f"{BANNER}\n{body}\n{FOOTER}", **extra}


def make_corpus(folder, seed: int = 0) -> dict:
    """Two JSONL shards (one gzipped); returns what a correct data stage must find."""
    rng = random.Random(seed)
    bodies = {i: _body(rng) for i in range(40)}
    good = [_doc(i, bodies[i], date=f"20{10 + i % 10}-01-01") for i in range(40)]
    # same text as web-1 up to case and spacing once the banner and footer are removed
    exact = [_doc(100 + k, bodies[1].upper().replace(" ", "  ")) for k in range(3)]
    words = bodies[5].split(" ")
    near = []
    for k in range(2):
        edited = list(words)
        edited[10 + 50 * k] = "zzz"
        near.append(_doc(200 + k, " ".join(edited)))
    bait = [
        {"id": "spam", "text": " ".join(["buy cheap pills now"] * 60)},
        {"id": "short", "text": "hi"},
    ]
    first = [json.dumps(r) for r in good[:20] + exact]
    first.insert(3, "{not json")  # line 4
    first.insert(7, json.dumps({"id": "no-text"}))  # line 8
    second = [json.dumps(r) for r in good[20:] + near + bait]
    second.insert(0, json.dumps({"id": "num", "text": 42}))  # line 1
    second.insert(5, json.dumps({"id": "empty", "text": "   "}))  # line 6
    (folder / "a.jsonl").write_text("\n".join(first) + "\n")
    raw = ("\n".join(second) + "\n").encode()
    raw = raw.replace(b'"id": "web-25"', b'"id": "web-25\xff"', 1)  # invalid UTF-8
    (folder / "b.jsonl.gz").write_bytes(gzip.compress(raw))
    return {
        "records_in": 40 + 3 + 2 + 2 + 4,  # web-25 (among the 40) is quarantined too
        "quarantined": {
            "a.jsonl": {4: "bad_json", 8: "missing_text"},
            "b.jsonl.gz": {1: "text_not_string", 6: "empty_text", 8: "invalid_utf8"},
        },
        "kept": 39,  # 40 good, web-25 quarantined
    }


@pytest.fixture
def corpus(tmp_path):
    (tmp_path / "in").mkdir()
    return tmp_path / "in", make_corpus(tmp_path / "in")


def _all_rows(result) -> list[dict]:
    rows = []
    for f in result.manifest["files"]:
        rows += pq.read_table(result.path / f["path"]).to_pylist()
    return rows


def test_prepare_keeps_exactly_what_it_should(tmp_path, corpus):
    folder, expected = corpus
    result = prepare_data(data_config(folder / "*.jsonl*", **WEB), Workspace(tmp_path / "ws"))
    m = result.manifest
    c = m["counts"]
    assert c["records_in"] == expected["records_in"]
    assert c["kept"] == expected["kept"]
    dropped = {(d["step"], d["reason"]): d["documents"] for d in c["dropped"]}
    assert dropped == {
        ("length", "too_short"): 1,
        ("repetition", "repeated_ngram"): 1,
        ("exact_dedup", "duplicate"): 3,
        ("near_dedup", "duplicate"): 2,
    }
    assert c["quarantined"] == 5
    assert c["records_in"] == c["kept"] + sum(dropped.values()) + c["quarantined"]

    quarantine = pq.read_table(result.path / "quarantine.parquet").to_pylist()
    found = {(q["file"].rsplit("/", 1)[-1], q["line"]): q["reason"] for q in quarantine}
    for file, lines in expected["quarantined"].items():
        for line, reason in lines.items():
            assert found[(file, line)] == reason

    drops = {d["id"]: d for d in pq.read_table(result.path / "drops.parquet").to_pylist()}
    for k in range(3):
        assert drops[f"web-{100 + k}"]["kept"] == "web-1"  # pointer to the kept representative
        assert drops[f"web-{100 + k}"]["cluster_id"] == "web-1"
    for k in range(2):
        assert drops[f"web-{200 + k}"]["kept"] == "web-5"

    rows = _all_rows(result)
    assert len(rows) == c["kept"]
    assert all(BANNER not in r["text"] and FOOTER not in r["text"] for r in rows)
    templates = next(s for s in m["steps"] if s["name"] == "templates")["stats"]
    web = templates[str(folder / "*.jsonl*")]
    assert web["lines_removed"] == 2 * (39 + 3 + 2)  # every document that carried them
    sizes = {r["id"]: r["cluster_size"] for r in rows}
    assert sizes["web-1"] == 4 and sizes["web-5"] == 3
    assert {r["weight"] for r in rows} == {1.0}  # rebalance is the default
    top = {t["cluster_id"]: t["size"] for t in m["clusters"]["top"]}
    assert top == {"web-1": 4, "web-5": 3}
    assert {(s["step"], s["reason"]) for s in m["sample_drops"]} == set(dropped)


def test_preserve_weights_carry_cluster_size(tmp_path, corpus):
    folder, _ = corpus
    rows = _all_rows(
        prepare_data(
            data_config(folder / "*.jsonl*", **WEB, weights="preserve"),
            Workspace(tmp_path / "w"),
        )
    )
    weights = {r["id"]: r["weight"] for r in rows}
    assert weights["web-1"] == 4.0 and weights["web-5"] == 3.0 and weights["web-2"] == 1.0


def test_split_units_are_never_cut(tmp_path, corpus):
    folder, _ = corpus
    result = prepare_data(data_config(folder / "*.jsonl*", **WEB), Workspace(tmp_path / "ws"))
    for f in result.manifest["files"]:
        for row in pq.read_table(result.path / f["path"]).to_pylist():
            assert split_of(row["cluster_id"], 0.2, 0) == f["split"]
    # split by source, one source: the whole source falls on one side. In val, it is all
    # validation; in train, there is no validation split and the build stops, naming why.
    cfg = data_config(folder / "*.jsonl*", **WEB, split="source")
    (source,) = {s.source for s in check_inputs(cfg)}
    if split_of(source, 0.2, 0) == "val":
        by_source = prepare_data(cfg, Workspace(tmp_path / "ws"))
        assert {f["split"] for f in by_source.manifest["files"]} == {"val"}
    else:
        with pytest.raises(DataError, match=r"the val split is empty: .* 1 source unit\(s\)"):
            prepare_data(cfg, Workspace(tmp_path / "ws"))


def test_same_inputs_reuse_the_version_and_outputs_are_deterministic(tmp_path, corpus):
    folder, _ = corpus
    a = prepare_data(data_config(folder / "*.jsonl*", **WEB), Workspace(tmp_path / "a"))
    b = prepare_data(data_config(folder / "*.jsonl*", **WEB), Workspace(tmp_path / "b"))
    assert a.version == b.version and not a.reused
    assert (a.path / "manifest.json").read_bytes() == (b.path / "manifest.json").read_bytes()
    again = prepare_data(data_config(folder / "*.jsonl*", **WEB), Workspace(tmp_path / "a"))
    assert again.reused and again.version == a.version
    other = prepare_data(
        data_config(folder / "*.jsonl*", **WEB, val_fraction=0.3),
        Workspace(tmp_path / "a"),
    )
    assert other.version != a.version


def test_process_pool_gives_identical_output(tmp_path, corpus):
    folder, _ = corpus
    inline = prepare_data(data_config(folder / "*.jsonl*", **WEB), Workspace(tmp_path / "a"))
    pooled = prepare_data(
        data_config(folder / "*.jsonl*", **WEB, workers=2),
        Workspace(tmp_path / "b"),
    )
    assert pooled.version == inline.version
    for f in inline.manifest["files"] + [{"path": "drops.parquet"}, {"path": "manifest.json"}]:
        assert file_sha256(inline.path / f["path"]) == file_sha256(pooled.path / f["path"])


def test_interrupted_build_resumes_from_finished_shards(tmp_path, corpus, monkeypatch):
    folder, _ = corpus
    ws = Workspace(tmp_path / "ws")
    real_write = passes._write

    def crash_on_second_shard(index, *args):
        if index == 1:
            raise KeyboardInterrupt("killed")
        return real_write(index, *args)

    monkeypatch.setattr(passes, "_write", crash_on_second_shard)
    with pytest.raises(KeyboardInterrupt):
        prepare_data(data_config(folder / "*.jsonl*", **WEB), ws)
    assert ws.versions("data") == []  # nothing half-written is visible
    building = list((tmp_path / "ws" / "data").glob(".building-*/_work/*.done"))
    assert {p.name for p in building} >= {"read-0.done", "read-1.done", "write-0.done"}

    monkeypatch.setattr(passes, "_write", real_write)
    monkeypatch.setattr(passes, "_read", lambda *a: pytest.fail("finished shard was redone"))
    resumed = prepare_data(data_config(folder / "*.jsonl*", **WEB), ws)
    monkeypatch.undo()
    fresh = prepare_data(data_config(folder / "*.jsonl*", **WEB), Workspace(tmp_path / "fresh"))
    assert (resumed.path / "manifest.json").read_bytes() == (
        fresh.path / "manifest.json"
    ).read_bytes()
    assert not list((tmp_path / "ws" / "data").glob(".building-*"))


def test_contamination_is_reported_and_optionally_dropped(tmp_path, corpus):
    folder, _ = corpus
    rng = random.Random(0)
    bodies = [_body(rng) for _ in range(40)]
    leaked = " ".join(bodies[7].split()[30:50])  # 20 words straight from web-7
    evals = tmp_path / "evals"
    evals.mkdir()
    (evals / "bench.jsonl").write_text(
        json.dumps({"id": "q1", "text": f"Question: {leaked}?"})
        + "\n"
        + json.dumps({"id": "q2", "text": "an unrelated question about nothing in training"})
        + "\n"
    )
    cfg = data_config(
        folder / "*.jsonl*",
        **WEB,
        contamination={"eval_files": [str(evals / "bench.jsonl")]},
    )
    report = next(
        s
        for s in prepare_data(cfg, Workspace(tmp_path / "a")).manifest["steps"]
        if s["name"] == "contamination"
    )
    (f,) = report["files"]
    assert (f["examples"], f["ngram_overlap"], f["contaminated_fraction"]) == (2, 1, 0.5)
    assert report["train_documents_overlapping"] == 1

    cfg = data_config(
        folder / "*.jsonl*",
        **WEB,
        contamination={"eval_files": [str(evals / "bench.jsonl")], "drop": True},
    )
    dropped = prepare_data(cfg, Workspace(tmp_path / "b"))
    drops = pq.read_table(dropped.path / "drops.parquet").to_pylist()
    assert [d["id"] for d in drops if d["step"] == "contamination"] == ["web-7"]


def test_missing_input_is_a_clear_error(tmp_path):
    cfg = DataConfig(sources=[InputConfig(path=str(tmp_path / "nothing-*.jsonl"))])
    with pytest.raises(DataError, match="matches no file"):
        prepare_data(cfg, Workspace(tmp_path / "ws"))
    assert not (tmp_path / "ws" / "data").exists()


def test_split_depends_only_on_the_unit_key():
    ids = [f"doc-{i}" for i in range(2000)]
    splits = [split_of(i, 0.1, 0) for i in ids]
    assert 0.07 < splits.count("val") / len(ids) < 0.13
    assert splits == [split_of(i, 0.1, 0) for i in reversed(ids)][::-1]
    assert splits != [split_of(i, 0.1, 1) for i in ids]


def test_builtin_corpus_through_the_full_stage(tmp_path):
    cfg = DataConfig.model_validate(
        {"builtin": {"code_docs": 30, "docs_docs": 10, "math_docs": 30}, "workers": 1}
    )
    result = prepare_data(cfg, Workspace(tmp_path))
    c = result.manifest["counts"]
    assert c["records_in"] == 70
    assert (
        c["records_in"] == c["kept"] + sum(d["documents"] for d in c["dropped"]) + c["quarantined"]
    )
    assert np.isclose(
        result.manifest["budget"]["chars"]["exposure"],
        result.manifest["budget"]["chars"]["raw"] / result.manifest["budget"]["chars"]["unique"],
    )


def test_ray_executor_gives_byte_identical_output(tmp_path, corpus):
    ray = pytest.importorskip("ray")
    folder, _ = corpus
    local = prepare_data(data_config(folder / "*.jsonl*", **WEB), Workspace(tmp_path / "local"))
    try:
        on_ray = prepare_data(
            data_config(folder / "*.jsonl*", **WEB, executor="ray", workers=2),
            Workspace(tmp_path / "r"),
        )
    finally:
        ray.shutdown()
    assert on_ray.version == local.version
    names = [f["path"] for f in local.manifest["files"]]
    assert names == [f["path"] for f in on_ray.manifest["files"]]
    for name in [*names, "drops.parquet", "quarantine.parquet", "manifest.json"]:
        assert (local.path / name).read_bytes() == (on_ray.path / name).read_bytes(), name


# -- the held-out test split ----------------------------------------------------------------


def _split_before_test_existed(unit: str, val_fraction: float, seed: int) -> str:
    """``split_of`` as it was before ``test_fraction`` (verbatim), to compare against."""
    import hashlib

    h = hashlib.blake2b(f"{seed}:{unit}".encode(), digest_size=8).digest()
    return "val" if int.from_bytes(h, "big") / 2**64 < val_fraction else "train"


@pytest.mark.parametrize("val_fraction", [0.01, 0.05, 0.2, 0.5, 0.999])
@pytest.mark.parametrize("seed", [0, 7])
def test_test_fraction_zero_keeps_every_units_split(val_fraction, seed):
    units = [f"doc-{i}" for i in range(5000)] + ["", "web-1", "ünïcode/ключ", "a" * 300]
    for unit in units:
        before = _split_before_test_existed(unit, val_fraction, seed)
        assert split_of(unit, val_fraction, seed) == before
        assert split_of(unit, val_fraction, seed, test_fraction=0.0) == before


def test_split_fractions_are_respected_and_deterministic():
    units = [f"cluster-{i}" for i in range(20_000)]
    splits = [split_of(u, 0.1, 3, 0.2) for u in units]
    shares = {s: splits.count(s) / len(units) for s in ("train", "val", "test")}
    assert shares["val"] == pytest.approx(0.1, abs=0.015)
    assert shares["test"] == pytest.approx(0.2, abs=0.015)
    assert shares["train"] == pytest.approx(0.7, abs=0.015)
    assert splits == [split_of(u, 0.1, 3, 0.2) for u in reversed(units)][::-1]
    assert splits != [split_of(u, 0.1, 4, 0.2) for u in units]
    # adding a test split leaves the val set alone and only takes units from train
    without = [split_of(u, 0.1, 3) for u in units]
    for a, b in zip(without, splits, strict=True):
        assert a == b or (a, b) == ("train", "test")


def test_test_fraction_is_validated(tmp_path):
    from pydantic import ValidationError

    assert DataConfig().test_fraction == 0.0
    assert DataConfig(val_fraction=0.3, test_fraction=0.6).test_fraction == 0.6
    with pytest.raises(ValidationError, match="test_fraction"):
        DataConfig(test_fraction=-0.1)
    with pytest.raises(ValidationError, match="test_fraction"):
        DataConfig(test_fraction=1.0)
    with pytest.raises(ValidationError, match=r"val_fraction \+ test_fraction must be < 1"):
        DataConfig(val_fraction=0.5, test_fraction=0.5)
    path = tmp_path / "r.toml"
    path.write_text("[data]\nval_fraction = 0.3\ntest_fraction = 0.8\n")
    with pytest.raises(RecipeError, match=r"data: .*val_fraction \+ test_fraction must be < 1"):
        load_recipe(path)


def test_a_test_split_is_built_per_cluster_and_counted(tmp_path, corpus):
    folder, expected = corpus
    result = prepare_data(
        data_config(folder / "*.jsonl*", **WEB, test_fraction=0.2),
        Workspace(tmp_path / "ws"),
    )
    m, c = result.manifest, result.manifest["counts"]
    assert c["kept"] == expected["kept"]
    assert set(c["by_split"]) == {"train", "val", "test"}
    assert sum(c["by_split"].values()) == c["kept"]
    assert all(n > 0 for n in c["by_split"].values())
    assert m["split"]["test_fraction"] == 0.2 and m["split"]["splits"] == ["train", "val", "test"]
    seen: dict[str, str] = {}
    for f in m["files"]:
        rows = pq.read_table(result.path / f["path"]).to_pylist()
        assert f["path"].startswith(f"{f['split']}-") and f["rows"] == len(rows)
        for row in rows:
            assert split_of(row["cluster_id"], 0.2, 0, 0.2) == f["split"]  # per cluster
            assert row["id"] not in seen  # no document in two splits (or twice in one)
            seen[row["id"]] = f["split"]
    assert len(seen) == c["kept"]
    for split, n in c["by_split"].items():
        assert list(seen.values()).count(split) == n
        domains = [r for r in c["by_split_domain"] if r["split"] == split]
        assert sum(r["documents"] for r in domains) == n
    order = ["train", "val", "test"]
    assert [r["split"] for r in c["by_split_domain"]] == sorted(
        (r["split"] for r in c["by_split_domain"]), key=order.index
    )
    assert [f["split"] for f in m["files"]] == sorted(
        (f["split"] for f in m["files"]), key=["train", "val", "test"].index
    )
    # the val set is the one a build without a test split has: test units come from train
    plain = prepare_data(data_config(folder / "*.jsonl*", **WEB), Workspace(tmp_path / "plain"))
    assert plain.version != result.version
    assert plain.manifest["counts"]["by_split"]["test"] == 0
    assert not [f for f in plain.manifest["files"] if f["split"] == "test"]
    plain_val = {r["id"] for r in _all_rows(plain) if split_of(r["cluster_id"], 0.2, 0) == "val"}
    assert plain_val == {i for i, s in seen.items() if s == "val"}


def test_split_counts_that_disagree_with_the_files_are_not_published(tmp_path, corpus, monkeypatch):
    folder, _ = corpus
    real = manifest.build_manifest

    def lose_the_test_files(**kw):
        return real(**{**kw, "files": [f for f in kw["files"] if f["split"] != "test"]})

    monkeypatch.setattr(pipeline, "build_manifest", lose_the_test_files)
    ws = Workspace(tmp_path / "ws")
    with pytest.raises(manifest.ConservationError, match="documents per split"):
        prepare_data(data_config(folder / "*.jsonl*", **WEB, test_fraction=0.2), ws)
    assert ws.versions("data") == []
