"""Atomic writes: the data reaches the disk before the rename, and killed writes are findable."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from lmdecomp import atomic


def _record_fsync_and_replace(monkeypatch):
    """Log (event, inode) of every os.fsync / os.replace that lmdecomp.atomic makes."""
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.fstat(fd).st_ino))
        real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", os.stat(src).st_ino))
        real_replace(src, dst)

    monkeypatch.setattr(atomic.os, "fsync", fsync)
    monkeypatch.setattr(atomic.os, "replace", replace)
    return events


def test_atomic_path_fsyncs_the_file_before_the_rename_and_the_folder_after(tmp_path, monkeypatch):
    events = _record_fsync_and_replace(monkeypatch)
    target = tmp_path / "out.bin"
    with atomic.atomic_path(target) as tmp:
        tmp.write_bytes(b"payload")
    file_ino, dir_ino = target.stat().st_ino, tmp_path.stat().st_ino
    assert events == [("fsync", file_ino), ("replace", file_ino), ("fsync", dir_ino)]
    assert target.read_bytes() == b"payload"
    assert list(tmp_path.iterdir()) == [target]


def test_atomic_dir_fsyncs_every_file_before_the_rename(tmp_path, monkeypatch):
    events = _record_fsync_and_replace(monkeypatch)
    target = tmp_path / "model"
    with atomic.atomic_dir(target) as tmp:
        (tmp / "sub").mkdir()
        (tmp / "a.json").write_text("{}")
        (tmp / "sub" / "b.bin").write_bytes(b"\0" * 10)
    files = {(target / "a.json").stat().st_ino, (target / "sub" / "b.bin").stat().st_ino}
    replaced = events.index(("replace", target.stat().st_ino))
    assert files <= {ino for what, ino in events[:replaced] if what == "fsync"}
    assert events[replaced + 1:] == [("fsync", tmp_path.stat().st_ino)]


def sigkill_inside(target, opened: str, written: str) -> None:
    """What a process killed (SIGKILL: no cleanup runs) halfway through an atomic write leaves:
    ``with {opened}:`` (``target`` is ``sys.argv[1]``), then the statement ``written``, then the kill."""
    code = (
        "import os, signal, sys\n"
        "from lmdecomp.atomic import atomic_dir, atomic_path\n"
        f"with {opened}:\n"
        f"    {written}\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(target)], capture_output=True)
    assert proc.returncode == -signal.SIGKILL


def sigkill_inside_atomic_path(target) -> None:
    sigkill_inside(target, "atomic_path(sys.argv[1]) as tmp", "tmp.write_bytes(b'half written')")


def test_stale_temps_finds_what_a_sigkill_leaves_and_nothing_else(tmp_path):
    target = tmp_path / "data[1].parquet"  # glob characters in the name are literal
    sigkill_inside_atomic_path(target)
    (left,) = tmp_path.iterdir()
    assert left.name.startswith(".data[1].parquet.") and left.name.endswith(".tmp")
    for other in (".data1.parquet.x.tmp", ".other.parquet.x.tmp", "data[1].parquet"):
        (tmp_path / other).write_bytes(b"")
    assert atomic.stale_temps(target) == [left]


def test_the_next_write_of_a_path_deletes_what_killed_writes_left(tmp_path):
    target = tmp_path / "out.json"
    sigkill_inside_atomic_path(target)
    (first,) = atomic.stale_temps(target)
    sigkill_inside_atomic_path(target)  # a second killed write deletes the first's leftover
    (second,) = atomic.stale_temps(target)
    assert second != first
    atomic.write_text(target, "{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


def test_a_folder_write_deletes_killed_folder_writes_nested_in_its_temporary(tmp_path):
    """The model stage pretrains into its own temporary folder, so a SIGKILL while the model
    is saved leaves ``..{name}.{random}.tmp.{random}.tmp`` beside ``.{name}.{random}.tmp``."""
    target = tmp_path / "model"
    sigkill_inside(target, "atomic_dir(sys.argv[1]) as outer, atomic_dir(outer) as inner",
                   "(inner / 'config.json').write_text('{}')")
    (outer,) = atomic.stale_temps(target)
    (inner,) = atomic.stale_temps(outer)
    assert (inner / "config.json").is_file()
    (tmp_path / "model.checkpoints").mkdir()  # not a temporary: kept
    with atomic.atomic_dir(target) as tmp:
        (tmp / "config.json").write_text('{"done": true}')
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "model.checkpoints"]
    assert (target / "config.json").read_text() == '{"done": true}'
