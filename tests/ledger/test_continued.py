"""Requirement T6: continued pretraining reports every domain before and after."""

import pytest

from ledgerlm.ledger.continued import before_after


def test_seed_example_gain_on_new_and_forgetting_on_old():
    # New domain 1.4 -> 1.0 and old domain 0.9 -> 1.2.
    rows = before_after(
        {"loss": 1.4, "loss/new": 1.4},
        {"loss": 1.0, "loss/new": 1.0},
        {"loss": 0.9, "loss/old": 0.9},
        {"loss": 1.2, "loss/old": 1.2},
    )
    by = {(r["set"], r["domain"]): r for r in rows}
    assert set(by) == {("new", "*"), ("new", "new"), ("initial", "*"), ("initial", "old")}
    new, old = by["new", "new"], by["initial", "old"]
    assert new["effect"] == "gain" and new["amount"] == pytest.approx(0.4)
    assert new["change"] == pytest.approx(-0.4)
    assert old["effect"] == "forgetting" and old["amount"] == pytest.approx(0.3)
    assert old["change"] == pytest.approx(0.3)


def test_a_domain_missing_after_is_left_out_and_improvement_on_old_is_negative_forgetting():
    rows = before_after(
        {"loss": 2.0, "loss/a": 2.0, "loss/b": 3.0},
        {"loss": 1.5, "loss/a": 1.5},
        {"loss": 1.0, "loss/c": 1.0},
        {"loss": 0.8, "loss/c": 0.8},
    )
    assert [(r["set"], r["domain"]) for r in rows] == [
        ("new", "*"),
        ("new", "a"),
        ("initial", "*"),
        ("initial", "c"),
    ]
    assert rows[-1]["amount"] == pytest.approx(-0.2)
