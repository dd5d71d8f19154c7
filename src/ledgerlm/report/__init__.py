"""Rendering and exporting what the ledger holds.

This package owns the presentation side of the lab: the HTML run report
(``run/``), the scaling-law report (``scaling_report``), the plotly page shell and
figure helpers both draw with (``plots``), the logging sinks that copy a run's series to
TensorBoard, MLflow and W&B (``sinks``), and the MLPerf MLLOG export (``mllog``) with
the compliance rules it ships (``mlperf_rules/``). It reads the ledger and the scaling
fit; it never writes the ledger.
"""
