"""Hyperparameter search with Optuna (``ledgerlm tune``): every trial a ledger run.

- ``record``: the study's record, ``tune/<study>/study.json``, written before the first
  trial and as each ends (``start_record``, ``load_study``), with its wall and device
  time and best trial.
- ``space``: the ``--param`` lines, checked against the recipe, their grid, and a
  trial's values as ``--set`` overrides.
- ``study``: the plan, its id, and the Optuna study (sampler, pruner, storage).
- ``trial``: one trial, a run ``<study>-tNN`` whose pruner rule reports each evaluation
  and may stop it as ``pruned``; the value told to the study (``run_trial``).
- ``executors``: where trials run (this process, a spawn pool, Ray).
- ``ray_executor``: a ``concurrent.futures`` executor over Ray tasks.
- ``run``: the ask-and-tell driver (``tune``), which continues a killed study.

``ledgerlm run RECIPE --from-tune STUDY`` trains the best trial's recipe with the study
on its bill (``lab.searches``).
"""
