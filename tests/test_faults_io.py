"""Environment faults at the I/O helpers: one-line errors, the previous file kept, nothing half-written."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap

import pytest

from lmforge.errors import EnvironmentFault, IntegrityError, LmforgeError, RunLocked
from lmforge.utils.io import atomic_dir, atomic_write_bytes, atomic_write_text
from lmforge.utils.lock import OWNER_FILE, RunFolderLock, remove_stale_temporaries
from lmforge.utils.manifest import check_files, file_entries


def _fail_with(monkeypatch, code: int, target: str = "fsync"):
    def fail(*args, **kwargs):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, target, fail)


@pytest.mark.parametrize("code, words", [(errno.ENOSPC, "no space left"), (errno.EROFS, "read-only"),
                                         (errno.EACCES, "permission denied"), (errno.EDQUOT, "quota")])
def test_atomic_write_fault_names_path_and_keeps_old_file(tmp_path, monkeypatch, code, words):
    target = tmp_path / "report.json"
    target.write_text("good")
    _fail_with(monkeypatch, code)
    with pytest.raises(EnvironmentFault) as info:
        atomic_write_text(target, "new")
    assert str(info.value).startswith(f"cannot write {target}: ") and words in str(info.value)
    assert info.value.errno == code and isinstance(info.value, (OSError, LmforgeError))
    monkeypatch.undo()
    assert target.read_text() == "good"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]  # no temporary left


def test_atomic_dir_fault_keeps_previous_folder(tmp_path, monkeypatch):
    folder = tmp_path / "model"
    with atomic_dir(folder) as tmp:
        (tmp / "w.bin").write_bytes(b"old")
    _fail_with(monkeypatch, errno.ENOSPC)
    with pytest.raises(EnvironmentFault, match="no space left"):
        with atomic_dir(folder) as tmp:
            (tmp / "w.bin").write_bytes(b"new")
    monkeypatch.undo()
    assert (folder / "w.bin").read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_unlisted_errno_stays_a_plain_oserror(tmp_path, monkeypatch):
    _fail_with(monkeypatch, errno.EIO)
    with pytest.raises(OSError) as info:
        atomic_write_text(tmp_path / "x", "y")
    assert not isinstance(info.value, LmforgeError)


@pytest.mark.parametrize("make, words", [
    (lambda p: p.write_text("a file"), "out is a file, not a folder"),  # parent is a file: ENOTDIR
])
def test_path_through_a_file(tmp_path, make, words):
    make(tmp_path / "out")
    with pytest.raises(EnvironmentFault, match=words):
        atomic_write_text(tmp_path / "out" / "x.json", "{}")


def test_file_size_limit_is_a_fault_not_a_crash(tmp_path):
    # RLIMIT_FSIZE makes write() fail with EFBIG (Python ignores SIGXFSZ) without root or a full disk.
    script = textwrap.dedent(f"""
        import resource, sys
        from lmforge.utils.io import atomic_write_bytes
        from lmforge.errors import EnvironmentFault
        open({str(tmp_path / 'big')!r}, 'wb').write(b'old')
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
        try:
            atomic_write_bytes({str(tmp_path / 'big')!r}, b'x' * 100000)
        except EnvironmentFault as exc:
            print(exc)
            sys.exit(3)
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 3, result.stderr
    assert "file-size limit" in result.stdout
    assert (tmp_path / "big").read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big"]


def test_written_files_follow_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "a.json", "{}")
        with atomic_dir(tmp_path / "model") as tmp:
            (tmp / "w.bin").write_bytes(b"w")
            atomic_write_bytes(tmp / "t.json", b"{}")
    finally:
        os.umask(old)
    modes = {p.name: p.stat().st_mode & 0o777 for p in [tmp_path / "a.json", tmp_path / "model",
                                                         tmp_path / "model" / "w.bin", tmp_path / "model" / "t.json"]}
    assert modes == {"a.json": 0o644, "model": 0o755, "w.bin": 0o644, "t.json": 0o644}


# ------------------------------------------------------------------ locks
def test_second_lock_in_process_is_refused_and_first_undisturbed(tmp_path):
    with RunFolderLock(tmp_path / "run") as first:
        with pytest.raises(RunLocked, match=f"in use by lmforge process {os.getpid()}"):
            RunFolderLock(tmp_path / "run").acquire()
        assert (tmp_path / "run" / OWNER_FILE).read_text().strip() == str(os.getpid())
    RunFolderLock(tmp_path / "run").acquire().release()  # free again once released
    assert first is not None


def test_lock_held_by_another_process_names_its_pid_and_dies_with_it(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from lmforge.utils.lock import RunFolderLock
        lock = RunFolderLock({str(tmp_path)!r}).acquire()
        print("held", flush=True)
        time.sleep(60)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunLocked, match=f"process {holder.pid}"):
            RunFolderLock(tmp_path).acquire()
    finally:
        holder.kill()
        holder.wait()
    with RunFolderLock(tmp_path):  # a killed holder leaves no stale lock
        pass


def test_stale_temporaries_are_removed_and_an_orphaned_old_folder_restored(tmp_path):
    (tmp_path / ".model.abc.tmp").mkdir()
    (tmp_path / ".report.json.xyz.tmp").write_text("half")
    (tmp_path / "best").mkdir()
    (tmp_path / ".best.old").mkdir()  # replaced copy: its successor is in place
    (tmp_path / ".model.old").mkdir()  # died between the renames: the only complete copy
    (tmp_path / ".model.old" / "w").write_text("kept")
    remove_stale_temporaries(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best", "model"]
    assert (tmp_path / "model" / "w").read_text() == "kept"


# ------------------------------------------------------------------ manifests
def test_manifest_catches_flip_truncation_and_missing_file(tmp_path):
    (tmp_path / "w.bin").write_bytes(bytes(range(256)) * 64)
    (tmp_path / "c.json").write_text("{}")
    files = file_entries(tmp_path)
    check_files(tmp_path, files)
    data = bytearray((tmp_path / "w.bin").read_bytes())
    data[1000] ^= 0x01
    (tmp_path / "w.bin").write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="w.bin: sha256 differs"):
        check_files(tmp_path, files)
    (tmp_path / "w.bin").write_bytes(bytes(data[:100]))
    with pytest.raises(IntegrityError, match="w.bin: 100 bytes, the manifest says 16384"):
        check_files(tmp_path, files)
    (tmp_path / "c.json").unlink()
    with pytest.raises(IntegrityError, match="c.json: listed in the manifest but missing"):
        check_files(tmp_path, {"c.json": files["c.json"]})
