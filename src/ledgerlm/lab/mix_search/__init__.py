"""Mixture searches with small proxy runs, and the verification of their result at scale.

- ``proxy``: the proxy recipe of a search (the base recipe with the ``proxy`` overrides)
  and the recipe of each of its trials (``proxy_recipe``, ``trial_recipe``).
- ``record``: a search's plan, its id and its record in ``mixtures/<search id>.json``,
  its wall time, and the ``mix_search`` event of its runs (``start_record``).
- ``regmix``: the RegMix-style search: trials on mixtures drawn around the natural one,
  regressions from the weights to the final losses, and the recommended mixture
  (``search_mixture``, ``fit_search``).
- ``doremi``: the DoReMi-style search: a reference run and a proxy run that reweights
  its sampling on the excess validation loss (``doremi_search``).
- ``verify``: the target-scale runs with the recipe's own mixture and with a found one
  (``verify_mixture``, ``read_mixture``).

A run uses a result with ``data.mixture.from_search``: ``lab.mixture.use_search``
replaces the recipe's weights with the recommended ones before the run is created, and the run
records the search's wall time as a ``search`` phase holding its device time and bill
(``lab.searches.charge_search``), so its time-to-target includes the cost of the decision.
"""
