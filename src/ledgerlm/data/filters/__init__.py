"""Document filters (requirement D3): each one a small, picklable, deterministic rule with a reason.

Speed matters because every document passes through every filter. The rules lean on
``bytes.translate`` over the UTF-8 form, ``split``, ``re`` and ``collections.Counter``
(all C loops); Python-level loops run over *distinct* characters, never over every
character (about 20 MB/s per core for all four filters on the built-in corpus). Where a
statistic is a property of the whole text that any large enough piece shows (top n-gram
share, dominant script), long documents are sampled in evenly spaced windows; where it
is not (a line repeated far apart), the whole document is read.
"""

from __future__ import annotations

from ledgerlm.config import FiltersConfig
from ledgerlm.data.filters.length import LengthFilter
from ledgerlm.data.filters.repetition import RepetitionFilter
from ledgerlm.data.filters.script import ScriptFilter
from ledgerlm.data.filters.symbols import SymbolRatioFilter
from ledgerlm.data.steps import Filter


def build_filters(cfg: FiltersConfig) -> list[Filter]:
    """Cheapest and most decisive first; the order is fixed because counts depend on it."""
    filters: list[Filter] = [
        LengthFilter(cfg.min_chars, cfg.max_chars),
        RepetitionFilter(cfg.max_duplicate_line_fraction, cfg.max_top_ngram_fraction),
        SymbolRatioFilter(cfg.max_symbol_ratio, cfg.exclude_symbol_domains),
    ]
    if cfg.scripts:
        filters.append(ScriptFilter(cfg.scripts))
    return filters
