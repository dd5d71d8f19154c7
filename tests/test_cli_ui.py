"""The number formats the commands share."""

from __future__ import annotations

from ledgerlm.cli.ui import fmt_g


def test_fmt_g_keeps_three_digits_and_writes_exponents_unpadded():
    assert fmt_g(2e5) == "2e5"
    assert fmt_g(1.2e11) == "1.2e11"
    assert fmt_g(3.14159e-5) == "3.14e-5"
    assert fmt_g(409600) == "4.1e5"
    assert fmt_g(0.5) == "0.5"
    assert fmt_g(123) == "123"
