"""Ledger overhead benchmark: what recording a run costs per training step.

One process trains the demo recipe's model on its real token version (built or reused
in a workspace through the library) in two configurations that make identical updates
(same seed, data order and thread count; the script checks the losses match):

- **baseline**: a ``Trainer`` with the default recorder, which records nothing;
- **ledgered**: the same ``Trainer`` reporting to the lab's ``LedgerRecorder`` over a
  real ``Ledger`` (an SQLite file in the workspace), as a run does: one row per update,
  written in batches of ``eval.every_steps``, each write also the open phase's
  heartbeat; and, at every evaluation interval and at
  the end, the ledger side of an evaluation (``recorder.interrupt("eval")``,
  ``add_evaluation`` with a precomputed metrics dict, ``set_counters``). The
  evaluation itself (scoring, hashing the weights) is a real phase of work, not
  overhead, so it is not run; nor is checkpointing (the demo saves only at the end).

The machine is shared and noisy, so repetitions alternate baseline, ledgered,
baseline, ledgered, ... in the main thread, each a full ``Trainer.fit`` as the runner
calls it. Two figures come out:

- **bookkeeping / step** (the headline, far less noisy): time spent inside the ledger's
  calls, and inside all bookkeeping (recorder and callbacks, ledger calls included),
  measured with ``perf_counter`` around each call, per update, divided by the baseline's
  median step time (a step: from the end of one update's callbacks to the end of the
  next's, so train_step plus every callback);
- **end to end**: ledgered / baseline - 1 of the median step time and of the wall time of
  the whole ``fit`` per update (only the latter sees the periodic writes), as the median
  over repeats with the min..max of the per-repeat ratios. With other processes on the
  machine these swing by several percent either way; the first figure does not.

    python bench/ledger_overhead.py                          # about 3 minutes on 2 cores
    python bench/ledger_overhead.py --steps 100 --repeat 5 --workspace ledgerlm-work --json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from ledgerlm.config import Recipe, load_recipe
from ledgerlm.data.pipeline import prepare_data
from ledgerlm.lab.recorder import LedgerRecorder
from ledgerlm.ledger.store import Ledger
from ledgerlm.model.gpt import GPT
from ledgerlm.tokens.loader import train_batches
from ledgerlm.tokens.shards import TokenStore, build_tokens
from ledgerlm.train.evaluate import weights_digest
from ledgerlm.train.loop import Trainer
from ledgerlm.train.optim import build_optimizer
from ledgerlm.workspace import Workspace
from machine_load import cpu_jiffies, foreign_load, own_cpu

ROOT = Path(__file__).resolve().parents[1]
GOAL = 0.01  # bookkeeping under 1% of a training step
SIDES = ("baseline", "ledgered")
# Every public Ledger method is timed (the loop uses phase, add_steps, beat,
# add_evaluation, set_counters, add_event): a method added later is counted too.
LEDGER_CALLS = tuple(
    name
    for name, value in vars(Ledger).items()
    if callable(value) and not name.startswith("_") and name != "close"
)


# ----------------------------------------------------------------------------- meters


class Meter:
    """perf_counter spans by name; ``outer`` counts only the outermost span, so nested
    spans (a ledger call inside a callback) are not counted twice."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: Counter[str] = Counter()
        self.outer = 0.0
        self._depth = 0

    @contextmanager
    def span(self, name: str) -> Iterator[None]:
        self._depth += 1
        start = time.perf_counter()
        try:
            yield
        finally:
            elapsed = time.perf_counter() - start
            self._depth -= 1
            self.seconds[name] += elapsed
            self.calls[name] += 1
            if self._depth == 0:
                self.outer += elapsed

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            with self.span(name):
                return fn(*args, **kwargs)

        return timed

    def ledger_seconds(self) -> float:
        return sum(v for k, v in self.seconds.items() if k.startswith("ledger."))


class _TimedPhase:
    """``Ledger.phase`` as the clock drives it: entered and exited in separate calls,
    with training in between; only the entering and the exiting are timed."""

    def __init__(self, meter: Meter, make: Callable[[], Any]) -> None:
        self.meter, self.make = meter, make

    def __enter__(self) -> Any:
        with self.meter.span("ledger.phase open"):
            self.cm = self.make()
            return self.cm.__enter__()

    def __exit__(self, *exc: Any) -> Any:
        with self.meter.span("ledger.phase close"):
            return self.cm.__exit__(*exc)


def instrument_ledger(ledger: Ledger, meter: Meter) -> None:
    """Time every write the training loop can make, on this instance only."""
    for name in LEDGER_CALLS:
        fn = getattr(ledger, name)
        if name == "phase":
            setattr(
                ledger,
                name,
                lambda *a, fn=fn, **k: _TimedPhase(meter, lambda: fn(*a, **k)),
            )
        else:
            setattr(ledger, name, meter.wrap(f"ledger.{name}", fn))


def instrument_recorder(recorder: LedgerRecorder, meter: Meter) -> None:
    # The clock's interrupt() calls self.start/self.stop, which resolve to these
    # wrappers; the meter's depth keeps the nesting out of the outer total.
    clock = recorder.clock
    for name in ("start", "stop"):
        setattr(clock, name, meter.wrap(f"clock.{name}", getattr(clock, name)))
    for name in ("on_train_start", "on_step_end", "on_train_end"):
        setattr(recorder, name, meter.wrap(f"steps.{name}", getattr(recorder, name)))


class Timed:
    """A callback whose every hook is timed."""

    def __init__(self, cb: Any, meter: Meter, name: str) -> None:
        self.cb, self.meter, self.name = cb, meter, name

    def on_train_start(self, trainer: Trainer) -> None:
        with self.meter.span(f"{self.name}.on_train_start"):
            self.cb.on_train_start(trainer)

    def on_step_end(self, trainer: Trainer) -> None:
        with self.meter.span(f"{self.name}.on_step_end"):
            self.cb.on_step_end(trainer)

    def on_train_end(self, trainer: Trainer) -> None:
        with self.meter.span(f"{self.name}.on_train_end"):
            self.cb.on_train_end(trainer)


# ----------------------------------------------------------------------------- callbacks


class EvalBookkeeping:
    """The ledger side of ``EvalCallback.run`` at the same steps, without the evaluation:
    the eval phase interrupting training, the evaluation row, the counters."""

    def __init__(self, every: int, metrics: dict[str, float], snapshot: str) -> None:
        self.every, self.metrics, self.snapshot = every, metrics, snapshot
        self.last: int | None = None

    def on_train_start(self, trainer: Trainer) -> None:
        pass

    def on_step_end(self, trainer: Trainer) -> None:
        if trainer.state.step % self.every == 0:
            self.record(trainer)

    def on_train_end(self, trainer: Trainer) -> None:
        if self.last != trainer.state.step:
            self.record(trainer)

    def record(self, trainer: Trainer) -> None:
        s, recorder = trainer.state, trainer.recorder
        with recorder.interrupt("eval", s.step) as phase:
            phase_id = phase.id  # evaluate() and weights_digest() would run here
        recorder.ledger.add_evaluation(
            recorder.run_id,
            phase_id=phase_id,
            step=s.step,
            tokens=s.tokens,
            targets=s.targets,
            updates=s.step,
            metrics=self.metrics,
            snapshot=self.snapshot,
        )
        recorder.ledger.set_counters(recorder.run_id, s.counters())
        self.last = s.step


class StepTimer:
    """Last callback: a stamp after every update and its callbacks, so each interval is
    one full iteration of the training loop (train_step plus every callback)."""

    def __init__(self) -> None:
        self.stamps: list[float] = []

    def on_train_start(self, trainer: Trainer) -> None:
        self.stamps = [time.perf_counter()]

    def on_step_end(self, trainer: Trainer) -> None:
        self.stamps.append(time.perf_counter())

    def on_train_end(self, trainer: Trainer) -> None:
        pass

    def steps(self) -> list[float]:
        return [b - a for a, b in zip(self.stamps, self.stamps[1:], strict=False)]


# ----------------------------------------------------------------------------- runs


def prepare(recipe: Recipe, workspace: Workspace) -> tuple[TokenStore, dict[str, Any]]:
    start = time.perf_counter()
    data = prepare_data(recipe.data, workspace)
    tokens = build_tokens(data, recipe.tokenizer, workspace)
    info = {
        "data_version": data.version,
        "tokens_version": tokens.version,
        "reused": bool(data.reused and tokens.reused),
        "seconds": time.perf_counter() - start,
    }
    return TokenStore(tokens.path), info


def fit(
    recipe: Recipe,
    store: TokenStore,
    steps: int,
    ledger: Ledger | None,
    bench: dict[str, Any],
) -> dict[str, Any]:
    """One ``Trainer.fit`` of ``steps`` updates; with ``ledger``, the ledgered one."""
    cfg = recipe.train.model_copy(update={"max_steps": steps})
    torch.manual_seed(cfg.seed)  # the same initial weights and data order every time
    model = GPT(recipe.model, store.vocab_size)
    optimizer = build_optimizer(model, cfg)
    stream = train_batches(store, recipe.pack, cfg.micro_batch_rows, cfg.seed)
    timer, meter = StepTimer(), Meter()
    recorder, callbacks = None, []
    if ledger is not None:
        run_id = ledger.create_run(  # outside the timing, as in the runner
            recipe.name,
            recipe.to_dict(),
            target_metric="loss",
            target_value=recipe.eval.target_loss,
            eval_every=recipe.eval.every_steps,
        )
        instrument_ledger(ledger, meter)
        every = recipe.eval.every_steps
        recorder = LedgerRecorder(ledger, run_id, flush_every=every)
        instrument_recorder(recorder, meter)
        book = EvalBookkeeping(every, bench["metrics"], bench["snapshot"])
        callbacks = [Timed(book, meter, "eval")]
    trainer = Trainer(
        model,
        optimizer,
        cfg,
        stream,
        recipe.pack.attention,
        callbacks=[*callbacks, timer],
        recorder=recorder,
    )
    torch.set_num_threads(bench["threads"])
    start = time.perf_counter()
    state = trainer.fit()
    wall = time.perf_counter() - start
    if ledger is not None:
        for name in LEDGER_CALLS:  # the class's own methods again
            ledger.__dict__.pop(name, None)
        ledger.finish_run(run_id, "not reached")
    return {
        "steps": timer.steps(),
        "wall": wall,
        "updates": state.step,
        "losses": [r.loss for r in state.history],
        "meter": meter,
        "threads": torch.get_num_threads(),
    }


def pct(x: float) -> str:
    return f"{100 * x:+.2f}%"


def spread(values: list[float]) -> dict[str, Any]:
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "per_repeat": values,
    }


def summarize(runs: list[tuple[dict, dict]]) -> dict[str, Any]:
    med = [[statistics.median(x["steps"]) for x in pair] for pair in runs]
    wall = [[x["wall"] / x["updates"] for x in pair] for pair in runs]
    ledger_s = [b["meter"].ledger_seconds() / b["updates"] for _, b in runs]
    book_s = [b["meter"].outer / b["updates"] for _, b in runs]
    base_med = [m[0] for m in med]
    calls: dict[str, dict[str, float]] = {}
    total_updates = sum(b["updates"] for _, b in runs)
    for _, b in runs:
        m = b["meter"]
        for name in m.seconds:
            row = calls.setdefault(name, {"calls": 0, "seconds": 0.0})
            row["calls"] += m.calls[name]
            row["seconds"] += m.seconds[name]
    for row in calls.values():
        row["us_per_update"] = 1e6 * row["seconds"] / total_updates
    return {
        "median_step_s": {n: statistics.median(m[i] for m in med) for i, n in enumerate(SIDES)},
        "wall_per_update_s": {
            n: statistics.median(w[i] for w in wall) for i, n in enumerate(SIDES)
        },
        "median_step_overhead": spread([b / a - 1 for a, b in med]),
        "wall_overhead": spread([b / a - 1 for a, b in wall]),
        "ledger_seconds_per_update": statistics.median(ledger_s),
        "ledger_share": spread([t / m for t, m in zip(ledger_s, base_med, strict=True)]),
        "bookkeeping_seconds_per_update": statistics.median(book_s),
        "bookkeeping_share": spread([t / m for t, m in zip(book_s, base_med, strict=True)]),
        "calls": calls,
    }


def print_report(info: dict[str, Any], s: dict[str, Any]) -> None:
    p = info["prep"]
    print(
        f"recipe {info['recipe']}: tokens {p['tokens_version']} "
        f"({'reused' if p['reused'] else 'built'} in {p['seconds']:.1f} s); "
        f"{info['repeat']} repeats of {info['steps']} updates per configuration, "
        f"interleaved; {info['threads']} threads, seed {info['seed']}, flush/eval every "
        f"{info['every']} updates"
    )
    load = info["foreign_load"]
    print(
        f"identical updates in both configurations: {'yes' if info['identical'] else 'NO'}; "
        "other processes used "
        + ("an unknown share" if load is None else f"{100 * load:.0f}%")
        + " of the machine's CPU time meanwhile"
    )
    print()
    print("| configuration | median step | fit wall / update |")
    print("|---|---:|---:|")
    for name in SIDES:
        med, wall = s["median_step_s"][name], s["wall_per_update_s"][name]
        print(f"| {name} | {1e3 * med:.1f} ms | {1e3 * wall:.1f} ms |")
    m, w = s["median_step_overhead"], s["wall_overhead"]
    print(
        f"| overhead (b/a - 1) | {pct(m['median'])} ({pct(m['min'])}..{pct(m['max'])}) "
        f"| {pct(w['median'])} ({pct(w['min'])}..{pct(w['max'])}) |"
    )
    print()
    print("| measured around the calls | per update | share of a baseline step |")
    print("|---|---:|---:|")
    for label, key in (("ledger calls", "ledger"), ("all bookkeeping", "bookkeeping")):
        lo, mid, hi = (100 * s[f"{key}_share"][k] for k in ("min", "median", "max"))
        per_update = 1e6 * s[f"{key}_seconds_per_update"]
        print(f"| {label} | {per_update:.1f} us | {mid:.3f}% ({lo:.3f}..{hi:.3f}%) |")
    print()
    print("| call (all repeats) | calls | us / update |")
    print("|---|---:|---:|")
    for name, row in sorted(s["calls"].items(), key=lambda kv: -kv[1]["seconds"]):
        print(f"| {name} | {row['calls']} | {row['us_per_update']:.1f} |")
    print()
    digest_ms = 1e3 * info["weights_digest_s"]
    print(
        f"not counted (inside the eval phase, part of evaluation): weights_digest "
        f"{digest_ms:.1f} ms per evaluation"
    )
    book = s["bookkeeping_share"]
    verdict = "MET" if book["max"] < GOAL else "NOT MET"
    print(
        f"verdict: {verdict}: bookkeeping is {100 * book['median']:.3f}% of a training step "
        f"(worst repeat {100 * book['max']:.3f}%; goal < {100 * GOAL:.0f}%); end to end "
        f"{pct(m['median'])} median step ({pct(m['min'])}..{pct(m['max'])}), "
        f"{pct(w['median'])} wall ({pct(w['min'])}..{pct(w['max'])})"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--recipe", type=Path, default=ROOT / "configs" / "demo.toml")
    ap.add_argument("--workspace", type=Path, help="reuse or build versions here (default: temp)")
    ap.add_argument(
        "--steps", type=int, default=50, help="updates per run (default: one eval interval)"
    )
    ap.add_argument("--repeat", type=int, default=3, help="baseline/ledgered pairs")
    ap.add_argument("--threads", type=int, help="torch threads (default: the recipe's, else all)")
    ap.add_argument("--json", action="store_true", help="machine-readable output")
    args = ap.parse_args(argv)

    recipe = load_recipe(args.recipe)
    threads = args.threads or recipe.train.threads or os.cpu_count() or 1
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)  # as the runner trains

    with tempfile.TemporaryDirectory(prefix="ledger-overhead-") as tmp:
        workspace = Workspace(args.workspace or tmp)
        store, prep = prepare(recipe, workspace)
        # a real ledger file in the workspace, fresh (and removed after) so that the
        # workspace's own ledger.db never sees the benchmark's runs
        ledger_path = workspace.root / f"bench-ledger-{os.getpid()}.db"
        ledger = None
        try:
            model = GPT(recipe.model, store.vocab_size)
            start = time.perf_counter()
            snapshot = weights_digest(model)  # what an evaluation binds; not timed below
            digest_s = time.perf_counter() - start
            bench = {
                "threads": threads,
                "metrics": {"loss": 5.0, **{f"loss/{d}": 5.0 for d in store.domains}},
                "snapshot": snapshot,
            }
            fit(recipe, store, 3, None, bench)  # untimed warm-up: first-run allocations
            ledger = Ledger(ledger_path)
            runs = []
            load, own = cpu_jiffies(), own_cpu()
            for r in range(args.repeat):
                a = fit(recipe, store, args.steps, None, bench)
                b = fit(recipe, store, args.steps, ledger, bench)
                runs.append((a, b))
                if not args.json:
                    print(
                        f"repeat {r + 1}/{args.repeat}: median step baseline "
                        f"{1e3 * statistics.median(a['steps']):.1f} ms, ledgered "
                        f"{1e3 * statistics.median(b['steps']):.1f} ms",
                        file=sys.stderr,
                    )
            foreign = foreign_load(load, own)
        finally:
            if ledger is not None:
                ledger.close()
            for suffix in ("", "-wal", "-shm"):
                Path(f"{ledger_path}{suffix}").unlink(missing_ok=True)
    losses = runs[0][0]["losses"]
    identical = all(a["losses"] == losses and b["losses"] == losses for a, b in runs)
    info = {
        "recipe": str(args.recipe),
        "prep": prep,
        "steps": args.steps,
        "repeat": args.repeat,
        "threads": threads,
        "threads_seen": sorted({x["threads"] for pair in runs for x in pair}),
        "seed": recipe.train.seed,
        "every": recipe.eval.every_steps,
        "identical": identical,
        "weights_digest_s": digest_s,
        "foreign_load": foreign,
        "torch": torch.__version__,
    }
    summary = summarize(runs)
    if args.json:
        print(json.dumps({**info, **summary, "goal": GOAL}, indent=2, default=str))
    else:
        print_report(info, summary)
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
