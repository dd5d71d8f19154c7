"""DoReMi's domain reweighting (Xie et al. 2023): exponentiated-gradient ascent on the
excess loss of a proxy over a reference model, smoothed towards uniform; the result is
the average of the weights over the updates.

``alpha' = alpha * exp(eta * lambda)``, normalised, then ``(1 - c) alpha' + c / k``,
with ``lambda_i = max(L_i(proxy) - L_i(reference), 0)``: a domain on which the proxy
is still far behind the reference gains weight. The paper uses eta = 1 and c = 1e-3.
"""

from __future__ import annotations

import numpy as np

ETA = 1.0  # step size of the exponentiated gradient
SMOOTHING = 1e-3  # share of the uniform mixture mixed into every update


def excess_loss(proxy: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """lambda_i = max(L_i(proxy) - L_i(reference), 0), per domain."""
    return np.maximum(np.asarray(proxy, float) - np.asarray(reference, float), 0.0)


def doremi_update(
    alpha: np.ndarray, excess: np.ndarray, eta: float = ETA, smoothing: float = SMOOTHING
) -> np.ndarray:
    """One update of the domain weights from the domains' excess losses."""
    alpha = np.asarray(alpha, dtype=np.float64)
    if alpha.ndim != 1 or len(alpha) != len(excess) or len(alpha) == 0:
        raise ValueError("alpha and excess must be 1-D arrays of the same length")
    # in log space: exp of a large excess would overflow
    logits = np.log(np.maximum(alpha, 1e-300)) + eta * np.asarray(excess, dtype=np.float64)
    logits -= logits.max()
    raised = np.exp(logits)
    raised /= raised.sum()
    return (1.0 - smoothing) * raised + smoothing / len(alpha)
