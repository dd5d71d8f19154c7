"""``ledgerlm data``: build and inspect data versions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from ledgerlm.cli.render import funnel_rows
from ledgerlm.cli.table import FitTable
from ledgerlm.cli.ui import (
    DEFAULT_WS,
    JsonOpt,
    NoVerifyOpt,
    RichProgress,
    SetOpt,
    WorkspaceOpt,
    console,
    friendly_errors,
    load_recipe,
)
from ledgerlm.ledger.mixture import consumed_by_runs
from ledgerlm.workspace import Workspace

app = typer.Typer(help="Build and inspect data versions.", no_args_is_help=True)


def _cell(value):
    """A table cell from a manifest: text escaped (rich reads markup in cells), None blank."""
    return escape(value) if isinstance(value, str) else value


@app.command("prepare")
@friendly_errors
def prepare(
    recipe: Annotated[Path, typer.Argument(help="Recipe TOML file (its [data] section).")],
    workspace: WorkspaceOpt = DEFAULT_WS,
    set_: SetOpt = None,
    executor: Annotated[
        str | None,
        typer.Option(help="Where shards run: local (process pool) or ray. Default: the recipe's."),
    ] = None,
    workers: Annotated[
        int | None, typer.Option(help="Parallel shard workers (0 = all cores).")
    ] = None,
    no_verify: NoVerifyOpt = False,
    repair: Annotated[
        str | None,
        typer.Option(
            "--repair",
            metavar="VERSION",
            help="Replace this damaged data or tokens version of the recipe (an id or a "
            "unique prefix, as the error named it): remove it and build it again.",
        ),
    ] = None,
) -> None:
    """Read, clean, deduplicate and split documents into a content-addressed data version.

    Relative input paths are resolved against the current directory. An interrupted
    build resumes from the shards it finished. A version that exists is reused once
    checked against its manifest (files, sizes, counts, content hashes).
    """
    extra = [f"data.executor={json.dumps(executor)}"] if executor else []
    extra += [f"data.workers={workers}"] if workers is not None else []
    from ledgerlm.data.executor import likely_parallel, start_workers

    loaded = load_recipe(recipe, [*(set_ or []), *extra])
    cfg = loaded.data_stage()
    if likely_parallel([i.path for i in cfg.inputs()]):
        start_workers(cfg.executor, cfg.workers)  # they start while the data stage imports
    from ledgerlm.data.pandas_probe import skip_pandas_probe
    from ledgerlm.data.pipeline import prepare_data

    skip_pandas_probe()  # this process only runs the data stage
    with RichProgress() as progress:
        if repair is not None:
            from ledgerlm.lab.repair import repair_version

            results = repair_version(loaded, Workspace(workspace), repair, progress)
        else:
            results = [prepare_data(cfg, Workspace(workspace), progress, verify=not no_verify)]
    for result in results:
        console.print(escape(version_line(result)))
    from ledgerlm.data.contamination import contamination_warnings

    for line in contamination_warnings(results[0].manifest):
        console.print(f"[yellow]warning[/]: {escape(line)}")


def version_line(result) -> str:
    """A built or reused version, what it holds, and what checking it found."""
    state = "reused" if result.reused else f"built in {result.seconds:.1f} s"
    if result.kind == "tokens":
        held = sum(f["tokens"] for f in result.manifest["files"])
        line = f"tokens version {result.version} ({state}): {held:,} tokens -> {result.path}"
    else:
        c = result.manifest["counts"]
        line = (
            f"data version {result.version} ({state}): {c['records_in']:,} read, "
            f"{c['kept']:,} kept -> {result.path}"
        )
    if v := result.verified:
        how = "sha256" if v["hash"] else "sizes and counts (--no-verify)"
        line += (
            f"\n  verified: {v['files']} files, {v['bytes'] / 1e6:,.1f} MB, {how}, "
            f"in {v['seconds']:.2f} s"
        )
    return line


@app.command("inspect")
@friendly_errors
def inspect(
    version: Annotated[str, typer.Argument(help="Data version id or a unique prefix.")],
    workspace: WorkspaceOpt = DEFAULT_WS,
    as_json: JsonOpt = False,
) -> None:
    """Show a data version's manifest: inputs, steps, counts, files; and the training
    tokens that the runs on it consumed per domain (with their epochs)."""
    ws = Workspace(workspace)
    manifest = ws.manifest("data", ws.resolve_version("data", version))
    consumed = consumed_by_runs(ws.ledger_path, manifest["version"])
    if as_json:
        console.print_json(json.dumps({**manifest, "consumed_by_runs": consumed}))
        return
    c = manifest["counts"]
    console.print(escape(f"data version {manifest['version']}  ({c['conservation']})"))
    if c.get("duplicate_ids"):
        console.print(f"duplicate ids: {c['duplicate_ids']:,} records repeat an earlier id (kept)")
    t = FitTable(show_edge=False)
    for col in ("step", "documents", "detail"):
        t.add_column(col, justify="right" if col == "documents" else "left")
    for step, n, detail in funnel_rows(manifest):
        t.add_row(escape(step), f"{n:,}", escape(detail))
    console.print("[bold]funnel[/]")
    console.print(t)
    groups = next(s for s in manifest["steps"] if s["name"] == "filters")["groups"]
    if groups:
        g = FitTable(show_edge=False)
        for col in ("step", "source", "domain", "lang", "length", "date", "dropped", "reasons"):
            g.add_column(col)
        for row in groups:
            if row["docs_dropped"]:
                cells = (
                    row["step"],
                    row["source"],
                    row["domain"],
                    row["lang"],
                    row["length_bucket"],
                    row["date_bucket"],
                    f"{row['docs_dropped']:,}/{row['docs_seen']:,}",
                    ", ".join(f"{k} {v}" for k, v in row["reasons"].items()),
                )
                g.add_row(*(_cell(cell) for cell in cells))
        console.print("[bold]filters by group[/] (dropped / seen documents)")
        console.print(g)
    top = manifest["clusters"]["top"]
    if top:
        k = FitTable(show_edge=False)
        for col in ("kept", "size", "members"):
            k.add_column(col)
        for cl in top:
            k.add_row(_cell(cl["cluster_id"]), str(cl["size"]), escape(", ".join(cl["members"])))
        console.print("[bold]largest duplicate clusters[/]")
        console.print(k)
    for f in next(s for s in manifest["steps"] if s["name"] == "contamination")["files"]:
        console.print(
            escape(
                f"contamination {f['eval_file']}: {f['contaminated']}/{f['examples']} "
                f"examples ({f['contaminated_fraction']:.1%})"
            )
        )
    for split, fixed in manifest["split"].get("fixed", {}).items():
        console.print(escape(f"{split}: fixed by {fixed['key']} ({', '.join(fixed['sources'])})"))
    from ledgerlm.data.time_split import inspect_lines

    for line in inspect_lines(manifest):
        console.print(escape(line))
    for row in c["by_split_domain"]:
        console.print(
            escape(
                f"  {row['split']:>5} {row['domain']:<8} {row['documents']:>8,} docs "
                f"{row['chars']:>13,} chars"
            )
        )
    if consumed:
        _consumed_table(consumed)


def _consumed_table(consumed: list[dict]) -> None:
    names = sorted({d["domain"] for r in consumed for d in r["domains"]})
    t = FitTable(show_edge=False)
    t.add_column("run")
    for name in names:
        t.add_column(escape(name), justify="right")
    for r in consumed:
        by = {d["domain"]: d for d in r["domains"]}
        cells = []
        for name in names:
            d = by.get(name)
            if d is None:
                cells.append("-")
                continue
            epochs = "" if d["exposure"] is None else f" ({d['exposure']:.2g} ep)"
            cells.append(f"{d['tokens']:,}{epochs}")
        t.add_row(escape(r["run"]), *cells)
    console.print("[bold]tokens consumed per domain by the runs on this version[/] (epochs)")
    console.print(t)
