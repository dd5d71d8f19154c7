"""Downstream task benchmarks: what scoring tasks in the loop costs of time-to-target,
and how fast ``ledgerlm eval`` scores a finished run's snapshot in process against
lm-evaluation-harness on the same exported model and items, and whether the two give
the same score on every item. Every side is a whole command (``python -m ledgerlm ...``,
a fresh process, the way a user waits for it), its figures read back from the ledger.

- **share** (``configs/demo-tasks.toml``, the demo's evaluation interval): ``ledgerlm
  run`` to its task target. Of its time-to-target, the seconds its charged evaluations
  spent scoring tasks (``time_to_target.task_seconds``: the eval phases' detail) as a
  share (goal: under 10%), beside the eval phases' own share and, for the whole run,
  the same shares of all its phases (a run that missed its target is measured on the
  whole run and says so).
- **speed**: on that finished run's checkpoint, for each ``choice`` and ``exact`` task
  of its recipe, ``ledgerlm eval RUN --tasks NAME`` (in process) against the same
  command with ``--harness`` (the snapshot exported as a Hugging Face folder, scored by
  lm-evaluation-harness, offline): items per second of the scoring itself (the task's
  items over its seconds in the ``eval_after`` phase's detail) and of the whole command
  (items over its wall time, model load, export and start-up included), and the ratio
  in process / harness of each (goal: above 1, in process faster). The baseline is the
  harness, measured in the same run on the same items.
- **agreement**: the same snapshot and items scored in this process by
  ``tasks.score.score_task`` and by ``lab.harness.run_harness`` on the exported folder:
  the items whose ``acc`` / ``acc_norm`` (choice) or ``exact_match`` and generated text
  (exact) differ (goal: none), the metrics of each side, and for choice the largest
  difference of a choice's log-likelihood (nats).

The machine's load (``os.getloadavg``) and other processes' share of the CPU are
printed beside each section: figures taken while others use the CPU are only as good
as that share is small.

    python bench/tasks.py --quick          # the tiny recipe with two small tasks: minutes
    python bench/tasks.py                  # the demo's recipe to its task target
    python bench/tasks.py --only speed --only agreement --workspace W --run RUN --json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from commands import ROOT, ledgerlm, sets
from machine_load import load, measured

SECTIONS = ("share", "speed", "agreement")
GOAL_SHARE = 0.10
KINDS = ("choice", "exact")  # what --harness is measured against; bpb is loglikelihood
# The quick recipe: the tiny one with a choice and an exact built-in task, few items.
QUICK_TASKS = (
    'eval.tasks=[{name="code-next-line", builtin="code-next-line", limit=12},'
    ' {name="arith", builtin="arith", limit=12}]'
)


def settings(quick: bool) -> dict[str, Any]:
    """The recipe and overrides the share section runs; ``quick`` checks the script
    works in a few minutes (its figures mean nothing)."""
    if quick:
        return {
            "recipe": ROOT / "configs" / "tiny.toml",
            "sets": [QUICK_TASKS, "train.max_steps=40", "eval.every_steps=20"],
        }
    return {"recipe": ROOT / "configs" / "demo-tasks.toml", "sets": []}


# ----------------------------------------------------------------------------- commands


def summary_of(workspace: Path, run: str = "latest") -> dict[str, Any]:
    from ledgerlm.ledger.store import Ledger

    with Ledger(workspace / "ledger.db", read_only=True) as ledger:
        return ledger.run_summary(ledger.resolve_run(run))


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _num(value: float | None, fmt: str = ".3g") -> str:
    return "-" if value is None else format(value, fmt)


# ----------------------------------------------------------------------------- sections


def share(cfg: dict[str, Any], work: Path) -> dict[str, Any]:
    """The run to its target and where its time-to-target went."""
    from ledgerlm.ledger.compare_tasks import task_seconds

    wall = ledgerlm(["run", str(cfg["recipe"]), *sets(cfg["sets"])], work)
    s = summary_of(work)
    ttt = s["time_to_target"]
    reached = bool(ttt["reached"])
    per_task = task_seconds(s)  # every eval phase of the run, by task
    total, evals = s["total_seconds"], s["phase_totals"].get("eval", 0.0)
    out: dict[str, Any] = {
        "run": s["run"]["id"],
        "command_s": wall,
        "reached": reached,
        "step": ttt["step"],
        "eval_every": s["run"]["eval_every"],
        "evaluations": len(s["evaluations"]),
        "ttt_s": ttt["seconds"],
        "ttt_eval_s": ttt["by_phase"].get("eval") if reached else None,
        "ttt_task_s": ttt.get("task_seconds") if reached else None,
        "total_s": total,
        "eval_s": evals,
        "task_s": sum(per_task.values()),
        "task_s_by_task": per_task,
    }
    if reached and ttt["seconds"]:
        out["task_share"] = (out["ttt_task_s"] or 0.0) / ttt["seconds"]
        out["eval_share"] = (out["ttt_eval_s"] or 0.0) / ttt["seconds"]
        of = f"time-to-target {ttt['seconds']:.1f} s (step {ttt['step']})"
    else:  # not reached: the whole run is what was spent
        out["task_share"] = out["task_s"] / total if total else None
        out["eval_share"] = evals / total if total else None
        of = f"the whole run, {total:.1f} s (target NOT reached)"
    out["whole_run_task_share"] = out["task_s"] / total if total else None
    print(
        f"  run {out['run']}, an evaluation every {out['eval_every']} updates: tasks "
        f"{_pct(out['task_share'])} of {of} (goal < {GOAL_SHARE:.0%}), all evaluation "
        f"{_pct(out['eval_share'])}; over the whole run ({total:.1f} s, "
        f"{out['evaluations']} evaluations) tasks {_pct(out['whole_run_task_share'])}",
        flush=True,
    )
    for name, seconds in per_task.items():
        print(f"    {name}: {seconds:.2f} s in all evaluations", flush=True)
    return out


def _scored_tasks(work: Path, run: str) -> list[tuple[str, str]]:
    """(name, kind) of the run's choice and exact tasks, from its stored recipe."""
    from ledgerlm.config import load_recipe
    from ledgerlm.workspace import Workspace

    recipe = load_recipe(Workspace(work).run_dir(run) / "recipe.toml")
    return [(t.name, t.task_kind) for t in recipe.eval.tasks if t.task_kind in KINDS]


def _after(work: Path, run: str, name: str, harness: bool) -> dict[str, Any]:
    """``ledgerlm eval RUN --tasks NAME`` and what it wrote: its eval_after phase and
    the evaluation bound to it."""
    args = ["eval", run, "--tasks", name, *(["--harness"] if harness else [])]
    wall = ledgerlm(args, work)
    s = summary_of(work, run)
    phase = [p for p in s["phases"] if p["kind"] == "eval_after"][-1]
    (ev,) = [e for e in s["evaluations"] if e["phase_id"] == phase["id"]]
    items = int(ev["metrics"][f"task/{name}/items"])
    scoring = float(phase["detail"]["task_seconds"][name])
    return {
        "command_s": wall,
        "phase_s": phase["seconds"],
        "scoring_s": scoring,
        "items": items,
        "items_per_s": items / scoring if scoring else None,
        "command_items_per_s": items / wall,
        "metrics": {k: v for k, v in ev["metrics"].items() if k.startswith(f"task/{name}/")},
    }


def speed(work: Path, run: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, kind in _scored_tasks(work, run):
        sides = {
            side: _after(work, run, name, side == "harness") for side in ("ledgerlm", "harness")
        }
        ours, theirs = sides["ledgerlm"], sides["harness"]
        ratio = (
            ours["items_per_s"] / theirs["items_per_s"]
            if ours["items_per_s"] and theirs["items_per_s"]
            else None
        )
        whole = ours["command_items_per_s"] / theirs["command_items_per_s"]
        same = ours["metrics"] == theirs["metrics"]
        out[name] = {"kind": kind, **sides, "ratio": ratio, "command_ratio": whole, "same": same}
        print(
            f"  {name} ({kind}, {ours['items']} items): scoring {_num(ours['items_per_s'])} "
            f"items/s in process, {_num(theirs['items_per_s'])} by the harness = "
            f"x{_num(ratio)} (goal > 1); whole command {ours['command_s']:.1f} s against "
            f"{theirs['command_s']:.1f} s = x{whole:.3g}; the ledger's metrics equal: {same}",
            flush=True,
        )
    return out


def agreement(work: Path, run: str) -> dict[str, Any]:
    """Each choice and exact task scored item by item both ways in this process."""
    from ledgerlm.lab.export import load_run_model
    from ledgerlm.lab.harness import run_harness
    from ledgerlm.lab.tasks import resolve_tasks
    from ledgerlm.model.export import export_hf
    from ledgerlm.tasks.score import score_task
    from ledgerlm.tokens.shards import TokenStore
    from ledgerlm.workspace import Workspace

    ws = Workspace(work)
    loaded = load_run_model(ws, run, purpose="evaluate")
    model, recipe = loaded.model.eval(), loaded.recipe
    tokens = ws.version_dir("tokens", loaded.tokens_version)
    store = TokenStore(tokens)
    cfgs = [t for t in recipe.eval.tasks if t.task_kind in KINDS]
    sets_ = resolve_tasks(cfgs, ws, store, None)
    seq_len, rows = recipe.pack.seq_len, recipe.train.micro_batch_rows
    special = store.special
    ours = [
        score_task(model, task, store.tokenizer, special.get("bos"), seq_len=seq_len,
                   rows=rows, decoder_model=model, eos=special.get("eos"))
        for task in sets_
    ]  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench-tasks-") as tmp:
        folder = export_hf(
            model, Path(tmp) / "model", tokenizer_path=tokens / "tokenizer.json",
            special=loaded.tokenizer["special"], max_positions=seq_len,
        )  # fmt: skip
        theirs = run_harness(folder, sets_, Path(tmp) / "work", seq_len=seq_len, rows=rows)
    out: dict[str, Any] = {}
    for task, a, b in zip(sets_, ours, theirs, strict=True):
        keys = ("acc", "acc_norm") if task.kind == "choice" else ("exact_match",)
        differ = {k: sum(x != y for x, y in zip(a.per_item[k], b.per_item[k], strict=True))
                  for k in keys}  # fmt: skip
        row: dict[str, Any] = {
            "kind": task.kind,
            "items": len(task.items),
            "differing_items": differ,
            "ledgerlm": {k: a.metrics[f"task/{task.name}/{k}"] for k in keys},
            "harness": {k: b.metrics[f"task/{task.name}/{k}"] for k in keys},
            "ledgerlm_items_per_s": len(task.items) / a.seconds if a.seconds else None,
            "harness_items_per_s": len(task.items) / b.seconds if b.seconds else None,
        }
        if task.kind == "choice":
            row["max_loglik_diff"] = max(
                (abs(x - y) for p, q in zip(a.per_item["loglik"], b.per_item["loglik"],
                                            strict=True) for x, y in zip(p, q, strict=True)),
                default=0.0,
            )  # fmt: skip
        out[task.name] = row
        if task.kind == "exact":  # the text generated, stripped as exact_match reads it
            differ["generated"] = sum(
                x.strip() != y.strip()
                for x, y in zip(a.per_item["generated"], b.per_item["generated"], strict=True)
            )
        cells = ", ".join(f"{k} {n}" for k, n in differ.items())
        ours_m, theirs_m = (
            ", ".join(f"{k} {v:.4f}" for k, v in row[side].items())
            for side in ("ledgerlm", "harness")
        )
        extra = f", largest log-likelihood difference {row['max_loglik_diff']:.2e} nats" if (
            task.kind == "choice") else ""  # fmt: skip
        print(
            f"  {task.name} ({task.kind}, {row['items']} items): items that differ: {cells} "
            f"(goal 0); ledgerlm {ours_m}, harness {theirs_m}{extra}",
            flush=True,
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the tiny recipe (minutes)")
    parser.add_argument("--only", action="append", choices=SECTIONS, help="these sections")
    parser.add_argument("--workspace", type=Path, help="keep the workspace here")
    parser.add_argument(
        "--run", help="speed and agreement: this finished run of the workspace (default: "
        "the one the share section trains, else the latest)"
    )  # fmt: skip
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    cfg = settings(args.quick)
    print(f"python bench/tasks.py {' '.join(sys.argv[1:])}; {load()}", flush=True)
    result: dict[str, Any] = {"quick": args.quick, "cores": os.cpu_count()}
    with tempfile.TemporaryDirectory() as tmp:
        work = args.workspace or Path(tmp) / "ws"
        run = args.run
        for name in args.only or SECTIONS:
            print(f"{name}:", flush=True)
            if name == "share":
                out = measured(share, cfg, work)
                run = run or out["run"]
            else:
                run = run or summary_of(work)["run"]["id"]
                out = measured(speed if name == "speed" else agreement, work, run)
            result[name] = out
    if args.json:
        print(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
    main()
