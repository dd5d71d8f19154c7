"""A self-contained, interactive HTML report over runs: curves, phase times, comparison.

The figures are plotly (drawn with ``plots.py``, shared with the scaling report), on one
page that inlines plotly.js once and fetches nothing, so it opens offline and can be
archived beside the ledger:

- each run's target metric (the loss in nat/token, or bits per byte with
  ``eval.target_bpb``) against the ledger's wall time, tokens and optimizer updates,
  with the target as a dashed line and a ring on the evaluation that confirmed it; the
  headings and axes say which measure and unit, and runs whose targets have different
  units get charts of their own (one y axis, one unit). Then bits per byte against
  tokens when the evaluations measured ``bpb``, unless every target was ``bpb``
  (the charts above drew exactly that);
- each downstream task metric (``task/<name>/<metric>``) against tokens and wall time,
  its 95% interval as error bars, the evaluations written after the fact (``ledgerlm
  eval``) as hollow diamonds against tokens, a task target as a dashed line named with
  its direction (``>=`` for an accuracy);
- per optimizer update (the ``Ledger.steps`` rows): the training loss, faint as recorded
  and solid as its exponential moving average (TensorBoard's smoothing, weight
  ``SMOOTHING``, debiased so the first updates are not pulled towards 0), the learning
  rate, the gradient's L2 norm before clipping and the throughput (the update's tokens
  over its wall seconds; rows without seconds are left out);
- the phase times per run, stacked, with a tick at time-to-target and a cross at the
  end of the bar of a run that missed its target.

Then the mixture table and the comparison of ``ledger compare``. Every axis names its
quantity and unit; the loss and learning-rate panels have a linear/log switch. The
figures read at a 400 px window as at 1,400: legends along the bottom edge, their long
labels and the run ids wrapped (``plots.lines``), the figure taller by what its legend
takes; no text placed outside the plot (a target is named in the legend, not on its
line). With several runs, a run's
legend label is the recipe keys whose values differ between the runs (``train.lr=0.01,
model.d_model=64``, see ``labels.recipe_labels``); its id is in every hover. Per-update
series longer than ``MAX_POINTS`` are drawn from evenly spaced updates (the average
runs over all of them), so a long run does not make the page heavy.

Every piece of text that comes from the ledger (run ids and names, metric names, phase
kinds, recipe values) is escaped: ``html.escape`` in the HTML, and ``plots.t`` in plotly
text, which reads some HTML tags. A run may be named ``<script>``.

The time axis is the ledger's own clock: at each evaluation, the summed wall time of
every phase recorded up to and including that evaluation's phase. That is the sum
time-to-target is made of, so each run's confirming evaluation sits exactly at its
time-to-target, and time a killed run spent waiting to be resumed is not drawn as work.

The modules: ``series`` (the ledger seconds at each evaluation, the moving average,
throughput, thinning), ``labels`` (legend labels from recipe differences), ``figures``
(the plotly figures), ``task_figures`` (those of the downstream tasks), ``tables`` (the
mixture and comparison tables) and ``page`` (``render_report``, the whole page).
"""
