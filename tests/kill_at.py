"""A trainer callback that stops training at a given update, as a killed process would."""

from __future__ import annotations


class Killed(Exception):
    """Raised by ``KillAt``; nothing in the library catches it."""


class KillAt:
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_start(self, trainer) -> None:
        pass

    def on_step_end(self, trainer) -> None:
        if trainer.state.step == self.step:
            raise Killed

    def on_train_end(self, trainer) -> None:
        pass
