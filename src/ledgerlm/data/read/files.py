"""Opening a file to read, and why a path cannot be read (named in its quarantine entry)."""

from __future__ import annotations

import errno
import os
import stat
from typing import BinaryIO

from ledgerlm.data.read.shard import SNIPPET_CHARS, Quarantined, Shard, shard_label

READ_SIZE = 1 << 20


class Unreadable(Exception):
    """A file that cannot be read at all; the message is the cause."""


def unreadable_cause(path: str, err: OSError | None = None) -> str:
    """Why ``path`` cannot be read, naming the target of a broken link."""
    if os.path.islink(path):
        target = os.readlink(path)
        try:
            os.stat(path)
        except OSError as e:
            if e.errno == errno.ELOOP:
                return f"symlink loop (-> {target})"
            if e.errno == errno.ENOENT:
                return f"dangling symlink (-> {target})"
            return f"symlink (-> {target}): {e.strerror or e}"
        if os.path.isdir(path):
            return f"symlink cycle: folder link (-> {target}) back to a folder above it"
    if os.path.isdir(path):
        try:
            os.listdir(path)
        except OSError as e:
            return f"folder cannot be listed: {e.strerror or e}"
        return "is a folder"
    if err is not None:
        return err.strerror or str(err)
    return "not a regular file"


def open_regular(path: str) -> BinaryIO:
    """Open a regular file for reading; a FIFO or device would block or never end."""
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise Unreadable(unreadable_cause(path))
        return open(path, "rb")
    except OSError as err:
        raise Unreadable(unreadable_cause(path, err)) from None


def unreadable_record(shard: Shard, line: int | None, err: Unreadable | OSError) -> Quarantined:
    cause = str(err) if isinstance(err, Unreadable) else unreadable_cause(shard.path, err)
    return Quarantined(shard_label(shard), line, "unreadable", cause[:SNIPPET_CHARS])
