"""The HTML report lists each search charged to a run: its trials by how they ended,
with the wall time and device-hours of each group (runs of a real SQLite ledger)."""

from __future__ import annotations

import re

from ledgerlm.lab.searches import charge, charge_search, trial_summaries
from ledgerlm.ledger import Ledger
from ledgerlm.ledger.search import search_rows
from ledgerlm.report.run.page import render_report
from seed_ledger import seed_run


def test_the_report_lists_the_search_on_the_bill(tmp_path):
    with Ledger(tmp_path / "ledger.db") as ledger:
        trials = []
        for i, status in enumerate(("reached", "pruned", "failed")):
            trials.append(seed_run(ledger, f"s-t{i:02d}", steps=1000, sec_per_step=0.01,
                                   cross_step=500, finish=status))  # fmt: skip
        found = charge("tune", "s<b>&", trials, trial_summaries(ledger, trials), 200.0)
        run = seed_run(ledger, "tiny", steps=1000, sec_per_step=0.01, cross_step=500)
        charge_search(ledger, run, found)
        plain = seed_run(ledger, "plain", steps=1000, sec_per_step=0.01, cross_step=500)
        summaries = [ledger.run_summary(run), ledger.run_summary(plain)]
    page = render_report(summaries)
    assert "<h2>Searches on the bill</h2>" in page
    section = page[page.index("Searches on the bill") :]
    section = section[: section.index("</table>")]
    assert "s&lt;b&gt;&amp;: 3 trials" in section and "s<b>" not in section  # escaped
    cells = [re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td>(.*?)</td>", section)]
    rows = [cells[i : i + 6] for i in range(0, len(cells), 6)]
    want = search_rows(found["bill"])
    assert [r[2] for r in rows] == [r["group"] for r in want]
    assert rows[-1][3:] == ["3", "200.0 s", format(want[-1]["device_hours"], ".3g")]
    assert all(r[0] == run for r in rows)  # the plain run was charged nothing
    assert "Searches on the bill" not in render_report(summaries[1:])
