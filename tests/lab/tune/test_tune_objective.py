"""What a trial tells the study when the target is a task accuracy."""

from ledgerlm.lab.tune import trial as tune_trial


def test_a_target_accuracy_is_told_to_the_study_negated_so_minimising_is_better():
    def summary(acc: float, reached: bool) -> dict:
        verdict = {"reached": reached, "device_seconds": 50.0 if reached else None}
        return {
            "evaluations": [{"step": 100, "metrics": {"task/q/acc": acc}}],
            "time_to_target": verdict,
        }

    metric = "task/q/acc"
    better, worse = summary(0.8, False), summary(0.6, False)
    for objective in ("metric", "time"):
        told = [
            tune_trial.objective_value(objective, "not reached", s, metric) for s in (better, worse)
        ]
        assert told[0] < told[1], objective
    assert tune_trial.objective_value("time", "reached", summary(0.9, True), metric) == 50.0
    assert tune_trial.objective_value("metric", "reached", summary(0.5, True), "loss") is None
