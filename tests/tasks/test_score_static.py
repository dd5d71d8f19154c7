"""Under ``train.compile`` task batches keep the one shape the model was compiled for."""

from __future__ import annotations

import numpy as np
from task_fixtures import CHOICE, task

from ledgerlm.tasks.score import score_task

SEQ = 96


def _shapes(model):
    seen = []
    real = model.forward

    def forward(input_ids, *args, **kwargs):
        seen.append(tuple(input_ids.shape))
        return real(input_ids, *args, **kwargs)

    return seen, forward


def test_static_batches_are_all_seq_len_wide_and_score_the_same(
    tmp_path, model, tok, specials, monkeypatch
):
    choice_task = task(tmp_path / "c.jsonl", CHOICE, "choice")
    seen, forward = _shapes(model)
    monkeypatch.setattr(model, "forward", forward)
    bos = specials["bos"]
    free = score_task(model, choice_task, tok, bos, seq_len=SEQ, rows=3)
    widths = {s for s in seen}
    seen.clear()
    static = score_task(model, choice_task, tok, bos, seq_len=SEQ, rows=3, static=True)
    assert set(seen) == {(3, SEQ)}  # one shape: the validation batches'
    assert widths != {(3, SEQ)}  # without it, the batches are narrower
    for key in ("acc", "acc_norm"):
        assert free.per_item[key] == static.per_item[key]
    np.testing.assert_allclose(
        np.concatenate(free.per_item["loglik"]),
        np.concatenate(static.per_item["loglik"]),
        rtol=1e-5,
    )
