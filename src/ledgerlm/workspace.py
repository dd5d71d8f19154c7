"""Workspace folders, content-addressed versions and atomic writes.

A version id is a hash of its inputs' hashes and its config, so a rerun with the
same inputs finds the finished version and reuses it. A version is built in a
hidden temporary folder and renamed into place only when complete: a reader
never sees a half-written version, and a crash leaves nothing behind that looks
finished.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_WORKSPACE = Path("ledgerlm-work")
MANIFEST = "manifest.json"
# Wall time of a build lives beside the manifest, not in it: the manifest describes
# content and must be identical whoever built it and however fast.
BUILD_INFO = "build.json"
SCHEMA_VERSION = 1
# A builder's private folder (``tempfile.mkdtemp``'s 8 random characters after the
# version), as opposed to a resumable build's fixed ``.building-<version>``.
_PRIVATE_BUILD = re.compile(r"\.building-(.+)-[a-z0-9_]{8}")


def content_hash(*parts: Any, length: int = 16) -> str:
    """Hash JSON-able parts into a short hex id; dict key order does not matter."""
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:length]


class RecordHasher:
    """sha256 over records of string fields, separated so ("ab", "c") != ("a", "bc")."""

    def __init__(self) -> None:
        self._h = hashlib.sha256()

    def put(self, *parts: str) -> None:
        for part in parts:
            self._h.update(part.encode("utf-8", "surrogatepass"))
            self._h.update(b"\0")
        self._h.update(b"\n")

    def hexdigest(self) -> str:
        return self._h.hexdigest()


def file_sha256(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a temporary file in the same folder, fsync, then rename over ``path``.

    The file gets the permissions a plain ``open`` would give it (0666 less the
    umask), not the owner-only mode of the temporary file.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), 0o666 & ~_umask())
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


class DamagedVersion(ValueError):
    """A published version whose files disagree with its manifest, or whose manifest
    cannot be read: one line naming the file, what differs, and how to rebuild it."""

    def __init__(self, file: Path, what: str) -> None:
        version = file.parent.name  # a version's files lie in its folder
        super().__init__(
            f"{file}: {what} (version {version} is damaged: "
            f"`ledgerlm data prepare RECIPE --repair {version}` rebuilds it)"
        )


def read_manifest(path: Path) -> dict[str, Any]:
    """A version's ``manifest.json`` (or ``build.json``): a JSON object, or
    ``DamagedVersion`` naming the file."""
    try:
        found = read_json(path)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DamagedVersion(path, f"not valid JSON ({err})") from None
    if not isinstance(found, dict):
        raise DamagedVersion(path, f"holds a JSON {type(found).__name__}, not an object")
    return found


@contextmanager
def naming_path(path: Path) -> Iterator[None]:
    """An ``OSError`` that names no file (a plain write's, pyarrow's: ``Error writing
    bytes to file. Detail: [errno 28] No space left on device``) is raised again naming
    ``path`` (the folder being written), with its errno and the system's words for it,
    so a full disk says where it is full."""
    try:
        yield
    except OSError as exc:
        if exc.filename is not None:
            raise
        number = exc.errno
        if number is None and (found := re.search(r"\[errno (\d+)\]", str(exc), re.I)):
            number = int(found.group(1))
        if number is None:
            raise OSError(f"{path}: {' '.join(str(exc).split())}") from exc
        raise OSError(number, os.strerror(number), str(path)) from exc


@dataclass(frozen=True)
class BuiltVersion:
    """A finished data or tokens version, and whether this call built or reused it."""

    kind: str
    version: str
    path: Path
    manifest: dict[str, Any]
    reused: bool
    seconds: float  # spent by this call (finding a reused version costs little)
    build_seconds: float | None = None  # what building it originally cost
    verified: dict[str, Any] | None = None  # what checking a reused one found and cost


class AlreadyPublished(RuntimeError):
    """The version was published (by another process) before this builder got the lock."""


def _same_file(f: Any, path: Path) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    own = os.fstat(f.fileno())
    return (own.st_dev, own.st_ino) == (st.st_dev, st.st_ino)


class Workspace:
    """``data/<version>/``, ``tokens/<version>/``, ``runs/<run-id>/``,
    ``mixtures/<search id>.json``, ``tune/<study>/`` and ``ledger.db``."""

    KINDS = ("data", "tokens")

    def __init__(self, root: str | Path = DEFAULT_WORKSPACE) -> None:
        self.root = Path(root)

    @property
    def ledger_path(self) -> Path:
        return self.root / "ledger.db"

    def version_dir(self, kind: str, version: str) -> Path:
        if kind not in self.KINDS:
            raise ValueError(f"unknown version kind {kind!r}")
        return self._inside(kind, version, f"{kind} version")

    def has_version(self, kind: str, version: str) -> bool:
        """A version exists only once its manifest has been renamed into place."""
        return (self.version_dir(kind, version) / MANIFEST).is_file()

    def published(
        self, kind: str, version: str, started: float, reused: bool = False
    ) -> BuiltVersion:
        """The finished ``version``; ``started`` is the caller's ``time.perf_counter()``;
        ``reused``: another call built it."""
        folder = self.version_dir(kind, version)
        info = folder / BUILD_INFO
        return BuiltVersion(
            kind,
            version,
            folder,
            self.manifest(kind, version),
            reused=reused,
            seconds=time.perf_counter() - started,
            build_seconds=read_manifest(info).get("build_seconds") if info.is_file() else None,
        )

    def reuse(self, kind: str, version: str, started: float) -> BuiltVersion | None:
        """The finished version if it already exists, marked as reused; else None."""
        if not self.has_version(kind, version):
            return None
        return self.published(kind, version, started, reused=True)

    def manifest(self, kind: str, version: str) -> dict[str, Any]:
        path = self.version_dir(kind, version) / MANIFEST
        if not path.is_file():
            raise FileNotFoundError(f"no {kind} version {version!r} in {self.root}")
        return read_manifest(path)

    def versions(self, kind: str) -> list[str]:
        folder = self.root / kind
        if not folder.is_dir():
            return []
        return sorted(p.name for p in folder.iterdir() if (p / MANIFEST).is_file())

    def resolve_version(self, kind: str, ref: str) -> str:
        """An exact version id or a unique prefix of one."""
        found = [v for v in self.versions(kind) if v.startswith(ref)]
        if len(found) == 1:
            return found[0]
        if not found:
            raise FileNotFoundError(f"no {kind} version matches {ref!r} in {self.root}")
        raise FileNotFoundError(f"{ref!r} matches {len(found)} {kind} versions: {', '.join(found)}")

    @contextmanager
    def building(
        self,
        kind: str,
        version: str,
        resumable: bool = False,
        *,
        progress: Any = None,
        discard_on: tuple[type[BaseException], ...] = (),
    ) -> Iterator[Path]:
        """Yield a private folder to build ``version`` in; publish it atomically on success.

        An exclusive lock keeps two builders of the same version apart: a second builder
        waits for the first (shown as a ``progress`` task, any object with the
        ``ledgerlm.progress.Progress`` shape), and if the first published the version
        meanwhile, raises ``AlreadyPublished`` before yielding, so the caller reuses it
        instead of building again.

        By default the folder is removed on any error, so nothing half-written is left.
        With ``resumable`` the folder has a fixed hidden name and survives a failure or a
        kill, so a rerun can skip the shards it already finished; an error that is an
        instance of ``discard_on`` (bad input: a rerun of the same version would fail the
        same way) removes it instead. A half-built folder is never a version: only the
        final rename (after the manifest is written) publishes it.
        """
        final = self.version_dir(kind, version)
        final.parent.mkdir(parents=True, exist_ok=True)
        with self._build_lock(kind, version, progress):
            if self.has_version(kind, version):  # published while we waited
                raise AlreadyPublished(f"{kind} version {version} already exists")
            self._remove_dead_builds(kind, version)
            if not resumable:
                tmp = Path(tempfile.mkdtemp(prefix=f".building-{version}-", dir=final.parent))
                try:
                    with naming_path(tmp):
                        yield tmp
                    self._publish(kind, version, tmp, final)
                finally:
                    if tmp.exists():
                        shutil.rmtree(tmp, ignore_errors=True)
                return
            tmp = final.parent / f".building-{version}"
            tmp.mkdir(exist_ok=True)
            try:
                with naming_path(tmp):
                    yield tmp
            except discard_on:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            self._publish(kind, version, tmp, final)

    def _remove_dead_builds(self, kind: str, version: str) -> None:
        """Remove the private folders (``.building-<version>-<random>``) that builders
        killed before they could clean up left behind: those of ``version`` (its lock is
        the caller's) and those of any other version whose lock nobody holds. A
        resumable folder (``.building-<version>``) is kept for its version's next build.
        """
        for tmp in sorted((self.root / kind).glob(".building-*-*")):
            found = _PRIVATE_BUILD.fullmatch(tmp.name)
            if found is None or not tmp.is_dir():
                continue
            owner = found.group(1)
            if owner == version:
                shutil.rmtree(tmp, ignore_errors=True)
                continue
            try:
                with self._build_lock(kind, owner, None, wait=False) as held:
                    if held:
                        shutil.rmtree(tmp, ignore_errors=True)
            except (ValueError, OSError):  # not a version's name, or not ours to remove
                continue

    @contextmanager
    def _build_lock(
        self, kind: str, version: str, progress: Any, *, wait: bool = True
    ) -> Iterator[bool]:
        """Hold ``.building-<version>.lock`` exclusively, waiting for another holder
        (or, without ``wait``, yielding False at once if there is one; else True).

        The holder unlinks the file before it lets go, so a waiter that wakes up on a
        file no longer at that path tries again on the new one: two processes never both
        believe they hold the lock.
        """
        path = self.version_dir(kind, version).parent / f".building-{version}.lock"
        with ExitStack() as waiting:
            shown = False
            while True:
                lock = open(path, "a")  # noqa: SIM115 - closed below or on the next turn
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    if not wait:
                        lock.close()
                        yield False
                        return
                    if not shown and progress is not None:
                        what = f"{kind}: waiting for another process building {version}"
                        waiting.enter_context(progress.task(what))
                        shown = True
                    try:
                        fcntl.flock(lock, fcntl.LOCK_EX)
                    except BaseException:
                        lock.close()
                        raise
                if _same_file(lock, path):
                    break
                lock.close()  # the previous holder removed that file: lock the current one
        try:
            yield True
        finally:
            path.unlink(missing_ok=True)  # before unlocking, so no waiter keeps using it
            lock.close()

    def discard(self, kind: str, version: str) -> bool:
        """Remove ``version``'s folder, whatever it holds (a damaged version, one whose
        manifest is gone); renamed aside first, so nobody sees it half removed. True when
        there was one."""
        folder = self.version_dir(kind, version)
        if not os.path.lexists(folder):
            return False
        aside = Path(tempfile.mkdtemp(prefix=f".discarded-{version}-", dir=folder.parent))
        os.rename(folder, aside / version)
        shutil.rmtree(aside, ignore_errors=True)
        return True

    def _publish(self, kind: str, version: str, tmp: Path, final: Path) -> None:
        if not (tmp / BUILD_INFO).is_file():
            atomic_write_json(tmp / BUILD_INFO, {"build_seconds": None})
        if not (tmp / MANIFEST).is_file():
            raise RuntimeError(f"{kind} version {version} was built without a manifest")
        if not self.has_version(kind, version):
            self.discard(kind, version)  # a folder that lost its manifest is no version
        try:
            os.rename(tmp, final)
        except OSError:
            if not self.has_version(kind, version):
                raise
            shutil.rmtree(tmp, ignore_errors=True)

    # Ids that name a folder: letters, digits, '-', '_', '.'; not '.' first; one component.
    _ID_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.")
    _ID_MAX = 255  # a file name's length limit on common file systems

    def _inside(self, folder: str, name: str, what: str) -> Path:
        """``root/folder/name``, refused (a one-line ValueError) unless ``name`` is a plain
        id whose path, resolved, lies inside the resolved ``root/folder``: ``runs/``,
        ``data/`` or ``tokens/`` may be a symlink to another disk; an id never leads out."""
        if not (
            isinstance(name, str)
            and 0 < len(name) <= self._ID_MAX
            and not name.startswith(".")
            and self._ID_CHARS.issuperset(name)
        ):
            shown = repr(name if len(str(name)) <= 40 else f"{name[:40]}...")
            raise ValueError(
                f"{what} {shown} is not a valid id (letters, digits, '-', '_', '.'; "
                f"not '.' first; at most {self._ID_MAX} characters)"
            )
        path = self.root / folder / name
        if not path.resolve().is_relative_to((self.root / folder).resolve()):
            raise ValueError(f"{what} {name!r}: {path} leads outside the workspace {self.root}")
        return path

    def run_dir(self, run_id: str) -> Path:
        return self._inside("runs", run_id, "run")

    def search_file(self, search_id: str) -> Path:
        """``mixtures/<search id>.json``: a mixture search's plan, its finished trials and,
        once complete, its result."""
        path = self._inside("mixtures", search_id, "search id")
        return path.with_name(f"{path.name}.json")  # an id may hold dots: not a suffix

    def sweep_file(self, sweep_id: str) -> Path:
        """``sweeps/<sweep id>.json``: a sweep's plan, written before its first point."""
        path = self._inside("sweeps", sweep_id, "sweep id")
        return path.with_name(f"{path.name}.json")

    def resolve_search(self, ref: str) -> str:
        """A mixture search id: exact, a unique prefix, or ``latest`` (newest file)."""
        folder = self.root / "mixtures"
        files = _by_age(folder, "*.json")
        ids = [p.stem for p in files]
        return _resolve(ids, ref, folder, "mixture search", "mixture searches")

    def study_dir(self, study: str) -> Path:
        """``tune/<study>/``: a tuning study's Optuna storage (``journal.log`` unless the
        study keeps it elsewhere) and its record, ``study.json``."""
        return self._inside("tune", study, "study")

    def study_file(self, study: str) -> Path:
        """``tune/<study>/study.json``: the study's plan, its trials and its best one."""
        return self.study_dir(study) / "study.json"

    def resolve_study(self, ref: str) -> str:
        """A tuning study: exact, a unique prefix, or ``latest`` (newest record)."""
        folder = self.root / "tune"
        files = _by_age(folder, "*/study.json")
        ids = [p.parent.name for p in files]
        return _resolve(ids, ref, folder, "tuning study", "tuning studies")


def _by_age(folder: Path, pattern: str) -> list[Path]:
    """The files of ``folder`` matching ``pattern``, oldest first."""
    if not folder.is_dir():
        return []
    return sorted(folder.glob(pattern), key=lambda p: p.stat().st_mtime)


def _resolve(ids: list[str], ref: str, folder: Path, what: str, plural: str) -> str:
    """``ref`` among ``ids`` (oldest first): exact, a unique prefix, or ``latest``."""
    if ref == "latest" and ids:
        return ids[-1]
    if ref in ids:
        return ref
    found = [i for i in ids if i.startswith(ref)]
    if len(found) == 1:
        return found[0]
    if not found:
        raise FileNotFoundError(f"no {what} matches {ref!r} in {folder}")
    raise FileNotFoundError(f"{ref!r} matches {len(found)} {plural}: {', '.join(found)}")
