"""Downstream tasks scored on a model: a task file's records (``items``), their scoring
(``score``: ``choice`` by log-likelihood, ``bpb`` of the gold continuation, ``exact`` by
greedy generation with the KV cache) and the standard errors and intervals of the
metrics (``stats``). Evaluations in the loop (``train.evaluate``) and after the fact
(``ledgerlm eval``) call the same functions."""
