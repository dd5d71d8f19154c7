"""The lessons by name, and running them (``ledgerlm lessons``). Loading it loads no
numpy or torch: each lesson imports them when it runs."""

from __future__ import annotations

from collections.abc import Sequence

from ledgerlm.lessons.checks import Lesson, LessonResult
from ledgerlm.lessons.confirm_target import confirm_target
from ledgerlm.lessons.dedup_target import dedup_target
from ledgerlm.lessons.learning_rate import learning_rate
from ledgerlm.lessons.mixture_gradient import mixture_gradient

LESSONS: dict[str, Lesson] = {
    lesson.name: lesson
    for lesson in (
        Lesson(
            "dedup-target",
            "y = [0, 0, 2]: dedup moves the optimum 2/3 -> 1, weights keep it",
            dedup_target,
        ),
        Lesson(
            "mixture-gradient",
            "squared-error gradient, mixtures 80/15/5 vs 50/30/20",
            mixture_gradient,
        ),
        Lesson(
            "learning-rate",
            "gradient descent: lr 0.1 converges, 0.6 > 2/curvature diverges",
            learning_rate,
        ),
        Lesson(
            "confirm-target",
            "ledger A-D: 2080, 1280, 3360, 1710 s; a miss is 'not reached'",
            confirm_target,
        ),
    )
}


def lesson_names() -> list[str]:
    return list(LESSONS)


def run_lessons(names: Sequence[str] | None = None) -> list[LessonResult]:
    """Run the named lessons (all when ``names`` is empty or None), in the order given.

    An unknown name is a ValueError naming the lessons there are."""
    chosen = list(dict.fromkeys(names)) if names else lesson_names()
    unknown = [n for n in chosen if n not in LESSONS]
    if unknown:
        raise ValueError(
            f"unknown lesson {', '.join(repr(n) for n in unknown)} "
            f"(lessons: {', '.join(lesson_names())})"
        )
    return [LESSONS[n].run() for n in chosen]
