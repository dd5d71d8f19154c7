"""Scaling-law fits of the lab's runs (requirements S2-S4), as ``ledgerlm scale fit`` and
``ledgerlm scale recommend`` compute them; the CLI only parses arguments and prints.
A bad argument is an ``ArgumentError`` naming it, which the commands word with their
flags.

- ``points``: the (N, D, loss) points of a sweep, a list of runs or a CSV table, with
  where each came from and its learning rate (``load_points``, ``FitPoints``).
- ``fit``: the point rules around the estimator (outliers, held-out points, replicates,
  residuals) and the fit with its bootstrap (``fit``, ``FitOptions``, ``Fit``).
- ``summary``: the fit as a JSON-able dict (``fit_summary``).
- ``page``: the fit as a self-contained HTML page (``write_fit_report``).
- ``recommend``: the compute-optimal N* and D* for a budget and the lifecycle table,
  with the serving cost it charges (``recommend``); the budget and requests it can
  allocate (``check_budget``) and whether a row trains a model (``trains``).

The estimator, the held-out rules and the allocation maths are ``ledgerlm.scaling``; the
page is ``ledgerlm.report.scaling_report``. Those (and scipy with them) are imported
only when a fit, a recommendation or a page is made.
"""
