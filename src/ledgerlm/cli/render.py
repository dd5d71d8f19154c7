"""Rich tables for runs, built only from manifests and the ledger summary.

Rich reads markup in table cells, titles and headers: every text that comes from a
recipe, a data file or the ledger is passed through ``escape``, so a domain named
``[/bold]`` prints as itself. The ``*_line`` functions return plain text; callers print
them escaped."""

from __future__ import annotations

import json
from typing import Any

from rich.markup import escape

from ledgerlm.cli.table import FitTable
from ledgerlm.cli.ui import console, fmt_g, fmt_seconds
from ledgerlm.ledger.compare_tasks import after_the_fact, pm, task_metric_names, task_seconds
from ledgerlm.ledger.events import (
    CONTINUED_PRETRAINING,
    EARLY_STOP,
    TRAIN_END,
    latest,
    latest_json,
    target_contract,
    warnings,
)
from ledgerlm.ledger.mixture import DOMAIN_COUNTER
from ledgerlm.ledger.search import search_charges, search_rows, search_title
from ledgerlm.ledger.target import TimeToTarget, higher_is_better, holds, target_key

PHASE_ORDER = (
    "search",
    "startup",
    "setup",
    "prep",
    "tokenize",
    "train",
    "eval",
    "checkpoint",
    "restore",
    "eval_after",
)
# marks the step of an evaluation written after the fact: in process, by the harness
AFTER, HARNESS = "*", "+"
UNCOVERED_SHOWN = 0.05  # seconds between phases worth a line in `ledger show`


def _ttt(summary: dict[str, Any]) -> TimeToTarget:
    return TimeToTarget.from_dict(summary["time_to_target"])


def target_line(summary: dict[str, Any]) -> str:
    """The verdict, with the device time of its bill (and its cost where priced)."""
    ttt = _ttt(summary)
    line = ttt.describe()
    if ttt.reached and ttt.device_hours is not None:
        line += f" ({device_hours(ttt.device_hours)} device-hours"
        line += f"; {cost_words(ttt.cost)})" if ttt.cost else ")"
    return line


def cost_words(cost: dict[str, Any]) -> str:
    """A bill's cost: amount, rate and the price key that matched."""
    return (
        f"cost {cost['amount']:,.4g} at {cost['currency_per_device_hour']:g} per "
        f"device-hour ({cost['key']})"
    )


def resources_line(summary: dict[str, Any]) -> str:
    """What the run holds now (its latest ``resources`` event) and its device time."""
    r = summary.get("resources")
    hours = device_hours(float(summary.get("device_seconds") or 0.0) / 3600.0)
    if r is None:
        return f"resources: not recorded (an older run, counted as 1 device): {hours} device-hours"
    rank = "rank" if r["ranks"] == 1 else "ranks"
    line = (
        f"resources: {r['devices']} x {r['device_kind']} ({r['device_name']}), "
        f"{r['ranks']} {rank} on {r['hosts']} host{'s' if r['hosts'] != 1 else ''}"
    )
    if r.get("threads_per_rank"):
        line += f", {r['threads_per_rank']} thread(s) per rank"
    if r.get("host_cores"):
        line += f" of {r['host_cores']} cores"
    line += f"; {hours} device-hours in all"
    if price := r.get("price"):
        line += f" at {price['currency_per_device_hour']:g} per device-hour ({price['key']})"
    return line


def contract(summary: dict[str, Any]) -> dict[str, Any] | None:
    return target_contract(summary)


def funnel_rows(data_manifest: dict[str, Any]) -> list[tuple[str, int, str]]:
    """(step, documents, detail) from records in to kept: the conservation equation."""
    c = data_manifest["counts"]
    rows = [("read", c["records_in"], f"{len(data_manifest['inputs'])} input shard(s)")]
    for reason, n in c.get("quarantined_by_reason", {}).items():
        rows.append(("- quarantined", n, reason))
    for d in c["dropped"]:
        rows.append((f"- {d['step']}", d["documents"], d["reason"]))
    rows.append(("kept", c["kept"], f"data version {data_manifest['version']}"))
    return rows


def funnel_table(data_manifest: dict[str, Any], tokens_manifest: dict[str, Any]) -> FitTable:
    t = FitTable(title="data funnel", show_edge=False)
    t.add_column("step")
    t.add_column("documents", justify="right")
    t.add_column("detail")
    for step, n, detail in funnel_rows(data_manifest):
        t.add_row(escape(step), f"{n:,}", escape(detail))
    by_split: dict[str, list[int]] = {}
    for row in tokens_manifest["counts"]:
        acc = by_split.setdefault(row["split"], [0, 0])
        acc[0] += row["documents"]
        acc[1] += row["tokens"]
    for split, (docs, tokens) in by_split.items():
        t.add_row(escape(f"  {split}"), f"{docs:,}", f"{tokens:,} tokens")
    tok = tokens_manifest["tokenizer"]
    t.add_row(
        "tokenizer",
        "",
        escape(
            f"{tok['type']}, vocab {tok['vocab_size']:,}, "
            f"tokens version {tokens_manifest['version']}"
        ),
    )
    return t


def phase_table(summary: dict[str, Any]) -> FitTable:
    ttt = _ttt(summary)
    t = FitTable(title="time per phase", show_edge=False)
    t.add_column("phase")
    t.add_column("total", justify="right")
    t.add_column("to target", justify="right")
    totals = summary["phase_totals"]
    kinds = [k for k in PHASE_ORDER if k in totals] + [k for k in totals if k not in PHASE_ORDER]
    tasks = sum(task_seconds(summary).values())
    for kind in kinds:
        to_target = ttt.by_phase.get(kind)  # absent: the phase came after the target
        t.add_row(escape(kind), fmt_seconds(totals[kind]), fmt_seconds(to_target))
        if kind == "eval" and tasks:  # within eval: scoring the downstream tasks
            within = summary["time_to_target"].get("task_seconds")
            t.add_row("  of which tasks", fmt_seconds(tasks), fmt_seconds(within))
    t.add_row("[bold]all[/]", fmt_seconds(summary["total_seconds"]), fmt_seconds(ttt.seconds))
    return t


def coverage_lines(summary: dict[str, Any]) -> list[str]:
    """Wall time the phases do not hold, when there is any worth naming."""
    c = summary.get("coverage") or {}
    lines = []
    if c.get("uncovered_seconds", 0.0) >= UNCOVERED_SHOWN:
        lines.append(
            f"uncovered: {c['uncovered_seconds']:.2f} s of the run's "
            f"{fmt_seconds(c['wall_seconds'])} lie between phases (in no total)"
        )
    if c.get("interrupted_seconds", 0.0) >= UNCOVERED_SHOWN:
        lines.append(
            f"interrupted: {c['interrupted_seconds']:.2f} s between a stopped process "
            "and its resume (not charged)"
        )
    return lines


def counters_table(summary: dict[str, Any]) -> FitTable:
    t = FitTable(title="counters", show_edge=False)
    t.add_column("counter")
    t.add_column("value", justify="right")
    for name, value in summary["counters"].items():
        if name.startswith(DOMAIN_COUNTER):  # per domain: in the mixture table
            continue
        t.add_row(escape(name), f"{value:,}")
    return t


def _step_cell(ev: dict[str, Any], later: dict[int, dict[str, Any]]) -> str:
    if ev.get("id") not in later:
        return str(ev["step"])
    return f"{ev['step']}{HARNESS if later[ev['id']].get('harness') else AFTER}"


def _held(summary: dict[str, Any], metrics: dict[str, Any], name: str) -> bool:
    """Whether ``name`` is one of the run's targets and holds in ``metrics``."""
    run, c = summary["run"], contract(summary) or {}
    thresholds = {target_key(k): v for k, v in (c.get("targets") or {}).items()}
    thresholds[run["target_metric"]] = run["target_value"]
    if name not in thresholds:
        return False
    return holds(metrics, name, thresholds[name], c.get("confirm_by", "threshold"))


def evaluations_table(summary: dict[str, Any], limit: int | None = None) -> FitTable:
    evals = summary["evaluations"]
    found = {k for e in evals for k in e["metrics"]}
    # the loss overall and per domain, and bits per byte overall (per domain and nats
    # per character are in --json): what fits a terminal; task metrics: task_tables
    names = sorted(
        (k for k in found if k == "loss" or k.startswith("loss/") or k == "bpb"),
        key=lambda k: (k != "loss", k == "bpb", k),
    )
    target = summary["run"]["target_metric"]
    if target in found and target not in names and not target.startswith("task/"):
        names.append(target)
    t = FitTable(title="evaluations", show_edge=False)
    for col in ("step", "tokens", "snapshot", *names):
        t.add_column(escape(col), justify="right" if col != "snapshot" else "left")
    later = after_the_fact(summary)
    # an evaluation after the fact that scored none of these (tasks only): task_tables
    evals = [e for e in evals if e["id"] not in later or any(n in e["metrics"] for n in names)]
    shown = evals if limit is None or len(evals) <= limit else evals[-limit:]
    for e in shown:
        cells = []
        for n in names:
            v = e["metrics"].get(n)
            cell = "-" if v is None else f"{v:.4f}"
            if v is not None and _held(summary, e["metrics"], n):
                cell = f"[green]{cell}[/]"
            cells.append(cell)
        step = _step_cell(e, later)
        t.add_row(step, f"{e['tokens']:,}", escape(e["snapshot"][:10]), *cells)
    return t


def task_tables(
    summary: dict[str, Any], limit: int | None = None, width: int | None = None
) -> list[FitTable]:
    """The task curves: per evaluation, each task metric with its standard error
    (``0.62±0.07``; the 95% interval is in --json), as many metrics to a table as fit
    ``width`` columns (the console's) whole, a target that holds in green; evaluations
    written after the fact marked (``AFTER``, ``HARNESS``). None without tasks."""
    evals = summary["evaluations"]
    metrics = task_metric_names(evals)
    if not metrics:
        return []
    shown = evals if limit is None or len(evals) <= limit else evals[-limit:]
    later = after_the_fact(summary)

    def cell(m: dict[str, Any], name: str) -> str:
        return pm(m.get(name), m.get(f"{name}_stderr"))

    def width_of(texts: list[str]) -> int:  # a column's content and its padding, rule
        return max(len(x) for x in texts) + 3

    steps = [_step_cell(e, later) for e in shown]
    room = (width or console.width) - width_of(["step", *steps])
    room -= width_of(["tokens", *(f"{e['tokens']:,}" for e in shown)])
    parts: list[list[str]] = [[]]
    left = room
    for name in metrics:  # as many metrics to a table as fit, a header broken at '/'
        head = name.removeprefix("task/")
        need = width_of(
            [*head.replace("/", "/ ").split(), *(cell(e["metrics"], name) for e in shown)]
        )
        if parts[-1] and need > left:
            parts.append([])
            left = room
        parts[-1].append(name)
        left -= need
    tables = []
    for k, part in enumerate(parts):
        title = "tasks (value±stderr)"
        if len(parts) > 1:
            title += f", {k + 1} of {len(parts)}"
        t = FitTable(title=title, show_edge=False)
        t.add_column("step", justify="right")
        t.add_column("tokens", justify="right")
        for name in part:
            t.add_column(escape(name.removeprefix("task/")), justify="right")
        for e, step in zip(shown, steps, strict=True):
            cells = []
            for name in part:
                text = cell(e["metrics"], name)
                if e["metrics"].get(name) is not None and _held(summary, e["metrics"], name):
                    text = f"[green]{text}[/]"
                cells.append(text)
            t.add_row(step, f"{e['tokens']:,}", *cells)
        tables.append(t)
    return tables


def after_line(summary: dict[str, Any]) -> str | None:
    """What the marks of evaluations written after the fact (``ledgerlm eval``) mean."""
    later = after_the_fact(summary).values()
    if not later:
        return None
    how = []
    if any(not d.get("harness") for d in later):
        how.append(f"{AFTER} scored after the fact in process (ledgerlm eval)")
    if any(d.get("harness") for d in later):
        how.append(f"{HARNESS} by lm-evaluation-harness (ledgerlm eval --harness)")
    return "; ".join(how) + ": never confirming the target, never on its bill"


def _threshold_words(name: str, threshold: float) -> str:
    return f"{name} {'>=' if higher_is_better(name) else '<='} {threshold:.3f}"


def target_contract_line(summary: dict[str, Any]) -> str:
    c = contract(summary) or {}
    run = summary["run"]
    unit = c.get("unit", "nat/token")
    metric = run["target_metric"]
    line = f"target: {'' if metric.startswith('task/') else 'val '}"
    line += f"{_threshold_words(metric, run['target_value'])} {unit}"
    more = {target_key(k): v for k, v in (c.get("targets") or {}).items()}
    more.pop(metric, None)  # a task metric's threshold is in targets too
    if more:
        line += ", and " + ", ".join(_threshold_words(k, v) for k, v in more.items())
    if c.get("confirm", 1) > 1:
        line += f" at {c['confirm']} consecutive evaluations"
    if c:
        line += (
            f" (unigram entropy of the {c['val_targets']:,} val targets: "
            f"{c['val_unigram_entropy']:.3f} nat/token)"
        )
    if c.get("confirm_by") == "interval" and any(k.startswith("task/") for k in (metric, *more)):
        line += (
            "; a task target holds by its 95% interval (an accuracy's lower bound, "
            "bits per byte's upper bound)"
        )
    budget = [
        f"{c['budget_tokens']:,} tokens" if c.get("budget_tokens") else "",
        f"{c['budget_seconds']:g} s" if c.get("budget_seconds") else "",
    ]
    if any(budget):
        line += "; budget " + " and ".join(b for b in budget if b)
    plan = [
        f"patience {c['patience']}" if c.get("patience") else "",
        f"min_delta {c['min_delta']:g}" if c.get("patience") and c.get("min_delta") else "",
        "projection" if c.get("project") else "",
    ]
    if any(plan):
        line += "; stopping plan: " + ", ".join(p for p in plan if p)
    return line


def stop_line(summary: dict[str, Any]) -> str | None:
    """Why training stopped (the latest ``train_end`` event); when a stop rule ended the
    run there, what it found: the best evaluation, or the projection at the budget."""
    end = latest(summary, TRAIN_END)
    if end is None:
        return None
    line = f"training stopped at step {end['step']}: {end['message']}"
    stop = latest(summary, EARLY_STOP)
    if stop is None or stop["step"] != end["step"]:
        return line
    d = json.loads(stop["message"])
    if d.get("rule") == "project":
        low, high = d["interval"]
        line += (
            f"; {d['metric']} projected {d['projected']:.3f} at {d['budget_tokens']:,} tokens"
            f" ({d['level']:.0%} interval {low:.3f} to {high:.3f}, target {d['threshold']:.3f};"
            f" from {len(d['points'])} evaluations)"
        )
    elif d.get("rule") == "patience":
        line += f"; best {d['metric']} {d['best']:.3f} at step {d['best_step']}"
    return line


def continued_rows(summary: dict[str, Any]) -> tuple[str, list[dict[str, Any]]] | None:
    """The before/after rows a continued-pretraining run recorded, with its initial run."""
    found = latest_json(summary, CONTINUED_PRETRAINING)
    return None if found is None else (found["init_from"], found["rows"])


def continued_table(init_from: str, rows: list[dict[str, Any]]) -> FitTable:
    t = FitTable(
        title=f"continued pretraining from {escape(init_from)} (nat/token)", show_edge=False
    )
    for col in ("validation set", "domain", "before", "after", "change", "gain / forgetting"):
        t.add_column(col, justify="left" if col in ("validation set", "domain") else "right")
    for r in rows:
        which = "new data" if r["set"] == "new" else "initial run's"
        domain = "all" if r["domain"] == "*" else r["domain"]
        effect = f"{r['effect']} {r['amount']:+.4f}"
        t.add_row(
            which,
            escape(domain),
            f"{r['before']:.4f}",
            f"{r['after']:.4f}",
            f"{r['change']:+.4f}",
            escape(effect),
        )
    return t


TEST_ROLES = {"confirming": "confirming snapshot", "final": "final weights"}


def test_line(summary: dict[str, Any]) -> str | None:
    """The test-set figures, a line each (the confirming snapshot's, then the final
    weights' where they differ): step, the target's metric, targets and seconds, and
    why the confirming snapshot was not scored where it was not; None without a test
    split."""
    from ledgerlm.ledger.compare import test_records  # not at CLI start-up

    metric = summary["run"].get("target_metric") or "loss"
    if metric.startswith("task/"):  # a test set holds no tasks: its loss
        metric = "loss"
    unit = "bit/byte" if metric.startswith("bpb") else "nat/token"
    lines = []
    for r in test_records(summary):
        value = r["metrics"].get(f"test/{metric}", r["metrics"].get("test/loss"))
        shown = f"{metric} {value:.4f} {unit}" if value is not None else "-"
        took = f", {fmt_seconds(r['seconds'])}" if r.get("seconds") is not None else ""
        lines.append(
            f"test set, {TEST_ROLES.get(r['role'], r['role'])} at step {r['step']}: "
            f"{shown} over {r['targets']:,} targets{took}"
        )
        if r.get("note"):
            lines.append(f"  ({r['note']})")
    return "\n".join(lines) or None


def held_out_table(held: dict[str, Any]) -> FitTable:
    """Each run's validation figure beside its test figures, on the baseline's metric
    (``ledger.compare.validation_and_test``); the run chosen on validation marked."""
    t = FitTable(title=f"validation and test ({escape(held['metric'])})", show_edge=False)
    for col in ("run", "validation", "test, confirming", "test, final"):
        t.add_column(col, justify="left" if col == "run" else "right")
    for r in held["rows"]:
        keys = ("validation", "test_confirming", "test_final")
        cells = ["-" if r[k] is None else f"{r[k]:.4f}" for k in keys]
        mark = " (chosen)" if r["run"] == held["chosen"] else ""
        t.add_row(escape(r["run"]) + mark, *cells)
    return t


def seed_metrics_table(groups: list[dict[str, Any]]) -> FitTable | None:
    """Per seed group of two runs or more, each final metric (the validation loss, every
    task metric: ``ledger.compare.seed_groups``) as mean, sample std, min-max and n."""
    rows = [(g, m) for g in groups if g["n"] >= 2 for m in g["final_metrics"]]
    if not rows:
        return None
    t = FitTable(title="seed groups: final metrics over seeds", show_edge=False)
    for col in ("group", "metric", "mean", "std", "min-max", "n"):
        t.add_column(col, justify="left" if col in ("group", "metric") else "right")
    for g, m in rows:
        t.add_row(
            str(g["group"]),
            escape(m["metric"]),
            f"{m['mean']:.4f}",
            "-" if m["std"] is None else f"{m['std']:.4f}",
            f"{m['min']:.4f}-{m['max']:.4f}",
            str(m["n"]),
        )
    return t


def _tokens(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def plan_table(planned: dict[str, Any]) -> FitTable:
    """A mixture plan (``MixturePlan.to_dict()``): per domain S_i, p_i, E[D_i], e_i."""
    t = FitTable(
        title=f"mixture plan for {planned['budget_tokens']:,} training tokens", show_edge=False
    )
    for col in ("domain", "pool S (train tokens)", "weight p", "expected tokens pD", "epochs pD/S"):
        t.add_column(col, justify="left" if col == "domain" else "right")
    for d in planned["domains"]:
        e = d["exposure"]
        epochs = "inf" if e is None else f"{e:.3g}"
        if d["over"]:
            epochs = f"[yellow]{epochs}[/]"
        t.add_row(
            escape(d["domain"]),
            f"{d['pool']:,}",
            f"{d['weight']:.4f}",
            _tokens(d["expected_tokens"]),
            epochs,
        )
    return t


def plan_stage_lines(planned: dict[str, Any]) -> list[str]:
    """One plain line per segment of a staged mixture (none for a single mixture)."""
    segments = planned.get("segments", [])
    if len(segments) < 2:
        return []
    lines, start = [], 0
    for i, seg in enumerate(segments):
        end = seg["end"]
        where = f"tokens {start:,}-{end:,}" if end is not None else f"tokens {start:,}-end"
        weights = (
            "natural"
            if seg["natural"]
            else ", ".join(f"{k} {v:g}" for k, v in seg["weights"].items() if v)
        )
        lines.append(f"stage {i + 1}: {where}: {weights}")
        start = end if end is not None else start
    return lines


def mixture_table(rows: list[dict[str, Any]]) -> FitTable:
    """Configured weights beside the tokens a run really consumed per domain
    (``ledger.mixture.realised``)."""
    t = FitTable(title="mixture: configured and consumed", show_edge=False)
    cols = ("domain", "weight", "planned tokens", "consumed", "share", "pool", "epochs")
    for col in cols:
        t.add_column(col, justify="left" if col == "domain" else "right")
    for r in rows:
        t.add_row(
            escape(r["domain"]),
            "-" if r["weight"] is None else f"{r['weight']:.4f}",
            _tokens(r["planned_tokens"]),
            f"{r['tokens']:,}",
            "-" if r["share"] is None else f"{r['share']:.4f}",
            _tokens(r["pool"]),
            "-" if r["exposure"] is None else f"{r['exposure']:.3g}",
        )
    return t


def warning_lines(summary: dict[str, Any]) -> list[str]:
    """The run's warning events (``ledger.events``), a line each: step, kind, message."""
    found = warnings(summary)
    lines = [f"events: {len(found)} warning{'s' if len(found) != 1 else ''}"] if found else []
    for e in found:
        at = f"step {e['step']} " if e["step"] is not None else ""
        lines.append(f"  {at}{e['kind']}: {' '.join(str(e['message']).split())}")
    return lines


def device_hours(hours: float) -> str:
    """Device-hours to 3 significant digits (a tiny run's are thousandths or less)."""
    return fmt_g(hours) if hours else "0"


def search_table(search: dict[str, Any]) -> FitTable:
    """A search's bill (``search``: its kind, id and bill; ``ledger.search.search_rows``):
    per group of trials (reached, not reached, pruned, failed) their count, wall time
    and device-hours, the time around the trials, then all."""
    bill = search["bill"]
    t = FitTable(show_edge=False)
    t.add_column("trials")
    for col in ("count", "wall", "device-hours"):
        t.add_column(col, justify="right")
    for row in search_rows(bill):
        label = escape(row["group"])
        t.add_row(
            f"[bold]{label}[/]" if row["group"] == "all" else label,
            "" if row["trials"] is None else str(row["trials"]),
            fmt_seconds(row["seconds"]),
            device_hours(row["device_hours"]),
        )
    return t


def print_search_bill(search: dict[str, Any]) -> None:
    """A search's heading (``tune study S: 4 trials``, one line however long its id) and
    its table: what ``ledger show``, ``run``, ``mix search`` and ``scale run`` print."""
    console.print(escape(search_title(search)), highlight=False, soft_wrap=True)
    console.print(search_table(search))


def print_searches(summary: dict[str, Any]) -> None:
    """Each search charged to the run (its ``search`` phases that hold a bill)."""
    for found in search_charges(summary):
        print_search_bill(found)
