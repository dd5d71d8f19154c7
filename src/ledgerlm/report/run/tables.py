"""The run report's HTML tables: the mixture (configured beside consumed), the
searches charged to each run, and the comparison of ``ledger compare``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ledgerlm.ledger.compare import TABLE_COLUMNS, comparison_rows, final_domain_losses, seed_spread
from ledgerlm.ledger.mixture import realised
from ledgerlm.ledger.search import search_charges, search_rows, search_title
from ledgerlm.report.plots import e, run_color


def _num(v: Any, fmt: str = ",") -> str:
    return "-" if v is None else e(format(v, fmt))


def swatch(i: int) -> str:
    return f'<span class="swatch" style="background:{run_color(i)}"></span>'


def _table(head: Sequence[str], rows: Sequence[Sequence[str]], cls: str = "compare") -> str:
    """A table in a box that scrolls sideways itself, so the page never does."""
    return (
        f'<div class="scroll"><table class="{cls}"><thead><tr>'
        + "".join(f"<th>{e(h)}</th>" for h in head)
        + "</tr></thead><tbody>"
        + "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
        + "</tbody></table></div>"
    )


def comparison_html(result: Mapping[str, Any]) -> str:
    """The table of ``ledger compare`` (``comparison_rows``) with the device-hours to
    target beside the wall time, why each run is classed as it is (whether it is sooner
    in wall time but dearer in device time, whether its validation loss improved while
    a task metric did not), then the seed groups with each final metric's spread, the
    final figure and the rules."""
    rows = []
    for i, row in enumerate(comparison_rows(result)):
        c = row["comparison"]
        if row["reached"]:
            ttt = f"{row['time_to_target']:,.1f} s"
        elif row["final_value"] is not None:
            ttt = f"not reached (final {row['final_value']:.4f})"
        else:
            ttt = "not reached"
        why = "" if c is None else c["reason"]
        if c is not None and c.get("wall_device"):
            why += "; " + c["wall_device"]
        if c is not None and c["task_check"]["line"]:
            why += "; " + c["task_check"]["line"]
        if c is not None and c["recipe_diff"]:
            why += "; recipe: " + "; ".join(c["recipe_diff"][:6])
            if len(c["recipe_diff"]) > 6:
                why += f"; ... {len(c['recipe_diff']) - 6} more"
        rows.append(
            [
                swatch(i) + e(row["run"]),
                e(row["seed"]),
                e(ttt),
                _num(row["device_hours"], ".3g"),
                *(e(cell) for cell in row["cells"]),
                e(row["verdict"]),
                e(why),
            ]
        )
    groups = []
    for g in result["seed_groups"]:
        if g["n"] < 2:
            continue
        seeds = ", ".join(str(x) for x in g["seeds"])
        groups.append(
            f"<li>group {e(g['group'])}: {e(', '.join(g['runs']))} (seeds {e(seeds)}): reached "
            f"{g['n_reached']}/{g['n']}; {e(seed_spread(g))}</li>"
        )
    head = list(TABLE_COLUMNS)
    head.insert(head.index("time to target") + 1, "device-hours")
    out = _table((*head, "why"), rows)
    if groups:
        out += "<h3>Seed groups</h3><ul>" + "".join(groups) + "</ul>"
        out += seed_metrics_html(result["seed_groups"])
    out += held_out_html(result["held_out"])
    out += f'<p class="final">{e(result["final_figure"])}</p>'
    out += f'<p class="rule"><b>Rule.</b> {e(result["rule"])} {e(result["device_rule"])}</p>'
    return out


def seed_metrics_html(groups: Sequence[Mapping[str, Any]]) -> str:
    """Per seed group of two runs or more, each final metric (the validation loss, every
    task metric) as mean, sample std, min-max and n; empty without such a group."""
    rows = [
        [
            e(g["group"]),
            e(m["metric"]),
            _num(m["mean"], ".4f"),
            _num(m["std"], ".4f"),
            e(f"{m['min']:.4f}-{m['max']:.4f}"),
            _num(m["n"]),
        ]
        for g in groups
        if g["n"] >= 2
        for m in g["final_metrics"]
    ]
    if not rows:
        return ""
    return _table(("group", "metric", "mean", "std", "min-max", "n"), rows)


def held_out_html(held: Mapping[str, Any]) -> str:
    """Each run's validation figure beside its test figures (the confirming snapshot's
    and the final weights'), the run chosen on validation marked, and the warning when
    it is not the best on test. Empty when no run has a test figure."""
    if not any(r["test"] is not None for r in held["rows"]):
        return ""
    rows = []
    for r in held["rows"]:
        chosen = " (chosen on validation)" if r["run"] == held["chosen"] else ""
        figures = (r["validation"], r["test_confirming"], r["test_final"])
        rows.append([e(r["run"] + chosen), *(_num(v, ".4f") for v in figures)])
    out = f"<h3>Validation and test ({e(held['metric'])})</h3>"
    out += _table(("run", "validation", "test, confirming snapshot", "test, final weights"), rows)
    if held["warning"]:
        out += f'<p class="warning">{e(held["warning"])}</p>'
    return out


def mixture_html(summaries: Sequence[Mapping[str, Any]]) -> str:
    """Per run and domain: the configured weight beside the tokens consumed, their share
    and the epochs over the domain's train tokens; and each domain's final validation
    loss. Empty when no run counted tokens per domain."""
    head = ("run", "domain", "weight", "consumed tokens", "share", "epochs", "final val loss")
    rows = []
    for i, s in enumerate(summaries):
        finals = final_domain_losses(s)
        for r in realised(s):
            rows.append(
                [
                    swatch(i) + e(s["run"]["id"]),
                    e(r["domain"]),
                    _num(r["weight"], ".4f"),
                    _num(r["tokens"]),
                    _num(r["share"], ".4f"),
                    _num(r["exposure"], ".3g"),
                    _num(finals.get(r["domain"]), ".4f"),
                ]
            )
    if not rows:
        return ""
    return "<h2>Mixture: configured and consumed</h2>" + _table(head, rows)


def search_html(summaries: Sequence[Mapping[str, Any]]) -> str:
    """Per run, each search charged to it (``ledger.search``): its trials by how they
    ended (reached, not reached, pruned, failed), the wall time and device-hours of each
    group, and the whole search. Empty when no run was charged a search."""
    head = ("run", "search", "trials", "count", "wall", "device-hours")
    rows = []
    for i, s in enumerate(summaries):
        for found in search_charges(s):
            for row in search_rows(found["bill"]):
                rows.append(
                    [
                        swatch(i) + e(s["run"]["id"]),
                        e(search_title(found)),
                        e(row["group"]),
                        _num(row["trials"]),
                        e(f"{row['seconds']:,.1f} s"),
                        _num(row["device_hours"], ".3g"),
                    ]
                )
    if not rows:
        return ""
    return "<h2>Searches on the bill</h2>" + _table(head, rows)
