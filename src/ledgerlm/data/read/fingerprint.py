"""What reading a shard would yield, as one hash: the key of its cached output."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator

from ledgerlm.config import BuiltinCorpusConfig
from ledgerlm.data.builtin import stdlib_fingerprint
from ledgerlm.data.read.files import READ_SIZE, Unreadable, open_regular
from ledgerlm.data.read.shard import DEFAULT_FIELDS, Shard
from ledgerlm.workspace import RecordHasher

# Bump when reading rules change, so fingerprints (and caches keyed on them) expire.
READER_FORMAT = 2


def _file_digest(path: str) -> str:
    """The bytes' sha256; for a path that cannot be read, a hash of why (which is what
    reading it yields: one quarantined record saying so)."""
    h = hashlib.sha256()
    try:
        with open_regular(path) as f:
            while chunk := f.read(READ_SIZE):
                h.update(chunk)
    except (Unreadable, OSError) as err:
        cause = str(err) if isinstance(err, Unreadable) else (err.strerror or str(err))
        return hashlib.sha256(f"unreadable:{cause}".encode()).hexdigest()
    return h.hexdigest()


def _shard_files(shard: Shard) -> Iterator[tuple[str, str]]:
    """(name, path) pairs; names are relative so a moved project keeps its fingerprints."""
    if shard.format == "text":
        for rel in shard.files:
            yield rel, os.path.join(shard.path, rel)
    else:
        yield shard.rel or os.path.basename(shard.path), shard.path


def shard_fingerprint(shard: Shard, builtin: BuiltinCorpusConfig) -> str:
    """Identifies what ``read_shard`` would yield, to decide whether cached output is reusable.

    Besides the bytes it covers the settings that change the documents (format, source,
    default domain) but not ``index``, so adding an input does not expire other shards.
    """
    if shard.format == "builtin":
        return stdlib_fingerprint(builtin)
    h = RecordHasher()
    put = h.put
    domain = shard.domain if shard.domain is not None else "\0none"
    # "ledgerlm.readers": the tag the prints have begun with since reading was one module
    put("ledgerlm.readers", str(READER_FORMAT), shard.format, shard.source, domain)
    if shard.fields != DEFAULT_FIELDS or shard.split != "file":  # defaults keep old prints
        put("fields", *shard.fields, "split", shard.split)
    if shard.date_field != "date" or shard.dated:
        put("date", shard.date_field, "strict" if shard.dated else "as given")
    for name, path in _shard_files(shard):
        put(name, _file_digest(path))
    return h.hexdigest()
