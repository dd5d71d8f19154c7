"""Hyperparameter search with Optuna (``ledgerlm tune``): every trial a ledger run.

- ``record``: the study's record, ``tune/<study>/study.json``, written before the first
  trial and as each ends (``start_record``, ``load_study``).
"""
