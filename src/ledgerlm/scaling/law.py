"""The parametric scaling law L(N, D) = E + A N^-alpha + B D^-beta.

N is the number of parameters, D the number of training tokens, L the loss in
nat/token. Training compute is C = kappa N D FLOPs (kappa = 6: forward and
backward of a dense decoder).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

NAMES = ("E", "A", "B", "alpha", "beta")
KAPPA = 6.0


@dataclass(frozen=True)
class LawParams:
    E: float
    A: float
    B: float
    alpha: float
    beta: float

    def predict(self, N, D) -> np.ndarray:
        """Predicted loss for parameter counts ``N`` and token counts ``D`` (broadcast)."""
        N = np.asarray(N, dtype=np.float64)
        D = np.asarray(D, dtype=np.float64)
        return self.E + self.A * N ** (-self.alpha) + self.B * D ** (-self.beta)

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    def as_array(self) -> np.ndarray:
        return np.array([getattr(self, k) for k in NAMES], dtype=np.float64)

    @classmethod
    def from_array(cls, values) -> LawParams:
        return cls(*(float(v) for v in values))


def flops(N, D, kappa: float = KAPPA) -> np.ndarray:
    """Training compute C = kappa N D."""
    return kappa * np.asarray(N, dtype=np.float64) * np.asarray(D, dtype=np.float64)
