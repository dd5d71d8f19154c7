"""Two builders of one version at the same moment: one builds, the other waits and reuses."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from data_config import data_config
from ledgerlm.data import passes
from ledgerlm.data.pipeline import data_version, prepare_data
from ledgerlm.workspace import MANIFEST, AlreadyPublished, Workspace, atomic_write_json

WORDS = [f"w{i}{c}" for i in range(300) for c in "xyz"]


def _corpus(folder: Path, n: int = 300, seed: int = 0) -> None:
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for part in range(2):
        lines = [
            json.dumps({"id": f"d{part}-{i}", "text": " ".join(rng.choices(WORDS, k=80))})
            for i in range(n // 2)
        ]
        (folder / f"part-{part}.jsonl").write_text("\n".join(lines) + "\n")


class Recorder:
    """A ``Progress`` that keeps the task descriptions and can react to one."""

    def __init__(self, on_task=None) -> None:
        self.tasks: list[str] = []
        self.on_task = on_task

    @contextmanager
    def task(self, description: str, total: float | None = None):
        self.tasks.append(description)
        if self.on_task:
            self.on_task(description)

        class _Task:
            def advance(self, n: float = 1, **fields) -> None:
                pass

        yield _Task()


def _leftovers(ws: Path) -> list[str]:
    return sorted(p.name for kind in ("data", "tokens") for p in (ws / kind).glob(".building-*"))


# -- the lock itself, deterministically ------------------------------------------------


def test_a_second_builder_waits_with_a_message_then_finds_the_version(tmp_path):
    ws = Workspace(tmp_path)
    holding, release = threading.Event(), threading.Event()

    def first() -> None:
        with ws.building("data", "v1", resumable=True) as out:
            holding.set()
            assert release.wait(30)
            atomic_write_json(out / MANIFEST, {"version": "v1"})

    thread = threading.Thread(target=first)
    thread.start()
    assert holding.wait(30)
    progress = Recorder(on_task=lambda _: release.set())  # the wait is shown: let go
    try:
        with ws.building("data", "v1", resumable=True, progress=progress):
            raise AssertionError("the version was built twice")
    except AlreadyPublished:
        pass
    thread.join(30)
    assert progress.tasks == ["data: waiting for another process building v1"]
    assert ws.versions("data") == ["v1"]
    assert _leftovers(tmp_path) == []


def test_prepare_data_waits_for_the_builder_and_returns_its_version_as_reused(
    tmp_path, monkeypatch
):
    folder = tmp_path / "in"
    _corpus(folder, n=40)
    cfg = data_config(folder / "*.jsonl", domain="web")
    ws = Workspace(tmp_path / "ws")
    reading, release = threading.Event(), threading.Event()
    real_read = passes._read

    def slow_read(*args):
        reading.set()
        assert release.wait(30)
        return real_read(*args)

    monkeypatch.setattr(passes, "_read", slow_read)
    built: list = []
    thread = threading.Thread(target=lambda: built.append(prepare_data(cfg, ws)))
    thread.start()
    assert reading.wait(30)  # the first builder holds the lock
    progress = Recorder(on_task=lambda d: release.set() if "waiting" in d else None)
    second = prepare_data(cfg, ws, progress)
    thread.join(60)
    version = data_version(cfg)[0]
    assert progress.tasks == [f"data: waiting for another process building {version}"]
    assert second.reused and not built[0].reused
    assert second.version == built[0].version == version
    assert second.manifest == built[0].manifest
    assert ws.versions("data") == [version]
    assert _leftovers(tmp_path / "ws") == []


# -- real processes ---------------------------------------------------------------------

BUILDER = textwrap.dedent(
    """
    import json, sys, time
    from contextlib import contextmanager
    from pathlib import Path
    from ledgerlm.config import DataConfig, TokenizerConfig
    from ledgerlm.data.pipeline import prepare_data
    from ledgerlm.tokens.shards import build_tokens
    from ledgerlm.workspace import Workspace

    class Recorder:
        def __init__(self):
            self.tasks = []

        @contextmanager
        def task(self, description, total=None):
            self.tasks.append(description)

            class T:
                def advance(self, n=1, **fields):
                    pass

            yield T()

    ws, cfg, tok, go, out = sys.argv[1:]
    Path(out + ".ready").touch()
    deadline = time.monotonic() + 60
    while not Path(go).exists() and time.monotonic() < deadline:
        time.sleep(0.001)
    progress = Recorder()
    data = prepare_data(DataConfig.model_validate_json(cfg), Workspace(ws), progress)
    tokens = build_tokens(
        data, TokenizerConfig.model_validate_json(tok), Workspace(ws), progress
    )
    Path(out).write_text(json.dumps({
        "data": [data.version, data.reused, data.manifest],
        "tokens": [tokens.version, tokens.reused, tokens.manifest],
        "waited": [t for t in progress.tasks if "waiting" in t],
    }))
    """
)


def test_two_processes_build_the_same_data_and_tokens_once(tmp_path):
    folder = tmp_path / "in"
    _corpus(folder)
    cfg = data_config(folder / "*.jsonl", domain="web").model_dump_json()
    tok = json.dumps({"vocab_size": 300, "min_frequency": 2})
    ws = tmp_path / "ws"
    script = tmp_path / "builder.py"
    script.write_text(BUILDER)
    go = tmp_path / "go"
    outs = [tmp_path / f"out-{i}.json" for i in range(2)]
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(ws), cfg, tok, str(go), str(out)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for out in outs
    ]
    deadline = time.monotonic() + 60
    while not all(Path(f"{o}.ready").exists() for o in outs) and time.monotonic() < deadline:
        time.sleep(0.01)
    go.touch()  # both start building at the same moment
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    results = [json.loads(o.read_text()) for o in outs]
    for stage in ("data", "tokens"):
        versions = {r[stage][0] for r in results}
        assert len(versions) == 1
        assert sorted(r[stage][1] for r in results) == [False, True]  # one built, one reused
        assert results[0][stage][2] == results[1][stage][2]  # identical manifests
        assert Workspace(ws).versions(stage) == sorted(versions)
        assert sorted(p.name for p in (ws / stage).iterdir()) == sorted(versions)
    assert _leftovers(ws) == []
    for r in results:  # a process that waited said so
        assert all("waiting for another process building" in w for w in r["waited"])


def test_two_cli_prepares_started_together_both_succeed(tmp_path):
    _corpus(tmp_path / "in")
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(
        '[data]\nsources = [{path = "in/*.jsonl", domain = "web"}]\nworkers = 1\n'
        "val_fraction = 0.2\n"
    )
    exe = Path(sys.executable).with_name("ledgerlm")
    env = {**os.environ, "COLUMNS": "200"}
    procs = [
        subprocess.Popen(
            [str(exe), "data", "prepare", str(recipe), "-w", str(tmp_path / "ws")],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, f"{out}\n{err}"
    assert sum("(reused)" in out for out, _ in outputs) == 1
    assert len(Workspace(tmp_path / "ws").versions("data")) == 1
    assert _leftovers(tmp_path / "ws") == []
