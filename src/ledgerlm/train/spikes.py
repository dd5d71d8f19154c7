"""Loss spikes: an update whose loss is far above the running median of the updates
before it (requirement L6).

The detector holds the losses of the last ``window`` updates, kept sorted as well as in
order, so the median is one lookup and each update costs one insertion and at most one
removal: no tensor, no host sync, only the float the loop already has.
"""

from __future__ import annotations

import bisect
from collections import deque
from typing import Any

WINDOW = 100  # updates the running median looks back over


class SpikeDetector:
    """Says whether a loss exceeds ``factor`` x the median of the previous updates' losses.

    Nothing is a spike until ``warmup`` losses were seen (a young model's loss falls too
    fast for a median to mean anything); ``factor = 0`` never fires. Every loss given to
    ``observe`` joins the window, spike or not, so a lasting change of level (a new
    stage of a mixture, say) stops being a spike within half a window.
    """

    def __init__(self, factor: float, warmup: int, window: int = WINDOW) -> None:
        if window < 1:
            raise ValueError("the window holds at least one loss")
        self.factor, self.warmup, self.window = factor, warmup, window
        self.seen = 0  # losses observed so far (all of them, not only the window's)
        self._order: deque[float] = deque()
        self._sorted: list[float] = []

    def __len__(self) -> int:
        """The losses the window holds now."""
        return len(self._order)

    @property
    def median(self) -> float | None:
        """The median of the window (``None`` while it is empty)."""
        s, n = self._sorted, len(self._sorted)
        if not n:
            return None
        return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2

    def observe(self, loss: float) -> float | None:
        """Add ``loss``; the median it was compared with when it is a spike, else ``None``."""
        median = self.median
        spike = (
            self.factor > 0
            and self.seen >= self.warmup
            and median is not None
            and loss > self.factor * median
        )
        self._add(loss)
        return median if spike else None

    def _add(self, loss: float) -> None:
        self.seen += 1
        self._order.append(loss)
        bisect.insort(self._sorted, loss)
        if len(self._order) > self.window:
            old = self._order.popleft()
            del self._sorted[bisect.bisect_left(self._sorted, old)]

    def state_dict(self) -> dict[str, Any]:
        """JSON-able: a resumed run compares its next losses with the same median."""
        return {"seen": self.seen, "window": list(self._order)}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.seen = 0
        self._order, self._sorted = deque(), []
        for loss in d.get("window", [])[-self.window :]:
            self._add(float(loss))
        self.seen = int(d.get("seen", self.seen))
