"""A validation (and test) set fixed by the user: ``[eval] sources`` / ``test_sources``.

The fixed set is scored as given (no filter, dedup or split touches it), the training
sources no longer give it documents, and training text that overlaps it is counted by
the contamination check (dropped with ``data.contamination.drop``).
"""

from __future__ import annotations

import json
import random

import pyarrow.parquet as pq
import pytest

from cli_runner import TINY, ledgerlm
from ledgerlm.config import DataConfig, Recipe
from ledgerlm.data.pipeline import DataError, data_version, prepare_data
from ledgerlm.workspace import Workspace

WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "eta",
    "theta",
    "iota",
    "kappa",
    "lambda",
    "mu",
    "nu",
    "xi",
    "pi",
]
LEAK = "the quick brown fox jumps over the lazy dog near the quiet river bank at dawn"


def _train(tmp_path, n=60):
    rng = random.Random(0)
    rows = [
        {"id": f"t{i}", "text": " ".join(rng.choice(WORDS) for _ in range(40)), "domain": "web"}
        for i in range(n)
    ]
    rows[7]["text"] += " " + LEAK  # a training document holding a validation sentence
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _fixed(tmp_path, name="val.jsonl", texts=None):
    texts = texts or [LEAK, "short", "short", "another held out sentence of our own words"]
    path = tmp_path / name
    path.write_text(
        "".join(json.dumps({"id": f"v{i}", "text": t}) + "\n" for i, t in enumerate(texts))
    )
    return path


def _cfg(tmp_path, **eval_keys) -> DataConfig:
    recipe = Recipe.model_validate(
        {
            "data": {"sources": [str(_train(tmp_path))], "near_dedup": {"enabled": False}},
            "eval": eval_keys,
        }
    )
    return recipe.data_stage()


def _split(result, split):
    rows = []
    for f in result.manifest["files"]:
        if f["split"] == split:
            rows += pq.read_table(result.path / f["path"]).to_pylist()
    return rows


def test_the_fixed_set_is_the_validation_split_as_given(tmp_path):
    cfg = _cfg(tmp_path, sources=[str(_fixed(tmp_path))])
    result = prepare_data(cfg, Workspace(tmp_path / "ws"), base=tmp_path)
    val = _split(result, "val")
    # every record, in order, unfiltered (a five-character text) and not deduplicated
    assert [(r["id"], r["text"]) for r in val] == [
        ("v0", LEAK),
        ("v1", "short"),
        ("v2", "short"),
        ("v3", "another held out sentence of our own words"),
    ]
    counts = result.manifest["counts"]
    assert counts["by_split"]["val"] == 4 and counts["fixed"] == {"val": 4}
    # nothing of the training sources went to val: every kept training document trains
    assert counts["by_split"]["train"] == counts["kept"]
    assert result.manifest["split"]["val_fraction"] == 0.0
    assert result.manifest["split"]["fixed"]["val"]["key"] == "eval.sources"
    # the training document holding a validation sentence is found, and kept by default
    (report,) = [f for f in result.manifest["steps"] if f["name"] == "contamination"]
    (fixed,) = [f for f in report["files"] if f["eval_file"] == "eval.sources"]
    assert fixed["examples"] == 4 and fixed["contaminated"] == 1
    assert report["train_documents_overlapping"] == 1
    assert "t7" in {r["id"] for r in _split(result, "train")}


def test_overlapping_training_text_is_dropped_on_request(tmp_path):
    cfg = _cfg(tmp_path, sources=[str(_fixed(tmp_path))])
    cfg = cfg.model_copy(
        update={"contamination": cfg.contamination.model_copy(update={"drop": True})}
    )
    result = prepare_data(cfg, Workspace(tmp_path / "ws"), base=tmp_path)
    assert "t7" not in {r["id"] for r in _split(result, "train")}
    dropped = {(d["step"], d["documents"]) for d in result.manifest["counts"]["dropped"]}
    assert ("contamination", 1) in dropped
    assert len(_split(result, "val")) == 4  # the fixed set itself is never dropped from


def test_a_fixed_test_set_beside_a_drawn_validation_split(tmp_path):
    cfg = _cfg(tmp_path, test_sources=[str(_fixed(tmp_path, "test.jsonl"))])
    cfg = cfg.model_copy(update={"test_fraction": 0.2})  # replaced by the fixed set
    result = prepare_data(cfg, Workspace(tmp_path / "ws"), base=tmp_path)
    counts = result.manifest["counts"]
    assert counts["fixed"] == {"test": 4} and counts["by_split"]["test"] == 4
    assert counts["by_split"]["val"] > 0  # still drawn with val_fraction
    assert counts["by_split"]["train"] + counts["by_split"]["val"] == counts["kept"]
    assert result.manifest["split"]["test_fraction"] == 0.0


def test_the_fixed_set_is_part_of_the_version(tmp_path):
    plain = _cfg(tmp_path)
    assert "val_sources" not in plain.model_dump()  # recipes without one keep their ids
    fixed = _fixed(tmp_path)
    with_set = _cfg(tmp_path, sources=[str(fixed)])
    first = data_version(with_set, tmp_path)[0]
    assert first != data_version(plain, tmp_path)[0]
    fixed.write_text(fixed.read_text().replace("short", "shorter"))
    assert data_version(with_set, tmp_path)[0] != first  # its content, not only its name


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"id": "v0", "text": "fine"}\n{"id": "v1", "text": \n', "val.jsonl:2: "),
        ("", "eval.sources (val.jsonl) holds no document"),
    ],
)
def test_a_fixed_set_that_cannot_be_read_whole_stops_the_build(tmp_path, content, message):
    (tmp_path / "val.jsonl").write_text(content)
    cfg = _cfg(tmp_path, sources=["val.jsonl"])
    ws = Workspace(tmp_path / "ws")
    with pytest.raises(DataError, match=message.replace("(", r"\(").replace(")", r"\)")):
        prepare_data(cfg, ws, base=tmp_path)
    assert not (tmp_path / "ws" / "data").exists() or not any(
        p for p in (tmp_path / "ws" / "data").iterdir() if not p.name.startswith(".")
    )


def test_a_missing_fixed_set_is_named_before_anything_is_written(tmp_path):
    proc = ledgerlm(
        "run", str(TINY), "-w", str(tmp_path / "ws"), "--set", 'eval.sources=["nowhere.jsonl"]',
        check=False,
    )  # fmt: skip
    assert proc.returncode == 2 and "nowhere.jsonl" in proc.stderr
    assert not (tmp_path / "ws").exists()


def test_a_run_scores_the_fixed_validation_set(tmp_path):
    texts = [" ".join(random.Random(i).choice(WORDS) for _ in range(60)) for i in range(11)]
    val, train = _fixed(tmp_path, texts=[*texts, LEAK]), _train(tmp_path)
    ws = tmp_path / "ws"
    ledgerlm("run", str(TINY), "-w", str(ws), "--set", f'data.sources=["{train}"]',
             "--set", f'eval.sources=["{val}"]', "--set", "tokenizer.vocab_size=300",
             "--set", "train.max_steps=4", "--set", "eval.every_steps=2")  # fmt: skip
    (tokens,) = (ws / "tokens").iterdir()
    counts = json.loads((tokens / "manifest.json").read_text())["counts"]
    # records without a domain field get the default domain
    assert [(c["split"], c["domain"], c["documents"]) for c in counts] == [
        ("train", "web", 60),
        ("val", "default", 12),
    ]
    shown = json.loads(ledgerlm("ledger", "show", "tiny", "-w", str(ws), "--json").stdout)
    evaluations = shown["evaluations"]
    assert [e["step"] for e in evaluations] == [2, 4]
    assert all(e["metrics"]["loss/default"] == e["metrics"]["loss"] for e in evaluations)
    assert all(set(e["consumed"]) == {"web"} for e in evaluations)  # trained domains only
    (event,) = [e for e in shown["events"] if e["kind"] == "contamination"]
    assert event["message"].startswith("1/12 examples of eval.sources overlap")


def test_data_prepare_warns_of_a_contaminated_fixed_set(tmp_path):
    train, val = _train(tmp_path), _fixed(tmp_path)
    recipe = tmp_path / "r.toml"
    recipe.write_text(
        f'[data]\nsources = ["{train}"]\n[data.near_dedup]\nenabled = false\n'
        f'[eval]\nsources = ["{val}"]\n'
    )
    ws = str(tmp_path / "ws")
    out = ledgerlm("data", "prepare", str(recipe), "-w", ws).stdout
    assert "warning: 1/4 examples of eval.sources overlap the training text" in " ".join(
        out.split()
    )
    (version,) = (tmp_path / "ws" / "data").iterdir()
    shown = ledgerlm("data", "inspect", version.name, "-w", ws).stdout
    assert f"val: fixed by eval.sources ({val})" in shown
    assert "contamination eval.sources: 1/4 examples (25.0%)" in shown
