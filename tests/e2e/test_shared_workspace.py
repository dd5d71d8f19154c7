"""The guard on the shared tiny workspace: its digest stays put while the ledger is read
and moves with every kind of write, so ``tiny_workspace`` fails a test that writes."""

from ledgerlm.ledger.store import Ledger

from .conftest import tree_digest


def test_reading_the_ledger_leaves_the_digest_and_every_write_moves_it(
    tiny_workspace_copy, tiny_run_id
):
    ws = tiny_workspace_copy
    made = tree_digest(ws)
    with Ledger(ws / "ledger.db", read_only=True) as ledger:
        assert ledger.run_summary(tiny_run_id)["run"]["status"] == "reached"
    assert tree_digest(ws) == made  # a reader closes its -wal and -shm files
    with Ledger(ws / "ledger.db") as ledger:
        ledger.create_run("another", {}, target_metric="loss", target_value=1.0, eval_every=1)
    assert tree_digest(ws) != made  # a run added to the ledger
    written = tree_digest(ws)
    (ws / "runs" / "new").mkdir()
    assert set(tree_digest(ws)) - set(written) == {"runs/new"}  # an empty folder
