"""``ledgerlm scale serving-cost``: what one generated token costs on this machine, in
FLOPs and seconds, at a batch and a context; ``-o`` keeps it for ``scale recommend
--serving``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from ledgerlm.cli.table import FitTable
from ledgerlm.cli.ui import DEFAULT_WS, JsonOpt, WorkspaceOpt, console, friendly_errors
from ledgerlm.cli.ui import fmt_g as _g


def _table(r: dict[str, Any]) -> FitTable:
    f = r["flops_per_token"]
    t = FitTable(title=f"serving cost of {escape(r['source'])}", show_edge=False)
    t.add_column("")
    t.add_column("value", justify="right")
    rows = [
        ("batch x context", f"{r['batch']} x {r['context']}"),
        ("decode step (whole batch)", f"{r['step_seconds'] * 1e3:.3g} ms"),
        ("seconds / generated token", _g(r["seconds_per_token"])),
        ("generated tokens / s", f"{r['tokens_per_s']:,.0f}"),
        ("prefill of the context", f"{r['prefill_seconds'] * 1e3:.3g} ms"),
        ("FLOPs / token: matmul 2N", _g(f["matmul"])),
        ("FLOPs / token: attention 4 L T d", _g(f["attention"])),
        ("FLOPs / token: total", _g(f["total"])),
        ("achieved GFLOP/s (decode)", f"{r['achieved_flops_per_s'] / 1e9:.3g}"),
        ("training tokens / s (fwd + bwd)", f"{r['train_tokens_per_s']:,.0f}"),
        ("serving FLOPs / param / token: analytic", f"{r['analytic_flops_per_param']:.3g}"),
        ("  training-equivalent, measured", f"{r['effective_flops_per_param']:.3g}"),
    ]
    for name, value in rows:
        t.add_row(name, value)
    return t


# what the library's argument errors name, as this command's flags
SERVING_FLAGS = {"model": "a RUN", "shape": "--model-shape"}


@friendly_errors(flags=SERVING_FLAGS)
def serving_cost_cmd(
    run: Annotated[
        str | None,
        typer.Argument(help="Run whose model to serve (an id or a unique part of one)."),
    ] = None,
    model_shape: Annotated[
        str | None,
        typer.Option(
            "--model-shape",
            help="Instead of a run, a random-initialised model: "
            "d_model=64,n_layers=2,n_heads=2,vocab=512 (n_heads, ffn_mult optional).",
        ),
    ] = None,
    batch: Annotated[int, typer.Option("--batch", min=1, help="Rows decoded at once.")] = 1,
    context: Annotated[
        int, typer.Option("--context", min=1, help="Prompt tokens in the cache (T).")
    ] = 512,
    new_tokens: Annotated[
        int, typer.Option("--new-tokens", min=1, help="Decode steps timed per repeat.")
    ] = 16,
    repeats: Annotated[
        int, typer.Option("--repeats", min=1, help="Timed repeats (the median is reported).")
    ] = 5,
    threads: Annotated[
        int | None,
        typer.Option(
            "--threads",
            min=1,
            help="CPU threads torch uses while measuring (default: its own choice, one per "
            "core). Fewer than the cores steadies the figures on a machine others share.",
        ),
    ] = None,
    device: Annotated[
        str, typer.Option("--device", help="auto (CUDA when present), cpu or cuda.")
    ] = "auto",
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Write the result as JSON (for recommend --serving)."),
    ] = None,
    workspace: WorkspaceOpt = DEFAULT_WS,
    as_json: JsonOpt = False,
) -> None:
    """Time a model's decoding (KV cache, greedy) at a batch and a context length.

    Reports seconds and FLOPs per generated token: 2N for the matmuls plus 4 n_layers T d
    for attention over the T positions of the context, the achieved FLOP/s, and the
    serving FLOPs per parameter per token two ways: analytic (FLOPs / N, >= 2) and
    training-equivalent measured (6 x seconds per served token / seconds per trained
    token of a forward + backward step of the same model and context), which
    `scale recommend --serving FILE` uses for the lifecycle table.
    """
    from ledgerlm.lab.serving import measure_serving
    from ledgerlm.workspace import Workspace, atomic_write_json

    measured = measure_serving(
        run,
        batch,
        context,
        new_tokens,
        repeats,
        device,
        workspace=Workspace(workspace),
        threads=threads,
        shape=model_shape,
    )
    result = measured.to_dict()
    if output is not None:
        atomic_write_json(output, result)
        result["output"] = str(output)
    if as_json:
        console.print_json(json.dumps(result))
        return
    m = result["model"]
    console.print(
        f"model: d_model {m['d_model']}, {m['n_layers']} layers, {m['n_heads']} heads, vocab "
        f"{m['vocab']:,}, N = {m['N']:,} (the scaling N: embedding excluded), {result['dtype']}",
        highlight=False,
    )
    console.print(_table(result))
    console.print(
        f"on {escape(result['machine'])} ({escape(result['device'])}); median of "
        f"{repeats} repeats of {new_tokens} decode steps after a warm-up",
        highlight=False,
        soft_wrap=True,
    )
    if output is not None:
        console.print(
            f"wrote {escape(str(output))}; next: ledgerlm scale recommend ... --serving "
            f"{escape(str(output))}",
            highlight=False,
            soft_wrap=True,
        )
