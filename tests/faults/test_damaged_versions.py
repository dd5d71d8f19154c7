"""Damaged data and tokens versions: every reuse checks a version against its manifest
before anything trains, and each kind of damage is one error line naming the file and
what differs (no traceback), the run marked failed. A version folder without its
manifest is unpublished and rebuilt; ``data prepare --repair`` replaces a damaged one.

Each case damages a copy of one workspace built once, then runs the tiny recipe in this
process through the CLI (it fails at the check, before the model is built)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from cli_runner import TINY
from ledgerlm.config import load_recipe
from ledgerlm.data.pipeline import prepare_data
from ledgerlm.ledger.store import Ledger
from ledgerlm.tokens.shards import build_tokens
from ledgerlm.workspace import Workspace, read_json

SHORT = ["--set", "train.max_steps=2", "--set", "eval.every_steps=2"]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """A workspace holding the tiny recipe's data and tokens versions."""
    ws = tmp_path_factory.mktemp("built") / "ws"
    recipe = load_recipe(TINY)
    data = prepare_data(recipe.data_stage(), Workspace(ws))
    build_tokens(data, recipe.tokenizer, Workspace(ws))
    return ws


@pytest.fixture
def ws(built, tmp_path) -> SimpleNamespace:
    """A copy of ``built`` to damage: its root, data and tokens version folders."""
    root = tmp_path / "ws"
    shutil.copytree(built, root)
    (data,) = (root / "data").iterdir()
    (tokens,) = (root / "tokens").iterdir()
    return SimpleNamespace(root=root, data=data, tokens=tokens)


def _cli(*args: str) -> SimpleNamespace:
    from ledgerlm.cli.main import app

    result = CliRunner().invoke(app, [str(a) for a in args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception  # what would have been a traceback
    return SimpleNamespace(returncode=result.exit_code, stdout=result.stdout, stderr=result.stderr)


def _run(ws: SimpleNamespace, *flags: str) -> SimpleNamespace:
    return _cli("run", TINY, "-w", ws.root, *SHORT, *flags)


def _one_line(proc: SimpleNamespace, file: Path, *needles: str) -> str:
    """The run's single error line names ``file`` and says each of ``needles``; the run
    is failed with that error as its event."""
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr
    line = proc.stderr.strip()
    assert f"error: {file}: " in line, line
    for needle in needles:
        assert needle in line, line
    assert f"--repair {file.parent.name}" in line  # how to replace it
    with Ledger(file.parents[2] / "ledger.db") as ledger:
        run = ledger.list_runs()[0]
        summary = ledger.run_summary(run["id"])
    assert run["status"] == "failed"
    assert any(e["kind"] == "error" and str(file) in e["message"] for e in summary["events"])
    return line


def _manifest(folder: Path, change) -> None:
    path = folder / "manifest.json"
    manifest = read_json(path)
    change(manifest)
    path.write_text(json.dumps(manifest, indent=2))


def _poke(path: Path, at: int, data: bytes) -> None:
    """Overwrite bytes in place: the file keeps its size."""
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(data)


# -- token shards --------------------------------------------------------------------


def test_a_truncated_val_shard_is_refused_not_scored_on_2_percent(ws):
    (ws.tokens / "val.bin").write_bytes((ws.tokens / "val.bin").read_bytes()[:100])
    want = (read_json(ws.tokens / "manifest.json")["files"][1]["tokens"]) * 2
    _one_line(_run(ws), ws.tokens / "val.bin", f"100 bytes, manifest says {want:,}")


def test_a_halved_train_shard_is_refused(ws):
    path = ws.tokens / "train.bin"
    size = path.stat().st_size
    path.write_bytes(path.read_bytes()[: size // 2])
    _one_line(_run(ws), path, f"{size // 2:,} bytes, manifest says {size:,}")


def test_a_shard_of_an_odd_size_is_named(ws):
    """Was: ``Size of available data is not a multiple of the data-type size.``"""
    (ws.tokens / "val.bin").write_bytes(b"\0" * 101)
    _one_line(_run(ws, "--no-verify"), ws.tokens / "val.bin", "101 bytes, manifest says")


def test_an_empty_shard_is_named(ws):
    """Was: ``cannot mmap an empty file``."""
    (ws.tokens / "val.bin").write_bytes(b"")
    _one_line(_run(ws, "--no-verify"), ws.tokens / "val.bin", "0 bytes, manifest says")


def test_ids_changed_inside_the_vocabulary_are_found_by_the_hash(ws):
    _poke(ws.tokens / "val.bin", 200, (5).to_bytes(2, "little") * 4)
    _one_line(_run(ws), ws.tokens / "val.bin", "content differs from the sha256")


def test_without_the_hash_ids_inside_the_vocabulary_go_unseen_and_the_ledger_says_so(ws):
    _poke(ws.tokens / "val.bin", 200, (5).to_bytes(2, "little") * 4)
    proc = _run(ws, "--no-verify")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with Ledger(ws.root / "ledger.db") as ledger:
        summary = ledger.run_summary(ledger.list_runs()[0]["id"])
    (event,) = [e for e in summary["events"] if e["kind"] == "versions_verified"]
    found = json.loads(event["message"])
    assert found["tokens"]["hash"] is None and found["data"]["hash"] is None
    assert found["tokens"]["max_token"] < found["tokens"]["vocab_size"] == 512


@pytest.mark.parametrize("flags", [[], ["--no-verify"]], ids=["verify", "no-verify"])
def test_a_token_id_outside_the_vocabulary_is_found_at_load_not_in_the_model(ws, flags):
    """Was: ``IndexError: index out of range in self`` from the embedding."""
    _poke(ws.tokens / "train.bin", 200, (65535).to_bytes(2, "little"))
    _one_line(
        _run(ws, *flags),
        ws.tokens / "train.bin",
        "token 100 is id 65,535, outside the vocabulary of 512",
    )


def test_a_damaged_index_is_named(ws):
    (ws.tokens / "index.parquet").write_bytes(b"PAR1" + b"\0" * 40)
    _one_line(_run(ws, "--no-verify"), ws.tokens / "index.parquet", "bytes, manifest says")


# -- the tokenizer ---------------------------------------------------------------------


def test_two_tokens_swapped_in_the_tokenizer_are_found_by_the_hash(ws):
    path = ws.tokens / "tokenizer.json"
    text = path.read_text()
    vocab = json.loads(text)["model"]["vocab"]
    i = next(i for i in range(300, 500) if all(f'"{t}": {j},' in text for t, j in _pair(vocab, i)))
    (a, _), (b, _) = _pair(vocab, i)
    # the same size: the two tokens trade ids
    swapped = text.replace(f'"{a}": {i},', "\0").replace(f'"{b}": {i + 1},', f'"{b}": {i},')
    path.write_text(swapped.replace("\0", f'"{a}": {i + 1},'))
    assert path.stat().st_size == len(text.encode())
    _one_line(_run(ws), path, "content differs from the sha256")


def _pair(vocab: dict[str, int], i: int) -> list[tuple[str, int]]:
    by_id = {j: t for t, j in vocab.items()}
    return [(by_id[i], i), (by_id[i + 1], i + 1)]


def test_a_broken_tokenizer_is_named(ws):
    """Was: a tokenizers ``Exception`` traceback."""
    path = ws.tokens / "tokenizer.json"
    _poke(path, 10, b"x" * 20)
    _one_line(_run(ws, "--no-verify"), path, "not a tokenizer (")


# -- manifests -------------------------------------------------------------------------


def test_tokens_counts_multiplied_by_ten_are_refused(ws):
    def times_ten(m):
        for c in m["counts"]:
            c["tokens"] *= 10
            c["documents"] *= 10

    _manifest(ws.tokens, times_ten)
    train = read_json(ws.tokens / "manifest.json")["files"][0]["tokens"]
    _one_line(
        _run(ws),
        ws.tokens / "manifest.json",
        f"counts say {train * 10:,} train tokens, its shards hold {train:,}",
    )


def test_data_counts_multiplied_by_ten_are_refused(ws):
    def times_ten(m):
        c = m["counts"]
        c["records_in"] *= 10
        c["kept"] *= 10
        c["by_split"] = {k: v * 10 for k, v in c["by_split"].items()}

    _manifest(ws.data, times_ten)
    train = read_json(ws.data / "manifest.json")["counts"]["by_split"]["train"] // 10
    _one_line(
        _run(ws),
        ws.data / "manifest.json",
        f"counts say {train * 10:,} train documents, its files hold {train:,}",
    )


@pytest.mark.parametrize("kind", ["data", "tokens"])
def test_a_manifest_without_files_is_named(ws, kind):
    """Was: ``KeyError: 'files'``."""
    folder = getattr(ws, kind)
    _manifest(folder, lambda m: m.pop("files"))
    _one_line(_run(ws), folder / "manifest.json", "no 'files' list")


@pytest.mark.parametrize("kind", ["data", "tokens"])
def test_a_manifest_that_is_not_json_is_named(ws, kind):
    """Was: ``Expecting value: line 2 column 1 (char 1)``, naming no file."""
    folder = getattr(ws, kind)
    (folder / "manifest.json").write_text("\n")
    _one_line(
        _run(ws), folder / "manifest.json", "not valid JSON (Expecting value: line 2 column 1"
    )


# -- data shards -----------------------------------------------------------------------


@pytest.mark.parametrize("flags", [[], ["--no-verify"]], ids=["verify", "no-verify"])
def test_a_damaged_parquet_shard_is_named(ws, flags):
    """Was: ``Couldn't deserialize thrift``, naming no file."""
    (path,) = ws.data.glob("train-*.parquet")
    _poke(path, path.stat().st_size - 40, b"garbage" * 4)
    _one_line(_run(ws, *flags), path, "not a readable Parquet file (Couldn't deserialize thrift")


def test_a_changed_data_shard_of_the_same_size_is_found_by_the_hash(ws):
    (path,) = ws.data.glob("val-*.parquet")
    _poke(path, 8, b"\0\0\0\0")  # inside the first page: the footer still reads
    _one_line(_run(ws), path, "content differs from the sha256")


def test_data_prepare_verifies_a_reused_version_and_no_verify_skips_only_the_hash(ws):
    (path,) = ws.data.glob("val-*.parquet")
    _poke(path, 8, b"\0\0\0\0")
    proc = _cli("data", "prepare", TINY, "-w", ws.root)
    assert proc.returncode == 2 and f"{path}: content differs" in proc.stderr, proc.stderr
    proc = _cli("data", "prepare", TINY, "-w", ws.root, "--no-verify")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "(reused)" in proc.stdout and "sizes and counts (--no-verify)" in proc.stdout
    path.write_bytes(path.read_bytes()[:-1])  # a size the footer no longer fits
    proc = _cli("data", "prepare", TINY, "-w", ws.root, "--no-verify")
    assert proc.returncode == 2 and str(path) in proc.stderr, proc.stderr


# -- published, rebuilt, repaired --------------------------------------------------------


@pytest.mark.parametrize("kind", ["data", "tokens"])
def test_a_version_without_its_manifest_is_rebuilt(ws, kind):
    """Was, for tokens: ``.building-...: Directory not empty`` on every rerun."""
    folder = getattr(ws, kind)
    (folder / "manifest.json").unlink()
    proc = _run(ws)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (folder / "manifest.json").is_file()
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".")]
    with Ledger(ws.root / "ledger.db") as ledger:
        run = ledger.list_runs()[0]
    assert run[f"{kind}_version"] == folder.name  # the same version, built again
    from ledgerlm.tokens.verify import verify_tokens

    verify_tokens(ws.tokens, read_json(ws.tokens / "manifest.json"))  # rebuilt whole


def test_repair_replaces_a_damaged_version_and_the_next_run_reuses_it(ws, built):
    (ws.tokens / "val.bin").write_bytes(b"\0" * 100)
    prefix = ws.tokens.name[:6]
    proc = _cli("data", "prepare", TINY, "-w", ws.root, "--repair", prefix)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"tokens version {ws.tokens.name} (built" in proc.stdout
    assert (ws.tokens / "val.bin").read_bytes() == (
        built / "tokens" / ws.tokens.name / "val.bin"
    ).read_bytes()
    assert _run(ws).returncode == 0


def test_repair_refuses_a_version_the_recipe_does_not_name(ws):
    proc = _cli("data", "prepare", TINY, "-w", ws.root, "--repair", "zz")
    assert proc.returncode == 2 and "repair 'zz'" in proc.stderr
    assert ws.data.name in proc.stderr and ws.tokens.name in proc.stderr


def test_every_run_records_what_was_verified_inside_its_prep_and_tokenize_phases(ws):
    proc = _run(ws)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with Ledger(ws.root / "ledger.db") as ledger:
        summary = ledger.run_summary(ledger.list_runs()[0]["id"])
    (event,) = [e for e in summary["events"] if e["kind"] == "versions_verified"]
    found = json.loads(event["message"])
    assert found["data"]["version"] == ws.data.name and found["data"]["reused"]
    assert found["tokens"]["hash"] == found["data"]["hash"] == "sha256"
    assert found["tokens"]["files"] == 5  # three shards, the tokenizer and the index
    phases = {p["kind"]: p for p in summary["phases"] if p["kind"] in ("prep", "tokenize")}
    for kind, phase in (("data", "prep"), ("tokens", "tokenize")):
        checked = phases[phase]["detail"]["verified"]
        assert checked == {k: found[kind][k] for k in checked}  # the same check, on its phase
        assert 0 < checked["seconds"] <= phases[phase]["seconds"]


def test_a_version_published_before_sizes_were_recorded_is_still_verified(ws):
    """Manifests written before this check held sha256 and counts only: sizes come from
    the token counts, and the hash is the sha256 they hold."""

    def older(m):
        for f in m["files"]:
            f.pop("bytes")
        if "index" in m:  # a tokens manifest
            m.pop("index")
            m["tokenizer"].pop("bytes")

    _manifest(ws.tokens, older)
    _manifest(ws.data, older)
    assert _run(ws).returncode == 0
    _poke(ws.tokens / "val.bin", 200, (5).to_bytes(2, "little") * 4)
    _one_line(_run(ws), ws.tokens / "val.bin", "content differs from the sha256")
