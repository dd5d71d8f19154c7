"""A reused data version checked against its manifest before anything reads it.

Always (cheap: the manifest, file sizes and Parquet footers): every listed shard is a
readable Parquet file of the size and row count the manifest gives, the rows per split
add up to the manifest's counts, and the counts to its conservation equation. With
``content`` each shard is also hashed against the sha256 stored when it was written.
Any disagreement is a ``DamagedVersion`` naming the file and what differs. Once
checked, a version's splits are read shard by shard with ``iter_split``.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from ledgerlm.data.passes import SPLITS, read_parquet
from ledgerlm.workspace import MANIFEST, BuiltVersion, DamagedVersion, file_sha256

_JSON_NAMES = {dict: "object", list: "list", int: "integer", str: "string"}


def field(obj: Any, key: str, kind: type, where: Path, label: str = "") -> Any:
    """``obj[key]`` if it is a JSON ``kind`` (a bool is no integer); else the manifest
    ``where`` is damaged, e.g. ``no 'files' list``."""
    value = obj.get(key) if isinstance(obj, dict) else None
    if not isinstance(value, kind) or isinstance(value, bool):
        raise DamagedVersion(where, f"no {label}{key!r} {_JSON_NAMES[kind]}")
    return value


def listed_files(folder: Path, manifest: dict[str, Any], count: str) -> list[dict[str, Any]]:
    """The manifest's ``files``: each a plain file name in ``folder``, present, with a
    split and a non-negative ``count`` (rows or tokens), and its size when recorded."""
    where = folder / MANIFEST
    files = field(manifest, "files", list, where)
    for i, f in enumerate(files):
        name = field(f, "path", str, where, f"files[{i}].")
        if Path(name).name != name or name.startswith("."):
            raise DamagedVersion(where, f"files[{i}].path {name!r} is not a file of the version")
        if field(f, "split", str, where, f"files[{i}].") not in SPLITS:
            raise DamagedVersion(where, f"files[{i}].split {f['split']!r} is not one of {SPLITS}")
        if field(f, count, int, where, f"files[{i}].") < 0:
            raise DamagedVersion(where, f"files[{i}].{count} is negative")
        path = folder / name
        if not path.is_file():
            raise DamagedVersion(path, "missing (the manifest lists it)")
        if "bytes" in f:
            said = field(f, "bytes", int, where, f"files[{i}].")
            if (size := path.stat().st_size) != said:
                raise DamagedVersion(path, f"{size:,} bytes, manifest says {said:,}")
    return files


def hash_matches(path: Path, digest: Any, content: bool) -> int:
    """With ``content``, ``path``'s sha256 must be ``digest``; its size in bytes."""
    if content and not isinstance(digest, str):
        raise DamagedVersion(path.parent / MANIFEST, f"no sha256 for {path.name}")
    if content and file_sha256(path) != digest:
        raise DamagedVersion(path, "content differs from the sha256 in the manifest")
    return path.stat().st_size


def verify_data(folder: Path, manifest: dict[str, Any], content: bool = True) -> dict[str, Any]:
    """Check a data version (see the module); what was checked and its seconds."""
    start = time.perf_counter()
    where = folder / MANIFEST
    files = listed_files(folder, manifest, "rows")
    counts = field(manifest, "counts", dict, where)
    by_split = field(counts, "by_split", dict, where, "counts.")
    total = 0
    for f in files:
        path = folder / f["path"]
        try:
            rows = pq.ParquetFile(path).metadata.num_rows
        except Exception as err:  # pyarrow raises several kinds for a damaged file
            raise DamagedVersion(path, f"not a readable Parquet file ({err})") from None
        if rows != f["rows"]:
            raise DamagedVersion(path, f"{rows:,} rows, manifest says {f['rows']:,}")
        total += hash_matches(path, f.get("sha256"), content)
    try:
        _counts(where, files, counts, by_split)
    except (TypeError, AttributeError, KeyError) as err:  # a count missing or not a number
        raise DamagedVersion(where, f"counts are not numbers where expected ({err})") from None
    return {
        "files": len(files),
        "bytes": total,
        "hash": "sha256" if content else None,
        "seconds": round(time.perf_counter() - start, 4),
    }


def _counts(where: Path, files: list[dict], counts: dict, by_split: dict) -> None:
    """The rows per split equal the counts, and the counts add up."""
    for split in SPLITS:
        in_files = sum(f["rows"] for f in files if f["split"] == split)
        if (said := by_split.get(split, 0)) != in_files:
            raise DamagedVersion(
                where, f"counts say {said:,} {split} documents, its files hold {in_files:,}"
            )
    kept = field(counts, "kept", int, where, "counts.")
    fixed = sum((counts.get("fixed") or {}).values())
    if (in_splits := sum(by_split.values())) != kept + fixed:
        also = f" + {fixed:,} fixed" if fixed else ""
        raise DamagedVersion(
            where, f"{in_splits:,} documents in splits, counts say {kept:,} kept{also}"
        )
    records = field(counts, "records_in", int, where, "counts.")
    dropped = sum(d["documents"] for d in counts.get("dropped") or [])
    quarantined = counts.get("quarantined", 0)
    if records != kept + dropped + quarantined:
        raise DamagedVersion(
            where,
            f"counts say {records:,} records in, but {kept:,} kept + {dropped:,} dropped "
            f"+ {quarantined:,} quarantined",
        )


def verified(built: BuiltVersion, content: bool = True) -> BuiltVersion:
    """``built`` (a reused data version) once checked, with what the check found."""
    report = verify_data(built.path, built.manifest, content)
    return dataclasses.replace(built, verified=report, seconds=built.seconds + report["seconds"])


def iter_split(data_dir: Path, manifest: dict[str, Any], split: str):
    """Stream one split of a data version shard by shard (pyarrow Tables)."""
    for f in manifest["files"]:
        if f["split"] == split:
            yield read_parquet(data_dir / f["path"])
