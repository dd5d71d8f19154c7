"""Inputs to shards: globs, folders of text files, Hugging Face ``datasets`` folders."""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import posixpath
from collections.abc import Iterator
from pathlib import Path

from ledgerlm.config import InputConfig
from ledgerlm.data.read.files import unreadable_cause
from ledgerlm.data.read.shard import BUILTIN_STDLIB, TEXT_SUFFIXES, ReaderError, Shard

_JSONL_SUFFIXES = tuple(ext + comp for ext in (".jsonl", ".ndjson") for comp in ("", ".gz", ".zst"))
_GLOB_CHARS = frozenset("*?[")


def infer_format(name: str) -> str | None:
    """Format from the file name alone, so a shard's reader is known before it is opened."""
    lower = name.lower()
    if lower.endswith(".parquet"):
        return "parquet"
    if lower.endswith(".arrow"):
        return "arrow"
    if lower.endswith(_JSONL_SUFFIXES):
        return "jsonl"
    if lower.endswith(TEXT_SUFFIXES):
        return "text"
    return None


def expand_inputs(
    inputs: list[InputConfig], base: Path, text_files_per_shard: int = 1000, dated: bool = False
) -> list[Shard]:
    """Inputs in recipe order, matches sorted, so shard indices are the same on every run.

    ``dated``: the records' dates are read strictly (``Shard.dated``)."""
    if text_files_per_shard < 1:
        raise ValueError("text_files_per_shard must be at least 1")
    shards: list[Shard] = []
    for inp in inputs:
        for shard in _expand_one(inp, Path(base), text_files_per_shard):
            shard = dataclasses.replace(shard, date_field=inp.date_field, dated=dated)
            shards.append(dataclasses.replace(shard, index=len(shards)))
    return shards


def _expand_one(inp: InputConfig, base: Path, per_shard: int) -> Iterator[Shard]:
    if inp.is_builtin():
        yield _builtin_shard(inp)
        return
    source = inp.source if inp.source is not None else inp.path
    covered: list[str] = []  # folders already read as text inputs
    loose: list[str] = []  # text files matched one by one, grouped under the input root
    root = _input_root(inp.path, base)
    for match in _matches(inp, base):
        if any(_is_within(match, folder) for folder in covered):
            continue  # `dir/**` also lists the folder's own files
        if os.path.isdir(match):
            covered.append(match)
            if arrow := hf_dataset_files(match):
                for path in arrow:
                    yield Shard(
                        0, source, "arrow", path, (), inp.domain, _rel(path, base), _fields(inp)
                    )
                continue
            yield from _folder_shards(inp, source, match, base, per_shard)
            continue
        fmt = _file_format(inp, match)
        if fmt == "text":
            loose.append(posixpath.relpath(_posix(match), _posix(root)))
            continue
        yield Shard(0, source, fmt, match, (), inp.domain, _rel(match, base), _fields(inp))
    yield from _text_shards(inp, source, root, loose, base, per_shard)


def _fields(inp: InputConfig) -> tuple[str, str, str]:
    return (inp.text_field, inp.id_field, inp.domain_field)


def hf_dataset_files(folder: str) -> list[str]:
    """The Arrow files of a Hugging Face ``datasets`` folder saved with ``save_to_disk``
    (a ``Dataset``: its ``state.json`` lists them; a ``DatasetDict``: every split in
    ``dataset_dict.json`` order), or [] when the folder is not one."""
    try:
        if os.path.isfile(os.path.join(folder, "dataset_dict.json")):
            with open(os.path.join(folder, "dataset_dict.json"), encoding="utf-8") as f:
                splits = json.load(f)["splits"]
            return [p for split in splits for p in hf_dataset_files(os.path.join(folder, split))]
        if os.path.isfile(os.path.join(folder, "state.json")):
            with open(os.path.join(folder, "state.json"), encoding="utf-8") as f:
                files = [d["filename"] for d in json.load(f)["_data_files"]]
            return [os.path.join(folder, name) for name in files]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ReaderError(f"'{folder}': not a readable datasets folder: {err}") from None
    return []


def _builtin_shard(inp: InputConfig) -> Shard:
    if not inp.path.startswith("builtin:"):
        raise ReaderError(f"input '{inp.path}': format 'builtin' needs '{BUILTIN_STDLIB}'")
    if inp.path != BUILTIN_STDLIB:
        name = inp.path.removeprefix("builtin:")
        raise ReaderError(f"input '{inp.path}': unknown built-in corpus '{name}' (known: stdlib)")
    if inp.format not in ("auto", "builtin"):
        raise ReaderError(f"input '{inp.path}': a built-in corpus cannot be read as {inp.format}")
    return Shard(0, BUILTIN_STDLIB, "builtin", BUILTIN_STDLIB, (), inp.domain)


def _has_glob(path: str) -> bool:
    return any(ch in _GLOB_CHARS for ch in path)


def _absolute(path: str, base: Path) -> str:
    return os.path.abspath(path if os.path.isabs(path) else os.path.join(base, path))


def _matches(inp: InputConfig, base: Path) -> list[str]:
    """Absolute paths, sorted by their text so that order never depends on the filesystem."""
    if not _has_glob(inp.path):
        full = _absolute(inp.path, base)
        if not os.path.exists(full):
            why = unreadable_cause(full) if os.path.islink(full) else "no such file or folder"
            raise ReaderError(f"input '{inp.path}': {why}")
        return [full]
    found = glob.glob(inp.path, root_dir=base, recursive=True)
    if not found:
        raise ReaderError(f"input '{inp.path}': matches no file")
    return [_absolute(p, base) for p in sorted(found)]


def _input_root(path: str, base: Path) -> str:
    """The folder that ids of loose text files are relative to: the pattern's fixed prefix."""
    parts = Path(path).parts
    fixed = []
    for part in parts:
        if _has_glob(part):
            break
        fixed.append(part)
    if len(fixed) == len(parts):  # a plain path: its folder, or itself if it is one
        full = _absolute(path, base)
        return full if os.path.isdir(full) else os.path.dirname(full)
    return _absolute(os.path.join(*fixed) if fixed else ".", base)


def _is_within(path: str, folder: str) -> bool:
    return path.startswith(folder.rstrip(os.sep) + os.sep)


def _posix(path: str) -> str:
    return Path(path).as_posix()


def _rel(path: str, base: Path) -> str:
    try:
        return Path(path).relative_to(os.path.abspath(base)).as_posix()
    except ValueError:
        return ""


def _file_format(inp: InputConfig, path: str) -> str:
    fmt = inp.format if inp.format != "auto" else infer_format(os.path.basename(path))
    if fmt is None:
        name = os.path.basename(path)
        raise ReaderError(
            f"input '{inp.path}': unknown extension of '{name}' "
            "(expected .jsonl[.gz|.zst], .ndjson[.gz|.zst], .parquet, .txt, .md)"
        )
    return fmt


def _folder_shards(
    inp: InputConfig, source: str, folder: str, base: Path, per_shard: int
) -> Iterator[Shard]:
    if inp.format not in ("auto", "text"):
        raise ReaderError(f"input '{inp.path}': '{folder}' is a folder, not a {inp.format} file")
    try:
        files = _text_files(folder)
    except OSError as err:
        raise ReaderError(
            f"input '{inp.path}': folder '{folder}' cannot be listed: {err.strerror or err}"
        ) from None
    if not files:
        raise ReaderError(f"input '{inp.path}': folder '{folder}' has no .txt or .md file")
    yield from _text_shards(inp, source, folder, files, base, per_shard)


def _text_files(folder: str) -> list[str]:
    """Relative POSIX paths of the text files under ``folder``, sorted.

    Folder links are followed, except one back to a folder above it (a cycle): that
    link is listed as a path of its own, like a broken link (looping or dangling,
    whatever its name) and a subfolder that cannot be listed. Reading such a path
    quarantines it with its cause, so nothing under the folder disappears silently and
    no walk goes round forever. Raises ``OSError`` if ``folder`` itself cannot be listed.
    """
    found: list[str] = []
    top = os.stat(folder)
    stack = [(folder, "", frozenset({(top.st_dev, top.st_ino)}))]
    while stack:
        path, rel, above = stack.pop()
        try:
            with os.scandir(path) as it:
                entries = list(it)
        except OSError:
            if not rel:
                raise
            found.append(rel)
            continue
        for entry in entries:
            sub = f"{rel}/{entry.name}" if rel else entry.name
            try:
                is_dir = entry.is_dir()  # follows a link
                key = None
                if is_dir:
                    st = entry.stat()
                    key = (st.st_dev, st.st_ino)
                elif entry.is_symlink():
                    os.stat(entry.path)  # raises for a looping or dangling link
            except OSError:
                found.append(sub)
                continue
            if key is not None:
                if key in above:
                    found.append(sub)  # a link back to a folder above: a cycle
                else:
                    stack.append((entry.path, sub, above | {key}))
            elif entry.name.lower().endswith(TEXT_SUFFIXES):
                found.append(sub)
    return sorted(found)


def _text_shards(
    inp: InputConfig,
    source: str,
    folder: str,
    files: list[str],
    base: Path,
    per_shard: int,
) -> Iterator[Shard]:
    rel = _rel(folder, base)
    for start in range(0, len(files), per_shard):
        chunk = tuple(files[start : start + per_shard])
        yield Shard(
            0, source, "text", folder, chunk, inp.domain, rel, _fields(inp), inp.split_rule()
        )
