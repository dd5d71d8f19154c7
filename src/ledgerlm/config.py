"""The recipe: one typed config tree, loaded from TOML, with dotted overrides.

Every component receives only its own section. Unknown keys and wrong types are
errors that name the key and the file, so a typo never silently falls back to a
default. A run stores the fully resolved recipe (``Recipe.model_dump``).
"""

from __future__ import annotations

import datetime as dt
import difflib
import hashlib
import itertools
import json
import re
import tomllib
import typing
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    WrapValidator,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError

# A recipe's name becomes a folder (``runs/<name>-<UTC stamp>-<4 hex>``) and the prefix of
# sweep and run ids: letters, digits, '-', '_' and '.', never starting with '.' or '-'.
NAME_MAX = 100
NAME_RULE = (
    f"ASCII letters, digits, '-', '_' and '.' (a letter, digit or '_' first), at most {NAME_MAX} "
    "characters"
)
_NAME = re.compile(rf"[A-Za-z0-9_][A-Za-z0-9._-]{{0,{NAME_MAX - 1}}}")
_NAME_CHAR = re.compile(r"[^A-Za-z0-9._-]")


def is_name(text: object) -> bool:
    """Whether ``text`` may name a recipe, and so a run folder."""
    return isinstance(text, str) and _NAME.fullmatch(text) is not None


def name_problem(text: str) -> str | None:
    """What keeps ``text`` from being a name (``NAME_RULE``), in a few words; None if it is."""
    if is_name(text):
        return None
    if not text:
        return "is empty"
    if len(text) > NAME_MAX:
        return f"is {len(text)} characters long"
    if text[0] in ".-":
        return f"starts with {text[0]!r}"
    bad = _NAME_CHAR.search(text)
    return f"has {bad.group()!r} in it" if bad else "is not a name"


def shown(text: str, limit: int = 40) -> str:
    """``text`` quoted on one line (control characters escaped), a long one cut."""
    return repr(text if len(text) <= limit else text[:limit] + "...")


class RecipeError(ValueError):
    """A recipe that cannot be loaded; the message is one line naming the problem."""


class _Section(BaseModel):
    # allow_inf_nan=False: inf, -inf and nan are refused in every float of the tree.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class BuiltinCorpusConfig(_Section):
    """Size caps of the built-in ``builtin:stdlib`` corpus (no download of any kind)."""

    code_docs: int = Field(
        400, ge=0, description="Max standard-library .py files (tests excluded)."
    )
    docs_docs: int = Field(200, ge=0, description="Max documentation documents.")
    math_docs: int = Field(400, ge=0, description="Synthetic arithmetic/algebra documents.")
    math_lines: int = Field(24, ge=1, description="Lines per synthetic math document.")
    max_doc_chars: int = Field(20_000, ge=100, description="Longer documents are cut at a line.")
    seed: int = Field(0, description="Seed of the synthetic math generator.")


class ChunkSplit(_Section):
    """Cut a text file into pieces of about ``chunk_chars`` characters, at line ends."""

    chunk_chars: int = Field(ge=100, description="Characters per document (cut at a line end).")


SPLIT_FORMS = '"file", "blank_lines", "lines" or {chunk_chars = N}'


def _split_rule(value: Any, handler: Any) -> Any:
    """A text split named by a string, or an error that lists every form a split takes."""
    try:
        return handler(value)
    except ValidationError:
        raise PydanticCustomError(
            "split", "expected {forms}, got {got}", {"forms": SPLIT_FORMS, "got": shown(value)}
        ) from None


TextSplit = Annotated[
    Union[  # noqa: UP007
        Annotated[Literal["file", "blank_lines", "lines"], WrapValidator(_split_rule), Tag("rule")],
        Annotated[ChunkSplit, Tag("chunk")],
    ],
    Discriminator(
        lambda v: (
            "rule" if isinstance(v, str) else "chunk" if isinstance(v, dict | ChunkSplit) else None
        ),
        custom_error_type="split",
        custom_error_message=f"expected {SPLIT_FORMS}",
    ),
]


_READ_OPTIONS = ("text_field", "id_field", "domain_field", "date_field", "split")


class InputConfig(_Section):
    """One input: a file, a glob, a folder of text files, or ``builtin:stdlib``.

    ``format``: ``jsonl`` (one JSON object per line; .gz and .zst too), ``parquet``,
    ``arrow`` (Arrow IPC files, as a Hugging Face ``datasets`` folder saved with
    ``save_to_disk`` holds them: such a folder is read whole), ``text`` (a .txt/.md
    file, or a folder of them), ``builtin``; ``auto`` picks by the file name. Records
    of JSONL, Parquet and Arrow carry the text, id and domain in the fields named here;
    a text file is one document, or is cut by ``split``.
    """

    path: str
    format: Literal["auto", "jsonl", "parquet", "arrow", "text", "builtin"] = "auto"
    source: str | None = Field(None, description="Source name; default: from the path.")
    domain: str | None = Field(None, description="Domain for records that carry none.")
    text_field: str = Field("text", min_length=1, description="JSONL/Parquet field of the text.")
    id_field: str = Field("id", min_length=1, description="JSONL/Parquet field of the id.")
    domain_field: str = Field(
        "domain", min_length=1, description="JSONL/Parquet field of the domain."
    )
    date_field: str = Field(
        "date",
        min_length=1,
        description="JSONL/Parquet field of the date (ISO date or datetime, or Unix seconds; "
        'read strictly under data.split = "time").',
    )
    split: TextSplit = Field(
        "file",
        description='Text files: one document per file, per paragraph ("blank_lines"), per '
        'line ("lines"), or per {chunk_chars = N} characters.',
    )

    @model_serializer(mode="wrap")
    def _without_default_options(self, handler: Any) -> dict[str, Any]:
        # The reading options are written out only when set, so a source written before
        # they existed keeps its form, and the data version's hash.
        out = handler(self)
        for key in _READ_OPTIONS:
            if getattr(self, key) == InputConfig.model_fields[key].default:
                out.pop(key, None)
        return out

    def split_rule(self) -> str:
        """The text split as a plain string (``file``, ``blank_lines``, ``lines``, ``chunk:N``)."""
        if isinstance(self.split, ChunkSplit):
            return f"chunk:{self.split.chunk_chars}"
        return self.split

    def is_builtin(self) -> bool:
        """Whether this input is the built-in corpus (``builtin:stdlib``)."""
        return self.format == "builtin" or self.path.startswith("builtin:")


# The union member of a source is picked by the input's shape, so a table's error names
# its own key (``data.sources.0.bogus``) rather than "not a valid string".
_SOURCE_TAGS = ("path", "table")
# union members that pydantic names in an error's location, by the field they are in
_UNION_TAGS = {"weights": ("natural", "table"), "split": ("rule", "chunk")}


def _source_kind(value: Any) -> str | None:
    if isinstance(value, str):
        return "path"
    return "table" if isinstance(value, dict | InputConfig) else None


SourceSpec = Annotated[
    Union[Annotated[str, Tag("path")], Annotated[InputConfig, Tag("table")]],  # noqa: UP007
    Discriminator(
        _source_kind,
        custom_error_type="source",
        custom_error_message="expected a path or a table {path = ...}",
    ),
]


class TemplatesConfig(_Section):
    """D2: lines repeated across many documents of one source (banners, headers, footers)."""

    enabled: bool = True
    min_docs: int = Field(5, ge=2, description="A line in at least this many documents...")
    min_doc_fraction: float = Field(
        0.05, ge=0, le=1, description="...and in at least this share of the source's documents."
    )
    min_line_chars: int = Field(20, ge=1, description="Shorter lines are never templates.")
    exclude_domains: list[str] = Field(
        default_factory=lambda: ["code", "math"],
        description="Domains where repeated lines are content, not boilerplate.",
    )


class FiltersConfig(_Section):
    """D3: document filters; each drop carries a reason."""

    min_chars: int = Field(20, ge=0)
    max_chars: int = Field(2_000_000, ge=1)
    max_duplicate_line_fraction: float = Field(
        0.5, ge=0, le=1, description="Share of characters in lines repeated within the document."
    )
    max_top_ngram_fraction: float = Field(
        0.4, ge=0, le=1, description="Share of characters covered by the most frequent word 3-gram."
    )
    max_symbol_ratio: float = Field(
        0.5,
        ge=0,
        le=1,
        description="Share of characters that are neither letters, digits nor space.",
    )
    exclude_symbol_domains: list[str] = Field(default_factory=lambda: ["code", "math"])
    scripts: list[str] = Field(
        default_factory=list,
        description="Allowed dominant scripts (e.g. ['latin']); empty allows any.",
    )


class NearDedupConfig(_Section):
    """D4: MinHash over word shingles with LSH banding, clustered out of core."""

    enabled: bool = True
    preset: Literal["fineweb", "precise", "custom"] = "fineweb"
    shingle_words: int | None = Field(None, ge=1, description="Overrides the preset.")
    bands: int | None = Field(None, ge=1, description="With rows: overrides the preset.")
    rows: int | None = Field(None, ge=1)
    threshold: float = Field(0.8, gt=0, lt=1, description="Jaccard threshold of a duplicate.")
    fp_weight: float = Field(
        0.5,
        ge=0,
        le=1,
        description="Weight of false positives when "
        "deriving bands x rows from the threshold (custom preset).",
    )
    num_perm: int = Field(112, ge=2, description="Permutations for the custom preset.")
    verify: bool = Field(True, description="Check candidate pairs with exact Jaccard.")
    keeper: Literal["first", "longest", "newest"] = Field(
        "first",
        description="Which document of a cluster is kept; ties go to the earliest in input order.",
    )
    partitions: int = Field(16, ge=1, description="Hash partitions of the edge files.")
    seed: int = 1


class ContaminationConfig(_Section):
    """D7: evaluation files checked against training documents."""

    eval_files: list[str] = Field(default_factory=list)
    ngram: int = Field(13, ge=1, description="Word n-gram length of an overlap.")
    drop: bool = Field(False, description="Drop training documents that overlap an eval file.")


MIX_SUM_TOLERANCE = 1e-6  # a mixture's weights must sum to 1 within this


def _check_weights(weights: dict[str, float], where: str) -> dict[str, float]:
    if not weights:
        raise ValueError(f"{where}: name at least one domain")
    for name, w in weights.items():
        if not name:
            raise ValueError(f"{where}: a domain name is empty")
        if w < 0:
            raise ValueError(f"{where}: {name} = {w:g} is negative")
    total = sum(weights.values())
    if abs(total - 1.0) > MIX_SUM_TOLERANCE:
        shown_weights = ", ".join(f"{k} = {v:g}" for k, v in weights.items())
        raise ValueError(
            f"{where} sum to {total:.9g}, not 1 (within {MIX_SUM_TOLERANCE:g}): {{{shown_weights}}}"
        )
    return weights


def _weights_kind(value: Any) -> str | None:
    if isinstance(value, str):
        return "natural"
    return "table" if isinstance(value, dict) else None


MixWeights = Annotated[
    Union[  # noqa: UP007
        Annotated[Literal["natural"], Tag("natural")],
        Annotated[dict[str, float], Tag("table")],
    ],
    Discriminator(
        _weights_kind,
        custom_error_type="mixture",
        custom_error_message='expected "natural" or a table {domain = share, ...}',
    ),
]


class MixtureStage(_Section):
    """One stage of a staged mixture: these weights until ``until``."""

    until: int | float = Field(
        description="End of the stage: a share of the run's token budget (a float in "
        "(0, 1]) or a count of training tokens (an integer)."
    )
    weights: MixWeights = Field(description='Domain weights, or "natural".')

    @model_validator(mode="after")
    def _valid(self) -> MixtureStage:
        if isinstance(self.until, float) and not 0 < self.until <= 1:
            raise ValueError(
                f"until = {self.until:g}: a float is a share of the token budget, in (0, 1]; "
                "write a token count as an integer"
            )
        if isinstance(self.until, int) and self.until < 1:
            raise ValueError(f"until = {self.until}: a token count must be at least 1")
        if isinstance(self.weights, dict):
            _check_weights(self.weights, "weights")
        return self


class MixtureConfig(_Section):
    """D8: how much of each domain training sees (token-level weights).

    ``weights = "natural"`` visits every train document once per epoch (dedup weights
    apply); a table ``{code = 0.3, ...}`` gives each named domain that share of the
    training tokens (domains left out get none). Stages run first, in order, each
    until its ``until``; ``weights`` applies after the last stage.
    """

    weights: MixWeights = Field(
        "natural",
        description='"natural", or {domain = share, ...} summing to 1 (shares of training tokens).',
    )
    stages: list[MixtureStage] = Field(
        default_factory=list, description="Earlier mixtures, each until a point of the run."
    )
    max_epochs: float = Field(
        4.0,
        gt=0,
        description="Warn when a domain's expected exposure (tokens seen / unique tokens) "
        "exceeds this many epochs.",
    )
    from_search: str | None = Field(
        None,
        description="A mixture search (`ledgerlm mix search`: its id, a unique prefix or "
        "latest): its recommended weights become `weights`, and its wall time is charged "
        "to the run as a `search` phase.",
    )

    @model_validator(mode="after")
    def _valid(self) -> MixtureConfig:
        if isinstance(self.weights, dict):
            _check_weights(self.weights, "weights")
        for kind in (int, float):
            ends = [s.until for s in self.stages if isinstance(s.until, kind)]
            if any(b <= a for a, b in itertools.pairwise(ends)):
                raise ValueError(f"stages: until must increase from stage to stage, got {ends}")
        return self

    def named_domains(self) -> set[str]:
        """Every domain the mixture names."""
        tables = [self.weights, *(s.weights for s in self.stages)]
        return {d for t in tables if isinstance(t, dict) for d in t}


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_TIME_FORMS = '"2024-01-01", "2024-01-01T12:30:00Z" or Unix seconds'


def parse_time(value: Any) -> int:
    """Microseconds since 1970-01-01 UTC of a date: an ISO 8601 date or datetime (a
    string, or a ``date``/``datetime`` as Parquet and TOML give them) or Unix seconds (a
    number). A date or datetime without a zone is UTC. The one rule of ``data.split_time``
    and of the records' dates; raises ``ValueError`` saying what ``value`` is not."""
    if isinstance(value, bool) or value is None:
        raise ValueError(f"{value!r} is not a date ({_TIME_FORMS})")
    try:
        if isinstance(value, int | float):
            moment = dt.datetime.fromtimestamp(value, dt.UTC)
        elif isinstance(value, dt.datetime):
            moment = value
        elif isinstance(value, dt.date):
            moment = dt.datetime(value.year, value.month, value.day)
        elif isinstance(value, str):
            moment = dt.datetime.fromisoformat(value)
        else:
            raise ValueError
    except (ValueError, OverflowError, OSError):
        raise ValueError(f"{shown(str(value))} is not a date ({_TIME_FORMS})") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return (moment - _EPOCH) // dt.timedelta(microseconds=1)


class DataConfig(_Section):
    """The data stage: read, clean, deduplicate and split into a versioned dataset."""

    sources: list[SourceSpec] = Field(default_factory=lambda: ["builtin:stdlib"])
    builtin: BuiltinCorpusConfig = Field(default_factory=BuiltinCorpusConfig)
    templates: TemplatesConfig = Field(default_factory=TemplatesConfig)
    filters: FiltersConfig = Field(default_factory=FiltersConfig)
    exact_dedup: bool = True
    near_dedup: NearDedupConfig = Field(default_factory=NearDedupConfig)
    contamination: ContaminationConfig = Field(default_factory=ContaminationConfig)
    weights: Literal["rebalance", "preserve"] = Field(
        "rebalance",
        description="rebalance: each kept document weighs 1; preserve: its cluster size.",
    )
    split: Literal["cluster", "source", "document", "time"] = Field(
        "cluster",
        description="Unit of the train/val/test split (a cluster is never cut); time: by "
        "date, documents dated on or after split_time held out.",
    )
    split_time: str | None = Field(
        None,
        description='data.split = "time": the cut, an ISO date or datetime (UTC unless it '
        "names a zone); a near-duplicate cluster goes with its earliest dated member.",
    )
    val_fraction: float = Field(
        0.05, gt=0.0, lt=1.0, description="Share of units held out for validation (tuning)."
    )
    test_fraction: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="Share of units held out as the test split (measured once, at the end); "
        "0 = no test split, and every unit keeps the split it had without one.",
    )
    split_seed: int = Field(0, description="Salt of the split hash.")
    shard_docs: int = Field(2_000, ge=1, description="Documents per Parquet shard.")
    executor: Literal["local", "ray"] = "local"
    workers: int = Field(0, ge=0, description="Parallel shard workers; 0 = all cores.")
    mixture: MixtureConfig = Field(
        default_factory=MixtureConfig,
        description="How training samples the domains; not part of the data version.",
    )
    val_sources: list[SourceSpec] = Field(
        default_factory=list,
        description="Set from [eval] sources: the validation split, read as given "
        "(val_fraction then draws nothing from the training sources).",
    )
    test_sources: list[SourceSpec] = Field(
        default_factory=list, description="Set from [eval] test_sources: the test split."
    )

    @model_serializer(mode="wrap")
    def _without_fixed_sets(self, handler: Any) -> dict[str, Any]:
        # written out only when set, so a recipe without them keeps its data version id
        out = handler(self)
        for key in ("val_sources", "test_sources", "split_time"):
            if not getattr(self, key):
                out.pop(key, None)
        return out

    @field_validator("split_time", mode="before")
    @classmethod
    def _split_time_is_a_date(cls, value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, dt.date):  # a TOML date or datetime: kept as its ISO text
            value = value.isoformat()
        forms = 'an ISO date or datetime, e.g. "2024-01-01" or "2024-01-01T12:30:00Z"'
        if not isinstance(value, str):
            raise ValueError(f"{value!r} is not {forms}")
        try:
            parse_time(value)
        except ValueError:
            raise ValueError(f"{shown(value)} is not {forms}") from None
        return value

    @model_validator(mode="after")
    def _time_split_has_its_cut(self) -> DataConfig:
        if self.split == "time" and self.split_time is None:
            raise ValueError(
                'split = "time" needs split_time, the first date held out (e.g. '
                'split_time = "2024-01-01")'
            )
        if self.split != "time" and self.split_time is not None:
            raise ValueError(
                f'split_time is set but split = "{self.split}": set split = "time" to split '
                "by date, or remove split_time"
            )
        return self

    def split_cut(self) -> int | None:
        """``split_time`` in microseconds since 1970-01-01 UTC (``parse_time``), or None."""
        return None if self.split_time is None else parse_time(self.split_time)

    @model_validator(mode="after")
    def _held_out_leaves_train(self) -> DataConfig:
        # (a time split holds out what its cut says; the fractions only share it out)
        if self.val_fraction + self.test_fraction >= 1.0 and self.split != "time":
            raise ValueError(
                f"val_fraction + test_fraction must be < 1 (got {self.val_fraction} + "
                f"{self.test_fraction} = {self.val_fraction + self.test_fraction:g}): "
                "no unit would be left for train"
            )
        return self

    def inputs(self) -> list[InputConfig]:
        return _as_inputs(self.sources)

    def held_out_inputs(self) -> dict[str, list[InputConfig]]:
        """The user-fixed held-out splits: {"val": [...], "test": [...]}, when set."""
        fixed = {"val": self.val_sources, "test": self.test_sources}
        return {split: _as_inputs(specs) for split, specs in fixed.items() if specs}

    def drawn_fractions(self) -> tuple[float, float]:
        """The val and test fractions drawn from the training sources: none for a split
        that a fixed set supplies."""
        return (
            0.0 if self.val_sources else self.val_fraction,
            0.0 if self.test_sources else self.test_fraction,
        )


def _as_inputs(specs: list[SourceSpec]) -> list[InputConfig]:
    return [InputConfig(path=s) if isinstance(s, str) else s for s in specs]


class TokenizerConfig(_Section):
    """Byte-level BPE trained with Hugging Face ``tokenizers`` on the train split only, or
    a supplied one (``from``)."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        allow_inf_nan=False,
        populate_by_name=True,
        serialize_by_alias=True,
    )

    from_: str | None = Field(
        None,
        alias="from",
        description="A tokenizer to use instead of training one: a tokenizer.json file or a "
        "local Hugging Face tokenizer folder (read from disk, never downloaded).",
    )
    bos: str | None = Field(None, description="With from: the BOS token (default: found by name).")
    eos: str | None = Field(None, description="With from: the EOS token (default: found by name).")
    pad: str | None = Field(
        None, description="With from: the padding token (default: found by name, else EOS)."
    )
    vocab_size: int = Field(4096, ge=300, le=1_048_576, description="Trained vocabulary size.")

    @model_serializer(mode="wrap")
    def _without_unset_supplied(self, handler: Any) -> dict[str, Any]:
        # The supplied-tokenizer keys are written only when set, so a recipe written
        # before they existed keeps its form, and its tokens version.
        out = handler(self)
        for key in ("from", "bos", "eos", "pad"):
            if out.get(key) is None:
                out.pop(key, None)
        return out

    min_frequency: int = Field(2, ge=1)
    max_train_chars: int = Field(
        20_000_000, ge=1, description="Characters of train text used to learn merges."
    )
    reuse: str | None = Field(
        None,
        description="Tokens version whose tokenizer encodes this data instead of a newly "
        "trained one (continued pretraining sets it to the initial run's).",
    )


class PackConfig(_Section):
    """How documents become fixed-length rows."""

    seq_len: int = Field(256, ge=8, description="Prediction positions per row.")
    attention: Literal["isolated", "cross"] = Field(
        "isolated", description="isolated: block-causal by document; cross: plain causal."
    )
    reset_positions: bool = Field(True, description="Restart position ids at each document.")


class ModelConfig(_Section):
    """A Llama-style decoder (RMSNorm, RoPE, SwiGLU)."""

    d_model: int = Field(128, ge=8)
    n_layers: int = Field(4, ge=1)
    n_heads: int = Field(4, ge=1)
    ffn_mult: float = Field(8 / 3, gt=0, description="SwiGLU hidden = ffn_mult * d_model, rounded.")
    rope_theta: float = Field(10_000.0, gt=0)
    norm_eps: float = Field(1e-5, gt=0)
    tie_embeddings: bool = True
    init_std: float = Field(0.02, gt=0)
    attention_backend: Literal["auto", "sdpa", "flex"] = Field(
        "auto",
        description="auto: flex_attention (isolated) or causal SDPA (cross) on CUDA, SDPA with "
        "an explicit mask elsewhere; sdpa: always the explicit mask; flex: the fused path "
        "on any device (CPU: no training).",
    )

    @model_validator(mode="after")
    def _heads_divide(self) -> ModelConfig:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if (self.d_model // self.n_heads) % 2:
            raise ValueError("head dimension d_model/n_heads must be even for RoPE")
        return self


class TrainConfig(_Section):
    """Optimizer, schedule and batch shape. Steps are optimizer updates."""

    seed: int = 0
    max_steps: int = Field(200, ge=1)
    micro_batch_rows: int = Field(16, ge=1, description="Rows per forward/backward pass.")
    grad_accum: int = Field(1, ge=1, description="Micro-batches per optimizer update.")
    lr: float = Field(3e-3, gt=0)
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="Cosine floor as a share of lr.")
    warmup_steps: int = Field(20, ge=0)
    weight_decay: float = Field(0.1, ge=0)
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = Field(1e-8, gt=0)
    grad_clip: float = Field(1.0, ge=0, description="Max global grad norm; 0 disables clipping.")
    threads: int = Field(0, ge=0, description="torch intra-op threads; 0 = all cores.")
    objective: Literal["token_mean", "sequence_mean"] = Field(
        "token_mean",
        description="token_mean: sum over supervised targets / their count; sequence_mean: "
        "per-row token mean, then the mean over rows.",
    )
    empty_rows: Literal["exclude", "zero"] = Field(
        "exclude",
        description="sequence_mean: a row without targets is left out of the row count "
        "(exclude) or counted with loss 0 (zero).",
    )
    optimizer: Literal["adamw", "muon"] = Field(
        "adamw", description="muon: Muon for 2-D hidden matrices, AdamW for the rest."
    )
    muon_lr: float = Field(0.02, gt=0)
    schedule: Literal["cosine", "linear", "wsd", "constant"] = Field(
        "cosine", description="Shape after warmup; wsd = warmup, stable, then linear decay."
    )
    schedule_unit: Literal["steps", "tokens"] = Field(
        "steps", description="Warmup and decay are measured in optimizer steps or in tokens."
    )
    warmup_tokens: int = Field(0, ge=0, description="Warmup length when schedule_unit = tokens.")
    schedule_tokens: int | None = Field(
        None, ge=1, description="Schedule length when schedule_unit = tokens."
    )
    decay_fraction: float = Field(
        0.2, gt=0, le=1, description="wsd: share of the schedule spent decaying."
    )
    nonfinite: Literal["stop", "skip"] = Field(
        "stop", description="On a NaN/inf loss or gradient: stop the run, or skip the update."
    )
    spike_factor: float = Field(
        3.0,
        ge=0,
        description="An update whose loss exceeds this many times the median loss of the "
        "previous 100 updates is a loss_spike event; 0 = off (else above 1).",
    )
    spike_warmup: int = Field(
        50, ge=0, description="Updates made before loss spikes are looked for."
    )
    on_spike: Literal["record", "skip"] = Field(
        "record",
        description="On a loss spike: record it and apply the update, or also skip the "
        "update (as nonfinite = skip does).",
    )
    precision: Literal["fp32", "bf16"] = Field(
        "fp32", description="bf16: forward and backward under bf16 autocast; weights stay fp32."
    )
    compile: bool = Field(
        False, description="Run the model through torch.compile (block by block under FSDP)."
    )
    tf32: bool = Field(
        False,
        description="On CUDA: fp32 matmuls and convolutions on TF32 tensor cores (inputs "
        "rounded to a 10-bit mantissa, fp32 sums), several times faster on Ampere and "
        "later; false keeps fp32 exact. The CPU has no TF32: there it changes nothing "
        "(the run says so).",
    )
    deterministic: bool = Field(
        True,
        description="Deterministic kernels, so a resumed run repeats the uninterrupted "
        "one bit for bit: torch.use_deterministic_algorithms, cuBLAS's fixed workspace, "
        "and on several GPUs NCCL's ring with NVLS and CollNet off. false lets torch "
        "and NCCL choose faster kernels that may reduce in another order each run (a "
        "resume then agrees to rounding, not bitwise).",
    )
    activation_checkpointing: bool = Field(
        False,
        description="Keep only each block's input in the forward pass and recompute the "
        "rest in the backward: less memory, about a third more compute.",
    )
    memory_check: bool = Field(
        True,
        description="Refuse, before any work, a recipe whose estimated memory per process "
        "exceeds 90% of what the device has available (RAM, or the GPU's free memory); "
        "false = train anyway.",
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="Where to train: auto = CUDA when present, else the CPU."
    )
    parallel: Literal["auto", "fsdp", "ddp", "none"] = Field(
        "auto",
        description="Data parallelism under torchrun: fsdp = FSDP2 (fully_shard per block: "
        "weights, gradients and optimizer state sharded); ddp = DistributedDataParallel; "
        "both sum gradients over ranks. auto = fsdp under torchrun (ddp with muon), none "
        "in one process.",
    )
    collective_timeout: float = Field(
        600.0,
        gt=0,
        description="Under torchrun: seconds a rank waits in a collective (a step, an "
        "evaluation, a checkpoint) for the other ranks before it stops with one line "
        "saying which stopped answering; more than rank 0 ever spends alone (a "
        "checkpoint write).",
    )
    checkpoint_every: int = Field(
        0, ge=0, description="Save a resumable checkpoint every N updates; 0 = only at the end."
    )
    init_from: str | None = Field(
        None,
        description="Continued pretraining: start from this run's final weights (fresh "
        "optimizer and schedule); its tokenizer is reused.",
    )
    from_tune: str | None = Field(
        None,
        description="A finished tuning study (`ledgerlm tune`: its name, a unique prefix "
        "or latest) of this very recipe: its best trial's values are trained, and the "
        "study's wall and device time are charged to the run as a `search` phase.",
    )

    @model_validator(mode="after")
    def _token_schedule_has_length(self) -> TrainConfig:
        if self.schedule_unit == "tokens" and self.schedule_tokens is None:
            raise ValueError("schedule_unit = 'tokens' needs schedule_tokens")
        return self

    @model_validator(mode="after")
    def _spike_factor_above_one(self) -> TrainConfig:
        if 0 < self.spike_factor <= 1:
            raise ValueError(
                f"spike_factor = {self.spike_factor:g} would call half of all updates "
                "spikes: use a factor above 1, or 0 for none"
            )
        return self


TASK_METRICS: dict[str, tuple[str, ...]] = {
    "choice": ("acc", "acc_norm"),
    "exact": ("exact_match",),
    "bpb": ("bpb",),
}
BUILTIN_TASKS: dict[str, str] = {"arith": "exact", "code-next-line": "choice"}
# A built-in task's records may also be scored as bits per byte of their answer.
BUILTIN_ALSO: dict[str, tuple[str, ...]] = {"arith": ("bpb",), "code-next-line": ()}
_TASK_METRIC = re.compile(r"task/([^/\s]+)/([^/\s]+)")


class TaskConfig(_Section):
    """One downstream task scored at every evaluation (``[[eval.tasks]]``): a local JSONL
    file (nothing is downloaded) or a built-in task made from the built-in corpus's
    held-out material. Its metrics are ``task/<name>/<metric>`` in the evaluation."""

    name: str = Field(description="The task's name in metric keys (a slug).")
    path: str | None = Field(
        None,
        description="A local JSONL file of records (relative to the current directory, as "
        "data.sources are).",
    )
    builtin: Literal["arith", "code-next-line"] | None = Field(
        None,
        description="A built-in task instead of path: arith (exact, or bpb of its "
        "answers) or code-next-line (choice), made from held-out material of the built-in "
        "corpus.",
    )
    kind: Literal["choice", "exact", "bpb"] | None = Field(
        None,
        description="choice (acc, acc_norm), exact (exact_match of greedy generation) or "
        "bpb (bits per byte of the answer given the context); a built-in task's own kind "
        "when unset.",
    )
    limit: int = Field(0, ge=0, description="Score the first N records; 0 = all.")
    few_shot: int = Field(
        0,
        ge=0,
        description="Examples drawn (seeded) from the file's train records, put "
        "before each context.",
    )
    seed: int = Field(1234, description="Seed of the few-shot draw.")
    context_field: str = Field("context", min_length=1)
    choices_field: str = Field("choices", min_length=1)
    gold_field: str = Field("gold", min_length=1)
    answer_field: str = Field("answer", min_length=1)
    split_field: str = Field(
        "split",
        min_length=1,
        description="Records whose value here is 'train' are the few-shot pool, never scored.",
    )
    delimiter: str = Field(
        " ", description="Between a context and its continuation (choice or answer)."
    )
    fewshot_delimiter: str = Field("\n\n", description="Between few-shot examples.")
    max_new_tokens: int = Field(16, ge=1, description="exact: tokens generated at most.")
    stop: list[str] = Field(
        default_factory=lambda: ["\n"],
        description="exact: generation ends at the first of these strings.",
    )

    @field_validator("name")
    @classmethod
    def _name_is_a_slug(cls, name: str) -> str:
        problem = name_problem(name)
        if problem is not None:
            raise ValueError(f"task name {shown(name)}: {problem}")
        return name

    @model_validator(mode="after")
    def _one_source(self) -> TaskConfig:
        if (self.path is None) == (self.builtin is None):
            raise ValueError(f"task {self.name!r}: give path or builtin, exactly one")
        if self.builtin is not None:
            kinds = (BUILTIN_TASKS[self.builtin], *BUILTIN_ALSO[self.builtin])
            if self.kind not in (None, *kinds):
                raise ValueError(
                    f"task {self.name!r}: builtin {self.builtin} is of kind "
                    f"{' or '.join(kinds)}, not {self.kind}"
                )
        if self.builtin is None and self.kind is None:
            raise ValueError(f"task {self.name!r}: a task file needs its kind")
        return self

    @property
    def task_kind(self) -> str:
        """The kind in force: the recipe's, or the built-in task's own."""
        return self.kind or BUILTIN_TASKS[str(self.builtin)]

    @property
    def metrics(self) -> tuple[str, ...]:
        return TASK_METRICS[self.task_kind]


class EvalConfig(_Section):
    """The target contract, fixed before a run: the validation set (``max_tokens`` shared
    by domain), the metric, the threshold, the interval, the confirmation rule and the
    budget. The contract is written to the ledger before training starts."""

    every_steps: int = Field(50, ge=1, description="Evaluate every N optimizer updates.")
    every_tokens: int = Field(
        0,
        ge=0,
        description="Evaluate each time N more training tokens were consumed "
        "(replaces every_steps when > 0).",
    )
    max_tokens: int = Field(65_536, ge=16, description="Size of the fixed validation token set.")
    test_max_tokens: int = Field(
        0,
        ge=0,
        description="Tokens of the test split scored after training, shared by domain as "
        "max_tokens is; 0 = the whole test split.",
    )
    metric: str = Field(
        "loss",
        pattern=r"^(loss(/[^/\s]+)?|task/[^/\s]+/[^/\s]+)$",
        description="loss (nat/token over all domains), loss/<domain>, or a task metric "
        "task/<name>/<metric> (its threshold in targets).",
    )
    target_loss: float = Field(4.0, gt=0, description="Validation loss (nat/token) to confirm.")
    target_bpb: float | None = Field(
        None,
        gt=0,
        description="The target in bits per UTF-8 byte instead of target_loss (comparable "
        "across tokenizers): metric loss becomes bpb, loss/<domain> becomes bpb/<domain>.",
    )
    targets: dict[str, Annotated[float, Field(gt=0)]] = Field(
        default_factory=dict,
        description="More thresholds, each of which must hold too: a domain's loss at or "
        'below it ({code = 3.1}), or a task metric ("task/arith/exact_match" = 0.5): '
        "accuracies at least, bpb at most.",
    )
    confirm_by: Literal["threshold", "interval"] = Field(
        "threshold",
        description="interval: a task target holds only when its whole 95% interval is "
        "on the right side of the threshold (an accuracy's lower bound at least it).",
    )
    tasks: list[TaskConfig] = Field(
        default_factory=list,
        description="Downstream tasks ([[eval.tasks]]) scored at every evaluation.",
    )
    confirm: int = Field(
        1,
        ge=1,
        description="Consecutive evaluations at or below the target that confirm it; the "
        "target is confirmed at the last of them.",
    )
    stop_at_target: bool = Field(True, description="Stop training once the target is confirmed.")
    budget_tokens: int = Field(
        0, ge=0, description="Stop after this many training tokens; 0 = no token budget."
    )
    budget_seconds: float = Field(
        0, ge=0, description="Stop once the run's wall time (all phases) reaches this; 0 = none."
    )
    budget_device_hours: float = Field(
        0,
        ge=0,
        description="Stop as not reached once the run's device time (wall x devices held, "
        "every phase and resume) reaches this many device-hours; 0 = none.",
    )
    patience: int = Field(
        0,
        ge=0,
        description="Stop as not reached once this many evaluations in a row failed to "
        "improve on the best (by more than min_delta); 0 = off.",
    )
    min_delta: float = Field(
        0.0,
        ge=0,
        description="patience: how far below the best an evaluation must be to improve "
        "on it (0 = strictly below), in the target's unit.",
    )
    project: bool = Field(
        False,
        description="Stop as not reached once a power law fitted to the validation curve "
        "over tokens puts even the optimistic end of its 95% interval at the token budget "
        "above the target (from 6 evaluations, the last at 10% of the budget).",
    )
    asynchronous: bool = Field(
        False,
        description="Evaluate a snapshot of the weights in a background thread while "
        "training continues; the result is bound to the snapshot's step and hash.",
    )
    sources: list[SourceSpec] = Field(
        default_factory=list,
        description="A validation set fixed by you (same syntax as data.sources), scored "
        "instead of a val_fraction of the training sources and checked for contamination "
        "against the training text.",
    )
    test_sources: list[SourceSpec] = Field(
        default_factory=list,
        description="A test set fixed by you, instead of data.test_fraction.",
    )

    @model_validator(mode="after")
    def _task_targets_name_tasks(self) -> EvalConfig:
        kinds = {t.name: t for t in self.tasks}
        if len(kinds) < len(self.tasks):
            names = [t.name for t in self.tasks]
            twice = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(f"eval.tasks: task name(s) {', '.join(twice)} given twice")
        keys = [k for k in self.targets if "/" in k]
        if self.metric.startswith("task/"):
            if self.metric not in self.targets:
                raise ValueError(
                    f"eval.metric {self.metric} is a task metric: give its threshold in "
                    f'eval.targets ("{self.metric}" = ...)'
                )
            if self.target_bpb is not None:
                raise ValueError("target_bpb is for a loss metric, not a task metric")
            if self.project:
                raise ValueError("eval.project fits a loss curve: not with a task metric")
        for key in keys:
            found = _TASK_METRIC.fullmatch(key)
            if found is None:
                raise ValueError(f"eval.targets key {key!r}: a domain name or task/<name>/<metric>")
            name, metric = found.groups()
            if name not in kinds:
                raise ValueError(f"eval.targets {key}: no task {name!r} in eval.tasks")
            if metric not in kinds[name].metrics:
                raise ValueError(
                    f"eval.targets {key}: task {name} ({kinds[name].task_kind}) has "
                    f"{', '.join(kinds[name].metrics)}, not {metric}"
                )
            threshold = self.targets[key]
            if metric != "bpb" and threshold > 1:
                raise ValueError(f"eval.targets {key} = {threshold:g}: an accuracy is at most 1")
            if metric != "bpb" and threshold == 1 and self.confirm_by == "interval":
                raise ValueError(
                    f"eval.targets {key} = 1 under confirm_by = interval: the lower end of "
                    "an accuracy's interval is below 1, so it could never hold"
                )
        return self

    def target(self) -> tuple[str, float, str]:
        """(metric, threshold, unit) of the target: the loss in nat/token, or with
        ``target_bpb`` the same measure in bits per byte, or a task metric with its
        threshold in ``targets`` (an accuracy, or bits per byte)."""
        if self.metric.startswith("task/"):
            unit = "bit/byte" if self.metric.endswith("/bpb") else "accuracy"
            return self.metric, self.targets[self.metric], unit
        if self.target_bpb is None:
            return self.metric, self.target_loss, "nat/token"
        return "bpb" + self.metric.removeprefix("loss"), self.target_bpb, "bit/byte"

    def contract(self) -> dict[str, Any]:
        """What the ledger stores as the run's target contract."""
        metric, threshold, unit = self.target()
        return {
            "metric": metric,
            "unit": unit,
            "threshold": threshold,
            "targets": dict(self.targets),
            "confirm": self.confirm,
            "confirm_by": self.confirm_by,
            "tasks": [t.model_dump(exclude_defaults=True) for t in self.tasks],
            "every_steps": None if self.every_tokens else self.every_steps,
            "every_tokens": self.every_tokens or None,
            "val_max_tokens": self.max_tokens,
            "test_max_tokens": self.test_max_tokens or None,
            "budget_tokens": self.budget_tokens or None,
            "budget_seconds": self.budget_seconds or None,
            "budget_device_hours": self.budget_device_hours or None,
            "patience": self.patience or None,
            "min_delta": self.min_delta if self.patience else None,
            "project": self.project,
            "asynchronous": self.asynchronous,
        }


class LogConfig(_Section):
    """Where a run's series are also sent while it trains. The ledger stays the record;
    a sink that fails is written down as an event and dropped, never stops training."""

    sinks: list[Literal["tensorboard", "mlflow", "wandb"]] = Field(
        default_factory=list,
        description="tensorboard, mlflow and/or wandb (pip install 'ledgerlm[<sink>]').",
    )
    dir: str | None = Field(
        None, description="Folder of TensorBoard and offline W&B files; default <run>/logs."
    )
    mlflow_uri: str | None = Field(
        None, description="MLflow tracking URI; default MLFLOW_TRACKING_URI or MLflow's own."
    )
    mlflow_experiment: str = Field("ledgerlm", min_length=1)
    wandb_project: str = Field("ledgerlm", min_length=1)
    wandb_mode: Literal["online", "offline"] | None = Field(
        None, description="W&B mode; default WANDB_MODE or W&B's own."
    )
    ledger_timeout: float = Field(
        600.0,
        gt=0,
        description="Seconds the ledger may stay locked by another process (a backup, a "
        "notebook) before the run is checkpointed and marked failed; training goes on "
        "meanwhile, its per-update rows kept in memory.",
    )


class CostConfig(_Section):
    """Prices of device time, so time-to-target also reads in currency. A run records
    the rate in force when it (re)starts, so a later edit never rewrites its bill."""

    per_device_hour: dict[str, float] = Field(
        default_factory=dict,
        description="Currency per device-hour by device kind or name, e.g. {cuda = 2.5, "
        "cpu = 0.05} (a name beats its kind; these beat <workspace>/cost.toml's).",
    )

    @field_validator("per_device_hour")
    @classmethod
    def _rates_not_negative(cls, table: dict[str, float]) -> dict[str, float]:
        for key, rate in table.items():
            if rate < 0:
                raise ValueError(f"per_device_hour.{key} must be >= 0, got {rate!r}")
        return table


class Recipe(_Section):
    name: str = "recipe"
    data: DataConfig = Field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig)
    pack: PackConfig = Field(default_factory=PackConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    log: LogConfig = Field(default_factory=LogConfig)
    cost: CostConfig = Field(default_factory=CostConfig)

    @field_validator("name")
    @classmethod
    def _name_is_a_slug(cls, name: str) -> str:
        if problem := name_problem(name):
            raise PydanticCustomError(
                "name",
                "{name} {problem}: use {rule}",
                {"name": shown(name), "problem": problem, "rule": NAME_RULE},
            )
        return name

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def data_stage(self) -> DataConfig:
        """The data stage's configuration: ``[data]`` with the held-out sets of ``[eval]``."""
        return self.data.model_copy(
            update={"val_sources": self.eval.sources, "test_sources": self.eval.test_sources}
        )

    def unused_settings(self) -> dict[str, str]:
        """The settings nothing reads in this recipe, by dotted key (a section's key for
        the whole section), each with the reason: another setting overrides it, or it
        belongs to a choice the recipe did not make. ``config show`` marks them, and a
        run's sinks are sent only the settings in effect (``settings_in_effect``)."""
        t = self.train
        inputs = [
            *self.data.inputs(),
            *_as_inputs([*self.eval.sources, *self.eval.test_sources]),
            *_as_inputs(self.data.contamination.eval_files),
        ]
        rules = {
            "eval.target_loss": (self.eval.target_bpb is not None, "target_bpb is set"),
            "eval.min_delta": (self.eval.patience == 0, "patience is 0"),
            "data.builtin": (not any(i.is_builtin() for i in inputs), "no source is builtin"),
            "train.muon_lr": (t.optimizer != "muon", f"optimizer is {t.optimizer}"),
            "train.decay_fraction": (t.schedule != "wsd", f"schedule is {t.schedule}"),
            "train.min_lr_ratio": (t.schedule == "constant", "schedule is constant"),
            "train.warmup_steps": (t.schedule_unit == "tokens", "schedule_unit is tokens"),
            "train.warmup_tokens": (t.schedule_unit == "steps", "schedule_unit is steps"),
            "train.schedule_tokens": (t.schedule_unit == "steps", "schedule_unit is steps"),
            "train.empty_rows": (t.objective == "token_mean", "objective is token_mean"),
        }
        return {key: reason for key, (unused, reason) in rules.items() if unused}

    def digest(self, *sections: str) -> str:
        """A stable hash of the named sections (all but ``[log]`` and ``[cost]`` when none
        are named: where the series are also sent, or what a device-hour costs, changes
        nothing a checkpoint depends on)."""
        full = self.to_dict()
        picked = {k: full[k] for k in sections} if sections else full
        picked = {k: v for k, v in picked.items() if sections or k not in ("log", "cost")}
        blob = json.dumps(picked, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()


def _parse_value(text: str) -> Any:
    """A --set value is read as a TOML value when it parses as one, else as a string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_overrides(tree: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``section.key=value`` overrides to a raw recipe dict (returns a new dict)."""
    out = json.loads(json.dumps(tree))
    for item in overrides:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise RecipeError(f"--set {item!r}: expected section.key=value")
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise RecipeError(f"--set {key}: {part!r} is a value, not a section")
            node = child
        node[parts[-1]] = _parse_value(value.strip())
    return out


def _keys_at(loc: list[Any]) -> list[str]:
    """The keys a recipe section at ``loc`` may hold (for "did you mean")."""
    model: Any = Recipe
    for part in loc:
        if isinstance(part, int):
            continue  # an item of a list of tables: the same model
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return []
        model = _model_in(field.annotation)
    return list(getattr(model, "model_fields", {}))


def _model_in(annotation: Any) -> Any:
    """The section model inside an annotation (list[X], X | None, Annotated unions)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):  # Annotated[X, ...] gives X first
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _describe(err: ValidationError, origin: str) -> str:
    first = err.errors()[0]
    loc = first["loc"]
    # a source's union tag (right after its list index) is no key of the recipe
    loc = [
        p
        for i, p in enumerate(loc)
        if not (i and isinstance(loc[i - 1], int) and p in _SOURCE_TAGS)
        and not (i and p in _UNION_TAGS.get(str(loc[i - 1]), ()))
    ]
    where = ".".join(str(p) for p in loc) or "(recipe)"
    if first["type"] == "extra_forbidden":
        close = difflib.get_close_matches(str(loc[-1]), _keys_at(loc[:-1]), n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        return f"{origin}: unknown key '{where}'{hint}"
    if first["type"] == "finite_number":
        return f"{origin}: {where}: must be a finite number, got {first['input']!r}"
    msg = first["msg"].removeprefix("Value error, ")
    return f"{origin}: {where}: {msg}"


def recipe_from_dict(tree: dict[str, Any], origin: str = "<recipe>") -> Recipe:
    try:
        return Recipe.model_validate(tree)
    except ValidationError as err:
        raise RecipeError(_describe(err, origin)) from None


def read_toml(path: Path, what: str) -> dict[str, Any]:
    """The tables of a TOML file of settings (``what`` it holds, for the message); a file
    that cannot be read or is not TOML is one line naming it (``RecipeError``)."""
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise RecipeError(f"{path}: not valid TOML: {err}") from None
    except OSError as err:
        raise RecipeError(f"{path}: cannot read {what}: {err.strerror or err}") from None


def load_recipe(path: str | Path, overrides: list[str] | None = None) -> Recipe:
    """Load a TOML recipe and apply ``--set`` overrides; errors name the file and key."""
    path = Path(path)
    if not path.is_file():
        raise RecipeError(f"{path}: recipe file not found")
    tree = read_toml(path, "the recipe")
    origin = str(path)
    if overrides:
        tree = apply_overrides(tree, overrides)
        origin = f"{path} (with --set)"
    if "name" not in tree:  # the file name, when it is a valid name
        if problem := name_problem(path.stem):
            raise RecipeError(
                f"{path}: name: not set, and the file name {shown(path.stem)} {problem}: "
                f'set name = "..." in the recipe ({NAME_RULE})'
            )
        tree["name"] = path.stem
    return recipe_from_dict(tree, origin)


def settings_in_effect(tree: dict[str, Any]) -> dict[str, Any]:
    """A recipe tree (``Recipe.to_dict``, or the one a run stored) without the settings
    ``Recipe.unused_settings`` names: what a run's sinks are sent. A stored tree that no
    longer validates is returned whole."""
    try:
        unused = recipe_from_dict(tree).unused_settings()
    except RecipeError:
        return tree
    out = json.loads(json.dumps(tree))
    for key in unused:
        *sections, last = key.split(".")
        node = out
        for part in sections:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(last, None)
    return out


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def recipe_to_toml(recipe: Recipe) -> str:
    """Render a resolved recipe as TOML (sections of scalars and arrays only), a setting
    nothing reads marked with a comment (``target_loss = 4.0  # unused: target_bpb is
    set``, from ``Recipe.unused_settings``)."""
    unused = recipe.unused_settings()

    def key_of(k: str) -> str:  # task/<name>/<metric> is not a bare TOML key
        return k if _BARE_KEY.fullmatch(k) else json.dumps(k)

    def note(key: str) -> str:
        return f"  # unused: {unused[key]}" if key in unused else ""

    def scalar(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, list | tuple):
            return "[" + ", ".join(scalar(x) for x in v) + "]"
        if isinstance(v, dict):  # an inline table; TOML has no null, so None is left out
            return (
                "{"
                + ", ".join(f"{key_of(k)} = {scalar(x)}" for k, x in v.items() if x is not None)
                + "}"
            )
        return repr(v)

    lines: list[str] = []

    def section(prefix: str, node: dict[str, Any]) -> None:
        flat = {k: v for k, v in node.items() if not isinstance(v, dict) and v is not None}
        nested = {k: v for k, v in node.items() if isinstance(v, dict)}
        if prefix:
            lines.append(f"\n[{prefix}]{note(prefix)}")
        dotted = f"{prefix}." if prefix else ""
        lines.extend(f"{key_of(k)} = {scalar(v)}{note(dotted + k)}" for k, v in flat.items())
        for k, v in nested.items():
            section(f"{prefix}.{key_of(k)}" if prefix else key_of(k), v)

    section("", recipe.to_dict())
    return "\n".join(lines).lstrip() + "\n"
