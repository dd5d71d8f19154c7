"""The compute-optimal allocation of a budget under a fitted law, and the lifecycle
table for future requests (``recommend``), every row with its bootstrap interval and
extrapolation flag (N, D, C and tokens per parameter); the serving cost the lifecycle
charges is the default, a stated one or a measured one (``serving_cost``). A budget,
requests or tokens per request that cannot be allocated are an ``ArgumentError`` naming
the argument (``check_budget``), refused before the law is fitted when the caller asks."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ledgerlm.errors import ArgumentError
from ledgerlm.lab.scaling.fit import Fit
from ledgerlm.lab.scaling.summary import fit_summary

TOKENS_PER_REQUEST = 1000.0  # a request's prompt and generated tokens, unless stated

_FIT_KEYS = (
    "params",
    "intervals",
    "residual_rms_log",
    "range",
    "n_distinct",
    "warnings",
    "diagnostics",
)


def trains(row: dict[str, Any]) -> bool:
    """Whether a lifecycle row's model trains on at least one token; when not, serving
    its requests takes the whole budget (no interval, no extrapolation flag)."""
    return row["D"] >= 1


def _requests(requests: str | Sequence[float]) -> list[float]:
    """Requests R as numbers >= 0; a string is split on commas (``0,1e6,1_000_000``)."""
    items = requests.split(",") if isinstance(requests, str) else requests
    out = []
    for item in items:
        given = item.strip().replace("_", "") if isinstance(item, str) else item
        try:
            value = float(given)
        except ValueError:
            raise ArgumentError("{requests}: {given!r} is not a number", given=given) from None
        if not (math.isfinite(value) and value >= 0):
            raise ArgumentError("{requests}: {given!r} is not a number >= 0", given=given)
        out.append(value)
    return out


def check_budget(
    budget: float,
    requests: str | Sequence[float] | None = None,
    tokens_per_request: float = TOKENS_PER_REQUEST,
) -> list[float] | None:
    """The ``requests`` as numbers (None without them), once ``budget`` (FLOPs: a positive
    number), the requests (numbers >= 0; a string is split on commas) and
    ``tokens_per_request`` (a positive number) are ones ``recommend`` can allocate; else
    an ``ArgumentError`` naming the argument. ``recommend`` checks them again."""
    if not (math.isfinite(budget) and budget > 0):
        raise ArgumentError("{budget}: {given!r} is not a positive number of FLOPs", given=budget)
    counted = None if requests is None else _requests(requests)
    if not (math.isfinite(tokens_per_request) and tokens_per_request > 0):
        raise ArgumentError("{tokens_per_request} must be a positive number")
    return counted


def serving_cost(
    serving: str | Path | None = None, inference_kappa: float | None = None
) -> dict[str, Any]:
    """The serving cost the lifecycle table charges, as ``flops_per_param`` (k: FLOPs per
    parameter per served token) and its ``kind``: ``measured`` (the training-equivalent
    figure of a ``scale serving-cost -o`` file ``serving``, with what it measured),
    ``stated`` (``inference_kappa``) or ``default`` (one forward pass,
    ``scaling.allocate.INFERENCE_KAPPA``). Both given is an ``ArgumentError``."""
    from ledgerlm.scaling.allocate import INFERENCE_KAPPA

    if serving is not None and inference_kappa is not None:
        raise ArgumentError("give {serving} FILE or {inference_kappa} K, not both")
    if serving is not None:
        from ledgerlm.lab.serving import read_serving_cost  # imports torch

        return read_serving_cost(Path(serving))[1]
    if inference_kappa is not None:
        return {"kind": "stated", "flops_per_param": inference_kappa}
    return {"kind": "default", "flops_per_param": INFERENCE_KAPPA}


def recommend(
    result: Fit,
    budget: float,
    requests: str | Sequence[float] | None = None,
    tokens_per_request: float = TOKENS_PER_REQUEST,
    inference_kappa: float | None = None,
    serving: str | Path | None = None,
) -> dict[str, Any]:
    """The compute-optimal allocation of a budget C (FLOPs, C = 6 N D) under the fitted
    law, as a JSON-able dict.

    ``N_opt``, ``D_opt``, ``tokens_per_param`` and the predicted ``loss``: each a
    ``point``, with ``lo``/``hi`` carried through the bootstrap when there is one (then
    also ``level`` and ``n_valid_samples``); ``extrapolation``: a warning when the
    budget or the optimum lies outside the fitted range of N, D, C or D/N, else None.
    With ``requests`` (future inference requests R, each of ``tokens_per_request``
    tokens at k N FLOPs a token: 2 by default, the stated ``inference_kappa`` or the one
    measured in the ``serving`` file: ``serving_cost``), ``lifecycle``: one row per R of
    the (N, D) minimising loss when training and serving share the budget, each with its
    bootstrap interval and its extrapolation flag, and the serving cost charged. Then
    ``fit`` (the summary's parameters, intervals, residual RMS, range, distinct points,
    warnings and diagnostics) and ``source``. The budget, requests and tokens per request
    are checked first (``check_budget``).
    """
    from ledgerlm.scaling.allocate import (
        allocation_with_interval,
        compute_optimal,
        extrapolation_warning,
        lifecycle_intervals,
        lifecycle_table,
    )

    counted = check_budget(budget, requests, tokens_per_request)
    used = serving_cost(serving, inference_kappa)
    kappa_inf = float(used["flops_per_param"])
    if not (math.isfinite(kappa_inf) and kappa_inf > 0):
        raise ValueError(f"serving FLOPs per parameter per token {kappa_inf!r} is not positive")
    law, boot = result.law, result.boot
    fitted = fit_summary(result)
    n_opt, d_opt = (float(x) for x in compute_optimal(law.params_, budget))
    loss = float(law.params_.predict(n_opt, d_opt))
    out: dict[str, Any] = {
        "budget": budget,
        "N_opt": {"point": n_opt},
        "D_opt": {"point": d_opt},
        "tokens_per_param": {"point": d_opt / n_opt},
        "loss": {"point": loss},
    }
    if boot is not None:
        alloc = allocation_with_interval(boot.samples, budget, params=law.params_)
        for key in ("N_opt", "D_opt", "tokens_per_param", "loss"):
            out[key] = {k: float(v) for k, v in alloc[key].items()}
        out["level"] = alloc["level"]
        out["n_valid_samples"] = alloc["n_valid"]
    out["extrapolation"] = extrapolation_warning(law.range_, C=budget, N=n_opt, D=d_opt)
    if counted is not None:
        kwargs = {"budget": budget, "inference_kappa": kappa_inf}
        rows = lifecycle_table(law.params_, counted, tokens_per_request, **kwargs)
        bands = (
            lifecycle_intervals(boot.samples, rows, tokens_per_request, **kwargs)
            if boot is not None
            else [None] * len(rows)
        )
        for row, band in zip(rows, bands, strict=True):
            row["extrapolation"] = (
                extrapolation_warning(law.range_, C=row["C_train"], N=row["N"], D=row["D"])
                if trains(row)
                else None
            )
            row["interval"] = band
        out["lifecycle"] = {
            "tokens_per_request": tokens_per_request,
            "inference_kappa": kappa_inf,
            "rows": rows,
            "serving": {**used, "flops_per_param": kappa_inf},
        }
    out["fit"] = {k: fitted[k] for k in _FIT_KEYS}
    out["source"] = result.points.source
    return out
