"""``ledgerlm mix fit`` end to end, as a user runs it: CSV files in, a report or JSON out,
one-line errors for bad input. Each call starts the whole CLI (about 3 s on 2 cores), so
the calls of a test run two at a time; the error cases run the CLI's app in process."""

from __future__ import annotations

import csv
import json
import math
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import numpy as np
import pytest

from cli_runner import ledgerlm
from ledgerlm.mixture.dirichlet import dirichlet_around

MARKUP = "[/bold]web"  # a domain name that is also a rich closing tag: printed as itself


def write_csv(path, header, rows) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows([[c if isinstance(c, str) else repr(float(c)) for c in r] for r in rows])


def run_all(*calls: tuple[str, ...]):
    """Every call of ``ledgerlm mix fit ARGS``, two at a time, in the given order."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(lambda args: ledgerlm("mix", "fit", *args, check=False), calls))


def in_process(*calls: tuple[str, ...]):
    """``ledgerlm mix fit ARGS`` through the CLI's own app in this process (no start-up)."""
    from typer.testing import CliRunner

    from ledgerlm.cli.main import app

    out = []
    for args in calls:
        result = CliRunner().invoke(app, ["mix", "fit", *args])
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            raise result.exception  # what would have been a traceback
        out.append(
            SimpleNamespace(returncode=result.exit_code, stdout=result.stdout, stderr=result.stderr)
        )
    return out


def test_reports_fits_and_predictions_as_text_and_json(tmp_path):
    # 48 runs of a smooth loss over 4 domains (LightGBM), with names, a seed and a
    # second result column that are not domains.
    domains = [MARKUP, "code", "math", "books"]
    w = dirichlet_around(np.full(4, 0.25), 3.0, 48, seed=2)
    loss = -(np.log(w + 1e-3) * [0.4, 0.3, 0.2, 0.1]).sum(axis=1)
    runs = tmp_path / "runs.csv"
    write_csv(
        runs,
        ["run", *domains, "loss", "accuracy", "seed"],
        [[f"[red]r{i}", *w[i], loss[i], 1 - loss[i] / 10, float(i)] for i in range(48)],
    )
    new = tmp_path / "new.csv"
    write_csv(new, ["name", *domains], [["first", *w[0]], ["second", *w[1]], ["third", *w[2]]])

    # 12 runs of an exactly linear loss over 3 domains (ridge), and a --predict file of
    # the same runs in reverse order with the domain columns shuffled and an extra column.
    lin_w = dirichlet_around(np.array([0.5, 0.3, 0.2]), 5.0, 12, seed=3)
    lin_y = lin_w @ np.array([2.0, 3.0, 5.0])
    linear = tmp_path / "linear.csv"
    write_csv(
        linear,
        ["web", "code", "math", "loss"],
        [[*r, y] for r, y in zip(lin_w, lin_y, strict=True)],
    )
    reordered = tmp_path / "reordered.csv"
    write_csv(
        reordered,
        ["math", "note", "web", "code"],
        [[r[2], "x", r[0], r[1]] for r in lin_w[::-1]],
    )
    flat = tmp_path / "flat.csv"
    write_csv(flat, ["web", "code", "loss"], [[*r[:2] / r[:2].sum(), 3.0] for r in lin_w])

    text, lin, const = run_all(
        ("--csv", str(runs), "--target", "loss", "--ignore", "accuracy", "--ignore", "seed",
         "--predict", str(new), "--candidates", "20000"),
        ("--csv", str(linear), "--target", "loss", "--predict", str(reordered), "--json"),
        ("--csv", str(flat), "--target", "loss", "--json"),
    )  # fmt: skip

    assert text.returncode == 0, text.stderr
    out = text.stdout
    assert "read 48 rows x 4 domains" in out and "target loss" in out
    assert "model: lightgbm" in out
    assert "cross-validated (5 folds): Spearman" in out and "MAE" in out and "RMSE" in out
    assert MARKUP in out  # the domain name, printed as itself
    assert "recommended" in out and "table mean" in out
    for d in domains:
        assert any(line.strip().startswith(d) for line in out.splitlines()), d
    assert "predicted loss of the recommended mixture:" in out
    assert "around the table's mean mixture" in out
    rows = [line.split() for line in out.splitlines() if line.split()[:1] in (["1"], ["2"], ["3"])]
    assert [r[2] for r in rows] == ["first", "second", "third"]
    assert text.stderr == ""  # 48 rows, a good Spearman: no warning

    assert lin.returncode == 0, lin.stderr
    result = json.loads(lin.stdout)
    assert result["rows"] == 12 and result["domains"] == ["web", "code", "math"]
    assert result["model"] == "linear" and result["target"] == "loss"
    assert result["cv"]["folds"] == 5 and result["cv"]["spearman"] > 0.99
    assert result["cv"]["mae"] < 1e-3 and result["cv"]["rmse"] < 1e-3
    assert list(result["recommended"]) == ["web", "code", "math"]
    assert math.fsum(result["recommended"].values()) == pytest.approx(1.0)
    best = np.array(list(result["recommended"].values()))
    assert result["predicted_target"] == pytest.approx(float(best @ [2.0, 3.0, 5.0]), rel=1e-3)
    assert best[0] > lin_w.mean(axis=0)[0]  # web is the cheapest domain
    # the predictions follow the --predict file's rows (reversed) and columns (by name)
    assert len(result["predictions"]) == 12
    np.testing.assert_allclose(result["predictions"], lin_y[::-1], atol=1e-3)
    assert "only 12 rows (< 16)" in lin.stderr and "weak evidence" in lin.stderr
    assert len(lin.stderr.strip().splitlines()) == 1

    assert const.returncode == 0, const.stderr
    flat_result = json.loads(const.stdout)  # strict JSON: no bare NaN
    assert flat_result["cv"]["spearman"] is None and "predictions" not in flat_result
    assert "Spearman is undefined" in const.stderr


def test_bad_input_is_one_error_line_naming_the_file_and_line(tmp_path):
    good = tmp_path / "runs.csv"
    write_csv(good, ["web", "code", "loss"], [[0.5, 0.5, 2.0], [0.3, 0.7, 2.1], [0.8, 0.2, 1.9]])
    bad = tmp_path / "bad.csv"
    write_csv(bad, ["web", "code", "loss"], [[0.5, 0.5, 2.0], [0.3, 0.8, 2.1], [0.8, 0.2, 1.9]])
    partial = tmp_path / "partial.csv"
    write_csv(partial, ["web", "other"], [[0.5, 0.5]])
    missing = tmp_path / "missing.csv"

    procs = in_process(
        ("--csv", str(missing), "--target", "loss"),
        ("--csv", str(good), "--target", "val_loss"),
        ("--csv", str(bad), "--target", "loss"),
        ("--csv", str(good), "--target", "loss", "--predict", str(partial)),
        ("--csv", str(good), "--target", "loss", "--ignore", "seed"),
    )
    expected = [
        f"error: {missing}: no such file",
        f"error: {good}:1: --target column 'val_loss' is not in the header (columns: web, "
        "code, loss)",
        f"error: {bad}:3: the weights sum to 1.1, not 1",
        f"error: {partial}:1: no column for domain 'code'",
        f"error: {good}:1: --ignore column 'seed' is not in the header (columns: web, code, loss)",
    ]
    for proc, start in zip(procs, expected, strict=True):
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert proc.stdout == ""
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(start), proc.stderr


def test_a_published_table_rounded_to_3_decimals_fits_and_says_what_it_renormalized(tmp_path):
    # 256 runs x 17 domains as a paper prints them: Dirichlet weights rounded to 3
    # decimals (row sums 0.997 to 1.003), a loss that falls with the share of three
    # domains, plus noise.
    k, n = 17, 256
    domains = [f"domain {i}" for i in range(k)]
    w = dirichlet_around(np.full(k, 1 / k), float(k), n, seed=5)
    value = np.r_[6.0, 4.0, 3.0, np.zeros(k - 3)] + 1.0
    loss = 3.0 - np.log(w @ value) + np.random.default_rng(1).normal(0, 0.005, n)
    printed = [[f"{x:.3f}" for x in row] for row in w]
    sums = np.array([sum(map(float, row)) for row in printed])
    off = int(np.sum(np.abs(sums - 1) > 1.0005e-3))  # beyond 1e-3 with the float's slack
    assert off > n // 10 and np.abs(sums - 1).max() < 17 * 0.0005  # what the table is
    table = tmp_path / "published.csv"
    write_csv(table, ["run", *domains, "loss"], [[f"r{i}", *printed[i], loss[i]] for i in range(n)])

    # three rows that sum to 1.001 (within 3 x 0.0005), one that does not fit its rounding
    small = tmp_path / "three.csv"
    rows = [["0.334", "0.333", "0.334", "2.0"], ["0.2", "0.3", "0.5", "2.1"]]
    write_csv(small, ["a", "b", "c", "loss"], [*rows, ["0.5", "0.25", "0.25", "1.9"]])
    wrong = tmp_path / "wrong.csv"
    far = [f"{x:.3f}" for x in w[0]]
    far[0] = f"{float(far[0]) + 1.009 - sums[0]:.3f}"  # sums to 1.009; 17 x 0.0005 = 0.0085
    write_csv(wrong, ["run", *domains, "loss"], [*[[f"r{i}", *printed[i], loss[i]]
              for i in range(4)], ["far", *far, 2.0]])  # fmt: skip

    fitted, three, refused = in_process(
        ("--csv", str(table), "--target", "loss", "--candidates", "5000", "--json"),
        ("--csv", str(small), "--target", "loss", "--json"),
        ("--csv", str(wrong), "--target", "loss"),
    )
    assert fitted.returncode == 0, fitted.stderr
    result = json.loads(fitted.stdout)
    assert result["rows"] == n and result["domains"] == domains and result["model"] == "lightgbm"
    assert result["cv"]["spearman"] > 0.95
    assert math.fsum(result["recommended"].values()) == pytest.approx(1.0)
    best = np.array(list(result["recommended"].values()))
    assert best[0] > w[:, 0].mean()  # more of the domain that lowers the loss most
    message = (
        f"{table}: renormalized {off} of {n} rows whose weights sum to 1 only within their "
        "3-decimal rounding (sums "
    )
    assert [m for m in result["warnings"] if "renormalized" in m] == [
        message + f"{sums[np.abs(sums - 1) > 1.0005e-3].min():.6g} to "
        f"{sums[np.abs(sums - 1) > 1.0005e-3].max():.6g})"
    ]
    assert " ".join(fitted.stderr.split()).count("warning: ") == 1

    assert three.returncode == 0, three.stderr
    assert json.loads(three.stdout)["rows"] == 3

    assert refused.returncode == 2 and refused.stdout == ""
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1, refused.stderr
    assert lines[0].startswith(f"error: {wrong}:6: the weights sum to ")
    assert "(tolerance 0.0085 for 17 weights at 3 decimals;" in " ".join(refused.stderr.split())
