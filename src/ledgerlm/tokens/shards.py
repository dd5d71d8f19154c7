"""The tokens stage: memory-mapped token shards plus a document index.

Each split (train, val, test) is one flat array of token ids on disk
(``uint16`` when the vocabulary fits, else ``uint32``) with no BOS/EOS; the
index gives each document's shard, offset, length, id, domain and split. An
empty split has an empty shard file and no index rows. Packing adds the
boundaries, so one token version serves any packing recipe.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ledgerlm.config import TokenizerConfig
from ledgerlm.data.passes import SPLITS
from ledgerlm.data.verify import iter_split
from ledgerlm.progress import NullProgress, Progress
from ledgerlm.tokens.tokenizer import (
    TokenText,
    load_supplied,
    special_ids,
    token_text,
    tokenizer_file,
    train_tokenizer,
)
from ledgerlm.tokens.verify import INDEX, TOKENIZER, check_tokens, open_tokenizer, verified
from ledgerlm.workspace import (
    BUILD_INFO,
    MANIFEST,
    SCHEMA_VERSION,
    AlreadyPublished,
    BuiltVersion,
    Workspace,
    atomic_write_json,
    content_hash,
    file_sha256,
    read_manifest,
)

INDEX_SCHEMA = pa.schema(
    [
        ("doc_id", pa.string()),
        ("domain", pa.string()),
        ("split", pa.string()),
        ("shard", pa.string()),
        ("offset", pa.int64()),
        ("length", pa.int64()),
        ("weight", pa.float64()),
    ]
)


def tokens_version(data_version: str, cfg: TokenizerConfig) -> str:
    """Hashes the data version and ``[tokenizer]``, and a supplied tokenizer's bytes."""
    parts: list[Any] = [data_version, cfg.model_dump(mode="json")]
    if cfg.from_ is not None:
        parts.append(file_sha256(tokenizer_file(cfg.from_)))
    return content_hash("tokens", SCHEMA_VERSION, *parts)


def build_tokens(
    data: BuiltVersion,
    cfg: TokenizerConfig,
    workspace: Workspace,
    progress: Progress | None = None,
    verify: bool = True,
) -> BuiltVersion:
    """Train the tokenizer on the train split only (or reuse another token version's,
    ``cfg.reuse``), then encode every split (train, val, test) shard by shard.

    Another process building the same version is waited for, and its version reused. A
    reused version is checked against its manifest first (``tokens.verify``; without
    ``verify``, everything but the content hashes)."""
    progress = progress or NullProgress()
    start = time.perf_counter()
    version = tokens_version(data.version, cfg)
    if reused := workspace.reuse("tokens", version, start):
        return verified(reused, verify)
    source = None
    if cfg.reuse:
        source = workspace.reuse("tokens", cfg.reuse, start)
        if not source:
            raise FileNotFoundError(
                f"tokenizer.reuse = {cfg.reuse!r}: no such tokens version in {workspace.root}"
            )
        source = verified(source, verify)
    try:
        with workspace.building("tokens", version, progress=progress) as tmp:
            _build(data, cfg, version, source, tmp, progress, start)
    except AlreadyPublished:  # another process built it while this one waited
        return verified(workspace.published("tokens", version, start, reused=True), verify)
    return workspace.published("tokens", version, start)


def _build(
    data: BuiltVersion,
    cfg: TokenizerConfig,
    version: str,
    source: BuiltVersion | None,
    tmp: Path,
    progress: Progress,
    start: float,
) -> None:
    def train_texts():
        for table in iter_split(data.path, data.manifest, "train"):
            yield from table.column("text").to_pylist()

    special: dict[str, int] | None = None
    kind, trained_on = "byte-level BPE (huggingface tokenizers)", "train split only"
    if source is not None:
        tok = open_tokenizer(source.path, source.manifest["tokenizer"]["vocab_size"])
        special, trained_on = source.manifest["tokenizer"]["special"], f"tokens version {cfg.reuse}"
    elif cfg.from_ is not None:
        supplied = load_supplied(cfg.from_, {"bos": cfg.bos, "eos": cfg.eos, "pad": cfg.pad})
        tok, special = supplied.tokenizer, supplied.special
        kind, trained_on = "supplied (huggingface tokenizers)", f"supplied: {supplied.path}"
    else:
        with progress.task("tokens: train BPE") as task:
            tok = train_tokenizer(train_texts(), cfg)
            task.advance(1)
    tok.save(str(tmp / TOKENIZER))
    vocab = tok.get_vocab_size()
    dtype = np.uint16 if vocab <= np.iinfo(np.uint16).max + 1 else np.uint32

    index_rows: list[dict[str, Any]] = []
    files, counts = [], []
    total_docs = data.manifest["counts"]["kept"]
    with progress.task("tokens: encode", total=total_docs) as task:
        for split in SPLITS:
            shard = f"{split}.bin"
            offset = 0
            per_domain: dict[str, list[int]] = {}
            with open(tmp / shard, "wb") as out:
                for table in iter_split(data.path, data.manifest, split):
                    texts = table.column("text").to_pylist()
                    encodings = tok.encode_batch(texts, add_special_tokens=False)
                    weights = (
                        table.column("weight").to_pylist()
                        if "weight" in table.column_names
                        else [1.0] * len(texts)
                    )
                    for doc_id, domain, weight, enc in zip(
                        table.column("id").to_pylist(),
                        table.column("domain").to_pylist(),
                        weights,
                        encodings,
                        strict=True,
                    ):
                        ids = np.asarray(enc.ids, dtype=dtype)
                        out.write(ids.tobytes())
                        index_rows.append(
                            {
                                "doc_id": doc_id,
                                "domain": domain,
                                "split": split,
                                "shard": shard,
                                "offset": offset,
                                "length": len(ids),
                                "weight": weight,
                            }
                        )
                        offset += len(ids)
                        stat = per_domain.setdefault(domain, [0, 0])
                        stat[0] += 1
                        stat[1] += len(ids)
                    task.advance(len(texts))
            files.append({"path": shard, "split": split, "tokens": offset, **_stored(tmp / shard)})
            counts += [
                {"split": split, "domain": d, "documents": n, "tokens": t}
                for d, (n, t) in sorted(per_domain.items())
            ]
    pq.write_table(pa.Table.from_pylist(index_rows, schema=INDEX_SCHEMA), tmp / INDEX)
    manifest = {
        "schema_version": SCHEMA_VERSION,
        "kind": "tokens",
        "version": version,
        "data_version": data.version,
        "tokenizer": {
            "type": kind,
            "config": cfg.model_dump(mode="json"),
            "vocab_size": vocab,
            "special": special if special is not None else special_ids(tok),
            "trained_on": trained_on,
            **_stored(tmp / TOKENIZER),
        },
        "dtype": np.dtype(dtype).name,
        "files": files,
        "index": _stored(tmp / INDEX),
        "counts": counts,
    }
    atomic_write_json(tmp / BUILD_INFO, {"build_seconds": time.perf_counter() - start})
    atomic_write_json(tmp / MANIFEST, manifest)


def _stored(path: Path) -> dict[str, Any]:
    """What a version's manifest keeps of one of its files, for checks on reuse."""
    return {"bytes": path.stat().st_size, "sha256": file_sha256(path)}


class TokenStore:
    """Read side of a token version: memory-mapped shards and the document index.

    Opening one makes the cheap checks of ``tokens.verify.check_tokens`` (sizes, counts,
    the index against them), so a damaged version is one line naming its file."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.manifest = read_manifest(self.path / MANIFEST)
        files, dtype, self.vocab_size = check_tokens(self.path, self.manifest)
        self.tokenizer = open_tokenizer(self.path, self.vocab_size)
        self.special = self.manifest["tokenizer"]["special"]
        self._shards = {
            f["path"]: np.memmap(self.path / f["path"], dtype=dtype, mode="r")
            if f["tokens"]
            else np.zeros(0, dtype=dtype)
            for f in files
        }
        self.index = pq.read_table(self.path / INDEX)
        self.domains = sorted(set(self.index.column("domain").to_pylist()))

    @functools.cached_property
    def text(self) -> TokenText:
        """UTF-8 bytes and characters per token id (for bits per byte)."""
        return token_text(self.tokenizer)

    @functools.lru_cache(maxsize=len(SPLITS))  # noqa: B019 - one store per version, kept
    def split_docs(self, split: str) -> dict[str, np.ndarray]:
        """Columns of the index for one split, as arrays (order = data order); empty
        arrays for a split without documents (or one this version does not have). Built
        once per split: the plan, the sampler and the held-out sets all read them (the
        arrays are shared, not to be changed)."""
        table = self.index.filter(pc.equal(self.index.column("split"), split))
        domain_id = {d: i for i, d in enumerate(self.domains)}
        return {
            "shard": np.asarray(table.column("shard").to_pylist(), dtype=object),
            "offset": table.column("offset").to_numpy(),
            "length": table.column("length").to_numpy(),
            "domain": np.asarray(
                [domain_id[d] for d in table.column("domain").to_pylist()], dtype=np.int64
            ),
            "weight": table.column("weight").to_numpy(),
        }

    def doc_ids(self, split: str, indices: Sequence[int]) -> list[str]:
        """The ids of documents by position in ``split_docs(split)`` (for a report of the
        data an update saw: rare, so the index is read again rather than kept)."""
        table = self.index.filter(pc.equal(self.index.column("split"), split))
        return table.column("doc_id").take(pa.array(indices, type=pa.int64())).to_pylist()

    def tokens(self, shard: str, offset: int, length: int) -> np.ndarray:
        return np.asarray(self._shards[shard][offset : offset + length], dtype=np.int64)
