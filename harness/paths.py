"""Path options checked for kind and permission before a command starts work, so that a bad one is refused in
one line naming the option, and nothing is written.

Call these first thing in a command, before reading other inputs or writing anything:

    out = output_directory(out, "--out")        # a directory the command may create or write in
    log = input_file(log, "--log")              # a readable regular file
    runs = input_directory(runs, "--runs")      # a readable directory
    text = read_text(log, "--log")              # its UTF-8 text; a binary file is refused, not a traceback

Each raises `HarnessError` ("--out runs/x: is a file, not a directory"), which every command prints as one line
with exit code 2. A refusal leaves the disk as it was (the write check makes and removes one empty folder).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from harness.errors import HarnessError


def output_directory(path: Path | str, option: str) -> Path:
    """`path` as a directory the command can write in: an existing writable directory, or a missing one whose
    nearest existing ancestor is a writable directory (so that `mkdir(parents=True)` will succeed)."""
    target = _given(path, option)
    if target.exists():
        if not target.is_dir():
            raise HarnessError(f"{option} {target}: is a file, not a directory")
        if not _writable(target):
            raise HarnessError(f"{option} {target}: the directory is not writable")
        return target
    _check_can_make(target, option)
    return target


def output_file(path: Path | str, option: str) -> Path:
    """`path` as a file the command can write: not a directory, in a directory that exists or can be made."""
    target = _given(path, option)
    if target.is_dir():
        raise HarnessError(f"{option} {target}: is a directory, not a file")
    if target.exists() and not os.access(target, os.W_OK):
        raise HarnessError(f"{option} {target}: the file is not writable")
    if not target.parent.is_dir():
        _check_can_make(target, option)
    elif not _writable(target.parent):
        raise HarnessError(f"{option} {target}: cannot be written, {target.parent} is not writable")
    return target


def input_file(path: Path | str, option: str) -> Path:
    """`path` as an existing, readable regular file."""
    source = _given(path, option)
    if not source.exists():
        raise HarnessError(f"{option} {source}: no such file")
    if source.is_dir():
        raise HarnessError(f"{option} {source}: is a directory, not a file")
    if not source.is_file():
        raise HarnessError(f"{option} {source}: not a regular file")
    if not os.access(source, os.R_OK):
        raise HarnessError(f"{option} {source}: the file is not readable")
    return source


def input_directory(path: Path | str, option: str) -> Path:
    """`path` as an existing directory whose entries can be listed."""
    source = _given(path, option)
    if not source.exists():
        raise HarnessError(f"{option} {source}: no such directory")
    if not source.is_dir():
        raise HarnessError(f"{option} {source}: is a file, not a directory")
    if not os.access(source, os.R_OK | os.X_OK):
        raise HarnessError(f"{option} {source}: the directory is not readable")
    return source


def read_text(path: Path | str, option: str) -> str:
    """The UTF-8 text of an input file, less the byte-order mark an editor may save before it; a binary or
    unreadable one is refused in one line naming it."""
    source = input_file(path, option)
    try:
        return source.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as error:
        raise HarnessError(f"{option} {source}: not UTF-8 text (byte {error.start}); is it a binary file?") from None
    except OSError as error:
        raise HarnessError(f"{option} {source}: cannot be read ({error.strerror or error})") from None


def read_bounded_bytes(path: Path, limit_bytes: int, what: str) -> bytes:
    """A file's bytes, at most `limit_bytes` of them: a device (/dev/zero) is refused by kind and an endless pipe
    by size, where reading it whole would use up the machine's memory. A pipe (`<(kubectl logs …)`) is read."""
    try:
        if path.is_char_device() or path.is_block_device():
            raise HarnessError(f"{path}: a device, not a {what}")
        with path.open("rb") as stream:
            data = stream.read(limit_bytes + 1)
    except OSError as error:
        raise HarnessError(f"{path}: cannot read {what}: {error.strerror or error}") from None
    if len(data) > limit_bytes:
        raise HarnessError(f"{path}: over {limit_bytes // 2**20:,} MiB, more than a {what} holds")
    return data


def _given(path: Path | str, option: str) -> Path:
    """An empty value is refused: Path('') would silently mean the current directory."""
    if not str(path).strip():
        raise HarnessError(f"{option}: empty; give a path")
    return Path(path)


def _check_can_make(target: Path, option: str) -> None:
    """A missing `target` can be made when its nearest existing ancestor is a writable directory."""
    ancestor = _nearest_existing(target)
    if not ancestor.is_dir():
        raise HarnessError(f"{option} {target}: cannot be made, {ancestor} is a file")
    if not _writable(ancestor):
        raise HarnessError(f"{option} {target}: cannot be made, {ancestor} is not writable")


def _nearest_existing(path: Path) -> Path:
    """The closest ancestor of `path` (or `path` itself) that exists; '.' for a relative path with none."""
    for candidate in [path, *path.parents]:
        if candidate.exists() or candidate == Path(candidate.anchor or "."):
            return candidate
    return Path(".")


def _writable(directory: Path) -> bool:
    """Entries can be made in `directory`: permission says so, and making one works (root passes the permission
    check everywhere, yet procfs, sysfs and a root-squashed NFS export still refuse it)."""
    if not os.access(directory, os.W_OK | os.X_OK):
        return False
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".harness-probe-", dir=directory))
    except OSError:
        return False
    return True
