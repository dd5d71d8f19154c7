"""Packing documents into fixed-length rows, with boundaries that mean something.

A row holds ``seq_len + 1`` tokens; ``input = row[:-1]`` and ``target = row[1:]``.
Every token carries the id ``c`` of the document segment it came from (``-1`` for
padding). The label mask is ``m_i = valid_i & valid_{i+1} & (c_i == c_{i+1})``, so
the EOS -> next BOS transition is never trained, and padding is marked by the
validity mask, never by a token value.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

IGNORE_INDEX = -100


@dataclass
class Batch:
    """One micro-batch; every tensor is (B, T) with T = seq_len."""

    input_ids: torch.Tensor
    targets: torch.Tensor
    doc_ids: torch.Tensor  # segment of each input token, -1 = padding
    position_ids: torch.Tensor
    loss_mask: torch.Tensor  # bool: this target is supervised
    valid: torch.Tensor  # bool: this input position holds a real token
    target_domains: torch.Tensor  # domain id of each target token, -1 = padding

    @property
    def num_targets(self) -> int:
        return int(self.loss_mask.sum())

    def to(self, device: torch.device | str, pin: bool = False) -> Batch:
        """This batch on ``device``; ``pin`` copies through pinned host memory so the
        transfer to a GPU does not block the host."""
        fields = {}
        for f in dataclasses.fields(self):
            t = getattr(self, f.name)
            if pin and t.device.type == "cpu":
                t = t.pin_memory()
            fields[f.name] = t.to(device, non_blocking=pin)
        return Batch(**fields)

    def labels(self) -> torch.Tensor:
        """Targets with unsupervised positions set to IGNORE_INDEX (the usual HF convention)."""
        return self.targets.masked_fill(~self.loss_mask, IGNORE_INDEX)


def position_ids(doc_ids: np.ndarray, reset: bool) -> np.ndarray:
    """Positions restart at 0 where the segment id changes (when ``reset``), else 0..T-1."""
    b, t = doc_ids.shape
    idx = np.broadcast_to(np.arange(t), (b, t))
    if not reset:
        return idx.copy()
    starts = np.ones((b, t), dtype=bool)
    starts[:, 1:] = doc_ids[:, 1:] != doc_ids[:, :-1]
    seg_start = np.maximum.accumulate(np.where(starts, idx, 0), axis=1)
    return idx - seg_start


def target_validity(doc_ids: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Validity marked on the *predicted* token of full rows (..., T+1): token i is a
    supervised target when it and the token before it are real and of one segment.

    Position 0 predicts nothing (no prefix), so it is always False; ``[..., 1:]`` is
    the label mask ``m_i = 1[c_i = c_{i+1}]`` of the T prediction rows. Requirement P2:
    two packed documents A, B of 4 tokens each give [0,1,1,1,0,1,1,1].
    """
    doc_ids, valid = np.asarray(doc_ids), np.asarray(valid, bool)
    out = np.zeros(valid.shape, dtype=bool)
    out[..., 1:] = valid[..., :-1] & valid[..., 1:] & (doc_ids[..., :-1] == doc_ids[..., 1:])
    return out


def make_batch(
    tokens: np.ndarray,
    doc_ids: np.ndarray,
    valid: np.ndarray,
    domains: np.ndarray | None = None,
    reset_positions: bool = True,
) -> Batch:
    """(B, T+1) rows -> a shifted Batch with label mask m_i = 1[c_i = c_{i+1}] on valid pairs."""
    tokens, doc_ids, valid = np.asarray(tokens), np.asarray(doc_ids), np.asarray(valid, bool)
    if domains is None:
        domains = np.zeros_like(doc_ids)
    in_docs = np.where(valid[:, :-1], doc_ids[:, :-1], -1)
    loss_mask = target_validity(doc_ids, valid)[:, 1:]
    return Batch(
        input_ids=torch.from_numpy(np.ascontiguousarray(tokens[:, :-1], dtype=np.int64)),
        targets=torch.from_numpy(np.ascontiguousarray(tokens[:, 1:], dtype=np.int64)),
        doc_ids=torch.from_numpy(np.ascontiguousarray(in_docs, dtype=np.int64)),
        position_ids=torch.from_numpy(position_ids(in_docs, reset_positions).astype(np.int64)),
        loss_mask=torch.from_numpy(loss_mask),
        valid=torch.from_numpy(np.ascontiguousarray(valid[:, :-1])),
        target_domains=torch.from_numpy(
            np.where(valid[:, 1:], domains[:, 1:], -1).astype(np.int64)
        ),
    )


def pack_documents(
    docs: Iterable[tuple[np.ndarray, int]],
    row_len: int,
    bos: int,
    eos: int,
    pad: int,
    pad_last: bool = True,
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """Wrap each (token ids, domain) document as BOS+ids+EOS and cut the stream into rows.

    Yields (tokens, segment ids, domains, valid) arrays of length ``row_len``. Each
    document gets a fresh segment id, so the same document placed twice in a row
    (e.g. across an epoch boundary) is still two segments. A document longer than
    a row continues in the next one. Work is O(tokens).
    """
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    held = 0
    for seg, (ids, domain) in enumerate(docs):
        n = len(ids) + 2
        toks = np.empty(n, dtype=np.int64)
        toks[0], toks[1:-1], toks[-1] = bos, ids, eos
        parts.append((toks, np.full(n, seg, np.int64), np.full(n, domain, np.int64)))
        held += n
        if held < row_len:
            continue
        t, s, d = (np.concatenate(col) for col in zip(*parts, strict=True))
        cut = 0
        ones = np.ones(row_len, dtype=bool)
        while held - cut >= row_len:
            yield t[cut : cut + row_len], s[cut : cut + row_len], d[cut : cut + row_len], ones
            cut += row_len
        parts = [(t[cut:], s[cut:], d[cut:])]
        held -= cut
    if pad_last and held:
        t, s, d = (np.concatenate(col) for col in zip(*parts, strict=True))
        fill = row_len - held
        yield (
            np.concatenate([t, np.full(fill, pad, np.int64)]),
            np.concatenate([s, np.full(fill, -1, np.int64)]),
            np.concatenate([d, np.full(fill, -1, np.int64)]),
            np.arange(row_len) < held,
        )


def batches(
    rows: Iterable[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]],
    batch_rows: int,
    reset_positions: bool = True,
) -> Iterator[Batch]:
    """Group rows into Batches of ``batch_rows`` (the last one may be smaller)."""
    chunk: list[tuple[np.ndarray, ...]] = []
    for row in rows:
        chunk.append(row)
        if len(chunk) == batch_rows:
            yield _stack(chunk, reset_positions)
            chunk = []
    if chunk:
        yield _stack(chunk, reset_positions)


def _stack(chunk: list[tuple[np.ndarray, ...]], reset_positions: bool) -> Batch:
    t, s, d, v = (np.stack(col) for col in zip(*chunk, strict=True))
    return make_batch(t, s, v, d, reset_positions)
