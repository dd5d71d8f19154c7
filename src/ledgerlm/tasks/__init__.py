"""Downstream tasks scored on a model: a task file's records (``items``), the harness's
cut of a context and its continuation into tokens (``encoding``), their scoring
(``score``: ``choice`` by log-likelihood, ``bpb`` of the gold continuation, ``exact`` by
greedy generation with the KV cache, ``generate``) and the standard errors and intervals
of the metrics (``stats``). Evaluations in the loop (``train``) and after the fact
(``ledgerlm eval``) call the same functions."""
