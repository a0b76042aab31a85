"""Atomic file output: an artifact is either whole or absent, never half-written.

The data is fsync'ed before the rename and the folder after it, so after a crash or
power loss the final name holds either the old content or the complete new one.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

_TMP_SUFFIX = ".tmp"


def _tmp_prefix(path: Path) -> str:
    return f".{path.name}."


def stale_temps(path: str | os.PathLike) -> list[Path]:
    """The temporaries of ``path`` that :func:`atomic_path` / :func:`atomic_dir` left
    behind when their process was killed (SIGKILL skips the cleanup). Named by the same
    helper that names them, so the two cannot drift apart."""
    path = Path(path)
    pattern = glob.escape(_tmp_prefix(path)) + "*" + glob.escape(_TMP_SUFFIX)
    return sorted(path.parent.glob(pattern))


def stale_temps_in(folder: str | os.PathLike) -> list[Path]:
    """The temporaries left in ``folder`` by killed writes of any of its files (see
    :func:`stale_temps`), e.g. a shard whose target never appeared."""
    return sorted(Path(folder).glob(_tmp_prefix(Path("*")) + "*" + _TMP_SUFFIX))  # .{name}.{random}.tmp


def remove_stale_temps(path: str | os.PathLike) -> None:
    """Delete what killed writes of ``path`` left (see :func:`stale_temps`), with the temps of
    writes nested in them: an atomic folder written into another's temporary (the model stage
    pretrains into its own temporary) leaves ``..{name}.{random}.tmp.{random}.tmp``."""
    for temp in stale_temps(path):
        remove_stale_temps(temp)
        if temp.is_dir() and not temp.is_symlink():
            shutil.rmtree(temp)
        else:
            temp.unlink(missing_ok=True)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # flushes the inode's dirty pages, whoever wrote them
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    """Make a rename inside ``path`` durable; a no-op where folders cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems refuse fsync on a folder; the rename is still atomic
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` only on success.

    The temporary file lives in the same folder so the final ``os.replace`` is an
    atomic rename on POSIX file systems. On any exception the temporary is removed.
    The caller must have closed its handle on the temporary when the block ends.
    Temporaries of earlier writes of ``path`` are what a SIGKILL left and are deleted
    first: a path has one writer at a time (Snakemake gives each output one job).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(path)
    fd, tmp = tempfile.mkstemp(prefix=_tmp_prefix(path), suffix=_TMP_SUFFIX, dir=path.parent)
    os.close(fd)
    tmp = Path(tmp)
    try:
        yield tmp
        # mkstemp creates 0600; give the artifact the permissions a plain open() would.
        os.chmod(tmp, 0o666 & ~_umask())
        _fsync_file(tmp)  # without it a crash soon after the rename can leave an empty file
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    finally:
        if tmp.exists():
            tmp.unlink()


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary folder beside ``path``; move it onto ``path`` only on success.
    Killed writes' temporaries are deleted first, as in :func:`atomic_path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(path)
    tmp = Path(tempfile.mkdtemp(prefix=_tmp_prefix(path), suffix=_TMP_SUFFIX, dir=path.parent))
    try:
        yield tmp
        os.chmod(tmp, 0o777 & ~_umask())
        replace_dir(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def replace_dir(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """Move the finished folder ``src`` onto ``dst`` (replacing any folder there), with
    every file fsync'ed first so the renamed folder never holds unwritten data."""
    src, dst = Path(src), Path(dst)
    for root, _dirs, files in os.walk(src):
        for name in files:
            if not os.path.islink(os.path.join(root, name)):
                _fsync_file(Path(root) / name)
        _fsync_dir(Path(root))
    if dst.exists():
        shutil.rmtree(dst)
    os.replace(src, dst)
    _fsync_dir(dst.parent)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()
