"""Every table the CLI prints, read at 80 columns as a new user reads it: through a
pseudo terminal of 80 columns and piped (not a terminal: rich assumes 80). No line is
wider, no cell is cut (no ellipsis), and every value (a whole run id, a date and time,
every number) is whole on one line; an id longer than the console folds onto the next
line, and is whole once the lines are joined.

The runs are real short runs of the tiny recipe named as sweep and search runs are:
one id of 54 characters, one of 87."""

from __future__ import annotations

import csv
import json
import os
import pty
import re
import select
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from fcntl import ioctl
from pathlib import Path
from termios import TIOCSWINSZ

import numpy as np
import pytest

from cli_runner import ledgerlm
from e2e.test_scale_expert import write_tuned_csv
from ledgerlm.cli.ui import fmt_seconds
from ledgerlm.lab.status import with_liveness
from ledgerlm.ledger.compare import compare_runs
from ledgerlm.ledger.mixture import DOMAIN_COUNTER, realised
from ledgerlm.ledger.store import Ledger
from ledgerlm.workspace import Workspace

from .conftest import TINY

WIDTH = 80
SWEEP = "tiny-sweep-3f9a1c-N200k-D409k-lr3e-3"  # its run id: 57 characters
SEARCH = "tiny-mix-5be07d-t07-proxy-n_layers1-max_steps40-natural-code-docs-math"  # 91
MODES = pytest.mark.parametrize("tty", [True, False], ids=["tty", "piped"])
ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")  # CSI, OSC


def ledgerlm_at(*args: str, tty: bool = True) -> str:
    """What the user reads from ``ledgerlm ARGS`` at 80 columns: through a pseudo
    terminal of that size (``tty``: rich sees a terminal, colours and all, returned
    without their escape codes) or piped (not a terminal); a failure raises. Progress
    goes to stderr (a file here); no periodic progress lines."""
    exe = Path(sys.executable).with_name("ledgerlm")
    env = {**os.environ, "COLUMNS": str(WIDTH), "TERM": "xterm-256color",
           "LEDGERLM_PROGRESS_SECONDS": "0"}  # fmt: skip
    env.pop("NO_COLOR", None)
    with tempfile.TemporaryFile() as err:
        if tty:
            out, code = _through_a_terminal([str(exe), *args], env, err)
        else:
            proc = subprocess.run(
                [str(exe), *args], stdout=subprocess.PIPE, stderr=err, env=env, timeout=600
            )
            out, code = proc.stdout, proc.returncode
        err.seek(0)
        stderr = err.read().decode(errors="replace")
    text = ESCAPES.sub("", out.decode().replace("\r\n", "\n"))
    if code != 0:
        raise AssertionError(f"ledgerlm {' '.join(args)} failed ({code}):\n{text}\n{stderr}")
    return text


def _through_a_terminal(argv: list[str], env: dict, err) -> tuple[bytes, int]:
    main, child = pty.openpty()
    ioctl(child, TIOCSWINSZ, struct.pack("HHHH", 24, WIDTH, 0, 0))
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=child, stderr=err, env=env)
    os.close(child)
    chunks, deadline = [], time.monotonic() + 600
    while time.monotonic() < deadline:
        if not select.select([main], [], [], 1.0)[0]:
            continue
        try:
            chunk = os.read(main, 1 << 16)
        except OSError:  # EIO: the command closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(main)
    return b"".join(chunks), proc.wait(timeout=60)


@dataclass
class Runs:
    ws: Path
    printed: dict[bool, tuple[str, str]]  # tty or not: (run id, what `run` printed)

    def summary(self, run_id: str) -> dict:
        with Ledger(self.ws / "ledger.db") as ledger:
            return ledger.run_summary(run_id)

    def ids(self) -> list[str]:
        return [self.printed[True][0], self.printed[False][0]]


@pytest.fixture(scope="session")
def runs(tmp_path_factory) -> Runs:
    """Two runs in one ledger: the first printed through a terminal (it reaches the
    target), the second piped (40 updates, another seed: it does not)."""
    ws = tmp_path_factory.mktemp("at80") / "ws"
    shown = ledgerlm_at("run", str(TINY), "-w", str(ws), "--set", f"name={SWEEP}")
    piped = ledgerlm_at(
        "run", str(TINY), "-w", str(ws), "--set", f"name={SEARCH}",
        "--set", "train.max_steps=40", "--set", "train.seed=1", tty=False,
    )  # fmt: skip
    with Ledger(ws / "ledger.db") as ledger:
        by_name = {r["name"]: r["id"] for r in ledger.list_runs()}
    return Runs(ws, {True: (by_name[SWEEP], shown), False: (by_name[SEARCH], piped)})


def readable(text: str, values=(), prose: tuple[str, ...] = ()) -> None:
    """No line wider than 80 columns (but prose printed as one line, for the terminal to
    wrap: ``prose`` prefixes), no ellipsis, every value whole: on one line when it fits
    in 80 columns, else in the lines joined."""
    lines = text.splitlines()
    wide = [line for line in lines if len(line) > WIDTH and not line.startswith(prose)]
    assert not wide, "\n".join(wide)
    assert "…" not in text, text
    joined = "".join(line.strip() for line in lines)
    for value in values:
        value = str(value)
        if len(value) <= WIDTH:
            assert any(value in line for line in lines), f"{value!r} not whole in:\n{text}"
        else:
            assert value in joined, f"{value!r} not in:\n{text}"


def run_values(summary: dict, runs_shown: int | None = None) -> list[str]:
    """What the run tables must show whole: counters, the mixture, evaluations, phases."""
    values = [summary["run"]["id"]]
    values += [f"{v:,}" for k, v in summary["counters"].items() if not k.startswith(DOMAIN_COUNTER)]
    for r in realised(summary):  # (a natural mixture has every figure)
        values += [r["domain"], f"{r['weight']:.4f}", f"{r['tokens']:,}", f"{r['share']:.4f}"]
        values += [f"{r['pool']:,.0f}", f"{r['planned_tokens']:,.0f}"]
    for e in summary["evaluations"][-(runs_shown or len(summary["evaluations"])) :]:
        values += [f"{e['tokens']:,}", e["snapshot"][:10]]
        shown = [k for k in e["metrics"] if k in ("loss", "bpb") or k.startswith("loss/")]
        values += [f"{e['metrics'][k]:.4f}" for k in shown]
    values += [fmt_seconds(s) for s in summary["phase_totals"].values()]
    return values


@MODES
def test_run_prints_its_tables_whole(runs, tty):
    run_id, printed = runs.printed[tty]
    summary = runs.summary(run_id)
    ws = Workspace(runs.ws)
    data = ws.manifest("data", summary["run"]["data_version"])
    tokens = ws.manifest("tokens", summary["run"]["tokens_version"])
    values = [data["version"], tokens["version"], f"{data['counts']['records_in']:,}"]
    by_split: dict[str, int] = {}
    for row in tokens["counts"]:
        by_split[row["split"]] = by_split.get(row["split"], 0) + row["tokens"]
    values += [f"{n:,} tokens" for n in by_split.values()]
    readable(printed, [*values, *run_values(summary, runs_shown=8)])
    for title in ("data funnel", "counters", "evaluations", "time per phase", "mixture plan"):
        assert title in printed


@MODES
def test_ledger_list(runs, tty):
    out = ledgerlm_at("ledger", "list", "-w", str(runs.ws), tty=tty)
    with Ledger(runs.ws / "ledger.db") as ledger:
        listed = with_liveness(Workspace(runs.ws), ledger.list_runs())
    values = []
    for r in listed:
        created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["created_at"]))
        values += [r["id"], created, r["status"], r["data_version"][:12], r["tokens_version"][:12]]
    readable(out, values)


@MODES
@pytest.mark.parametrize("which", [True, False], ids=["sweep-id", "search-id"])
def test_ledger_show(runs, tty, which):
    run_id = runs.printed[which][0]
    out = ledgerlm_at("ledger", "show", run_id, "-w", str(runs.ws), tty=tty)
    readable(out, run_values(runs.summary(run_id)), prose=("events:", "  step "))


@MODES
def test_ledger_show_lists_the_search_on_the_bill(tmp_path, tty):
    """A run charged a study of trials of every status (runs written through the
    ledger's API): the search's table, each group's count, wall time and device-hours."""
    from ledgerlm.cli.render import device_hours
    from ledgerlm.lab.searches import charge, charge_search, trial_summaries
    from ledgerlm.ledger.search import search_rows
    from seed_ledger import seed_run

    study = SEARCH[:-24]  # a study id of 67 characters
    with Ledger(tmp_path / "ledger.db") as ledger:
        trials = []
        for i, status in enumerate(("reached", "not reached", "pruned", "failed", "reached")):
            trials.append(seed_run(ledger, f"{study}-t{i:02d}", steps=1000 * (i + 1),
                                   sec_per_step=0.01, cross_step=1500, finish=status))  # fmt: skip
        found = charge("tune", study, trials, trial_summaries(ledger, trials), 800.0)
        run = seed_run(ledger, "tiny", steps=1000, sec_per_step=0.01, cross_step=500)
        charge_search(ledger, run, found)
    out = ledgerlm_at("ledger", "show", run, "-w", str(tmp_path), tty=tty)
    values = [f"tune study {study}: 5 trials"]
    for row in search_rows(found["bill"]):
        values += [row["group"], fmt_seconds(row["seconds"]), device_hours(row["device_hours"])]
    readable(out, values, prose=("events:", "  step ", "tune study "))
    assert "outside trials" in out and "not reached" in out


@MODES
def test_ledger_compare(runs, tty):
    out = ledgerlm_at("ledger", "compare", *runs.ids(), "-w", str(runs.ws), tty=tty)
    result = compare_runs([runs.summary(i) for i in runs.ids()])
    values = []
    for f in result["runs"]:
        values += [f["id"], f"{f['train_step_seconds']:.4f}"]
        shares = [f["shares"].get(k) for k in ("prep", "tokenize", "eval", "checkpoint")]
        values += [f"{100 * v:.1f}%" for v in shares if v is not None]
        if f["reached"]:
            values += [fmt_seconds(f["time_to_target"]), f"{f['tokens_to_target']:,}"]
        else:
            values += ["not reached", f"{f['final_value']:.4f}"]
    readable(out, values)


@MODES
def test_ledger_steps(runs, tty):
    run_id = runs.printed[False][0]
    out = ledgerlm_at("ledger", "steps", run_id, "-w", str(runs.ws), tty=tty)
    with Ledger(runs.ws / "ledger.db") as ledger:
        rows = ledger.steps(run_id)
    values = [run_id]
    for r in rows:
        values += [
            f"{r['tokens']:,}",
            f"{r['loss']:.4f}",
            f"{r['grad_norm']:.3f}",
            f"{r['lr']:.2e}",
        ]
    readable(out, values)


@pytest.fixture(scope="session")
def own_data(tmp_path_factory) -> tuple[Path, str]:
    """A data version of two JSONL files with long names, some documents dropped as
    too short: the filter table's rows name their source."""
    root = tmp_path_factory.mktemp("own")
    rng = np.random.default_rng(0)
    letters = list("abcdefghijklmnopqrstuvwxyz")
    words = ["".join(rng.choice(letters, n)) for n in rng.integers(2, 9, 3000)]
    names = ["python-library-reference-3.12-html-export-2024-06-01",
             "news-crawl-en-2023-q4-deduplicated-sample"]  # fmt: skip
    for name, short in zip(names, (5, 1), strict=True):
        docs = [" ".join(rng.choice(words, 60)) for _ in range(30)] + ["tiny"] * short
        (root / f"{name}.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    recipe = root / "own.toml"
    sources = ", ".join(f'"{root / n}.jsonl"' for n in names)
    recipe.write_text(
        f'name = "own"\n[data]\nsources = [{sources}]\nsplit = "document"\nval_fraction = 0.3\n'
    )  # a document's split is drawn from its id, which holds the temporary path: at 0.1
    # none of the 60 was drawn for val under some paths (0.9^60 = 0.2%), at 0.3 5e-10
    ledgerlm("data", "prepare", str(recipe), "-w", str(root / "ws"))
    (version,) = (root / "ws" / "data").iterdir()
    return root / "ws", version.name


@MODES
def test_data_inspect_names_every_source(own_data, tty):
    ws, version = own_data
    out = ledgerlm_at("data", "inspect", version, "-w", str(ws), tty=tty)
    groups = next(
        s for s in Workspace(ws).manifest("data", version)["steps"] if s["name"] == "filters"
    )
    dropped = [g for g in groups["groups"] if g["docs_dropped"]]
    assert len(dropped) == 2
    values = [version]
    for g in dropped:
        values += [g["source"], f"{g['docs_dropped']:,}/{g['docs_seen']:,}"]
    readable(out, values)


@MODES
def test_data_inspect_tokens_consumed_by_runs(runs, tty):
    version = runs.summary(runs.ids()[0])["run"]["data_version"]
    out = ledgerlm_at("data", "inspect", version, "-w", str(runs.ws), tty=tty)
    values = [version, *runs.ids()]
    for run_id in runs.ids():
        values += [f"{r['tokens']:,}" for r in realised(runs.summary(run_id))]
    readable(out, values)


@MODES
def test_mix_plan(runs, tty):
    out = ledgerlm_at("mix", "plan", str(TINY), "-w", str(runs.ws), tty=tty)
    planned = json.loads(ledgerlm("mix", "plan", str(TINY), "-w", str(runs.ws), "--json").stdout)
    values = [f"{planned['budget_tokens']:,}"]
    for d in planned["domains"]:
        values += [f"{d['pool']:,}", f"{d['weight']:.4f}", f"{d['expected_tokens']:,.0f}"]
    readable(out, values)


@pytest.fixture(scope="session")
def mixture_tables(tmp_path_factory) -> tuple[Path, Path]:
    """A regression table of 40 runs x 17 domains with long names, and 3 mixtures to
    predict, named."""
    root = tmp_path_factory.mktemp("mixcsv")
    rng = np.random.default_rng(0)
    domains = [f"domain_{i:02d}_common_crawl_en" for i in range(17)]
    w = rng.dirichlet(np.ones(17), 43)
    loss = 3.0 + w @ rng.normal(0, 0.3, 17) + rng.normal(0, 0.01, 43)
    runs, new = root / "runs.csv", root / "new.csv"
    names = ["candidate-mixture-with-a-long-name-1", "second", "third"]
    with runs.open("w", newline="") as f:
        csv.writer(f).writerows([[*domains, "loss"], *np.column_stack([w[:40], loss[:40]])])
    with new.open("w", newline="") as f:
        rows = ([n, *r] for n, r in zip(names, w[40:], strict=True))
        csv.writer(f).writerows([["name", *domains], *rows])
    return runs, new


@MODES
def test_mix_fit(mixture_tables, tty):
    runs_csv, new = mixture_tables
    args = ("mix", "fit", "--csv", str(runs_csv), "--target", "loss", "--predict", str(new))
    out = ledgerlm_at(*args, tty=tty)
    found = json.loads(ledgerlm(*args, "--json").stdout)
    values = [*found["recommended"], "candidate-mixture-with-a-long-name-1"]
    values += [f"{w:.4f}" for w in found["recommended"].values()]
    values += [f"{p:.4f}" for p in found["predictions"]]
    readable(
        out,
        values,
        prose=("read ", "model:", "cross-validated", "searched", "predicted", "warning"),
    )


@MODES
def test_scale_plan(tty):
    args = ("scale", "plan", str(TINY), "--sizes", "2e5,5e5,1e6", "--tokens", "1e5,2e5,4e5")
    out = ledgerlm_at(*args, tty=tty)
    planned = json.loads(ledgerlm(*args, "--json").stdout)
    values = []
    for p in planned["points"]:
        values += [p["name"], f"{p['N']:,}", f"{p['D']:,}", f"{p['max_steps']:,}"]
    readable(
        out, values, prose=("targets:", "tokens per step", "shape rule", "warmup", "lr rule", "N: ")
    )


@pytest.fixture(scope="session")
def points_csv(tmp_path_factory) -> Path:
    """6 sizes x 5 token counts, three learning rates each: replicates left out."""
    return write_tuned_csv(tmp_path_factory.mktemp("scale") / "points.csv")


@MODES
def test_scale_fit(points_csv, tty):
    args = ("scale", "fit", "--csv", str(points_csv), "--bootstrap", "10", "--holdout-top", "3")
    out = ledgerlm_at(*args, tty=tty)
    fit = json.loads(ledgerlm(*args, "--json").stdout)
    values = [f"{v:.4g}" for v in fit["params"].values()]
    values += [f"{iv[0]:.4g} .. {iv[1]:.4g}" for iv in fit["intervals"].values() if iv]
    values += [d["point"] for d in fit["dropped"]] + [f"{d['loss']:.4f}" for d in fit["dropped"]]
    for p in fit["held_out"]["points"]:
        values += [p["point"], f"{p['predicted']:.4f}", f"{p['error']:+.4f}"]
    readable(out, values, prose=(str(points_csv), "note:", "fit ", "fitted range", "isoFLOP"))


@MODES
def test_scale_recommend_lifecycle(points_csv, tty):
    args = ("scale", "recommend", "--csv", str(points_csv), "--budget", "1e21",
            "--requests", "0,1e6,1e9,1e12", "--bootstrap", "10")  # fmt: skip
    out = ledgerlm_at(*args, tty=tty)
    found = json.loads(ledgerlm(*args, "--json").stdout)
    values = []
    rows = found["lifecycle"]["rows"]
    assert len(rows) == 4 and all(r["D"] >= 1 and r["interval"] for r in rows)
    for r in rows:
        values += [f"{r['loss']:.3f}", f"{100 * r['C_train'] / r['C_total']:.0f}%"]
        lo, hi = r["interval"]["loss"]
        values += [f"({lo:.3f} ..", f"{hi:.3f})"]  # the interval wraps at its spaces
    readable(out, values, prose=("R = ", "compute budget", "serving cost", "note:", "warning"))


@MODES
def test_scale_serving_cost(runs, tty, tmp_path):
    written = tmp_path / "serving.json"
    out = ledgerlm_at(
        "scale", "serving-cost", "--model-shape", "d_model=64,n_layers=2,n_heads=2,vocab=512",
        "--context", "16", "--new-tokens", "2", "--repeats", "1", "--threads", "1",
        "-w", str(runs.ws), "-o", str(written), tty=tty,
    )  # fmt: skip
    r = json.loads(written.read_text())
    values = ["serving FLOPs / param / token: analytic", "FLOPs / token: attention 4 L T d"]
    values += [f"{r['tokens_per_s']:,.0f}", f"{r['train_tokens_per_s']:,.0f}"]
    readable(out, values, prose=("on ", "wrote "))


@pytest.fixture(scope="module")
def search_ws(tmp_path_factory) -> Path:
    """A workspace of the search's own (its trials are runs: the shared ``runs`` stay
    two). The first mode's search trains the trials; the second's reuses them."""
    return tmp_path_factory.mktemp("search") / "ws"


@pytest.mark.slow
@MODES
def test_mix_search(search_ws, tty):
    from ledgerlm.cli.render import device_hours
    from ledgerlm.ledger.search import search_rows

    out = ledgerlm_at(
        "mix", "search", str(TINY), "-w", str(search_ws), "--trials", "3",
        "--proxy", "model.n_layers=1", "--proxy", "train.max_steps=6",
        "--proxy", "eval.every_steps=3", tty=tty,
    )  # fmt: skip
    (search_id,) = [w for w in out.split() if w.startswith("data.mixture.from_search=")]
    record = json.loads(Workspace(search_ws).search_file(search_id.split("=")[1]).read_text())
    values = [record["search_id"]]
    for trial in record["trials"]:
        values += [f"{trial['weights'].get(d, 0.0):.3f}" for d in record["domains"]]
        values += [f"{v:.4f}" for k, v in trial["metrics"].items() if k.startswith("loss")]
    for row in search_rows(record["bill"]):  # the search's bill, as ledger show lists it
        values += [row["group"], fmt_seconds(row["seconds"]), device_hours(row["device_hours"])]
    readable(out, values, prose=("warning", "objective", "predicted", "search wall time"))
