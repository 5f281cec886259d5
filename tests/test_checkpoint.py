"""Checkpoint files under attack and accident: bombs, odd names, bad paths, killed writes, permissions."""

import os
import stat
import subprocess
import sys
import time
import tracemalloc
import zipfile

import numpy as np
import pytest

import workbench as wb
from workbench import checkpoint


@pytest.fixture
def small():
    g = wb.Graph(name="small")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 2), dtype="float64")
        y = wb.placeholder("y", shape=(None,), dtype="float64")
        w = wb.variable("w", shape=(2,), init=0.5, dtype="float64")
        loss = wb.mean((wb.sum(x * w, axis=1) - y) ** 2)
        train = wb.optimizers.SGD(0.1).minimize(loss)
    X = np.random.default_rng(0).normal(size=(16, 2))
    return g, train, {"x": X, "y": X @ np.array([1.0, -1.0])}


def _deflated_zeros(archive: zipfile.ZipFile, name: str, header: bytes, nbytes: int) -> None:
    """A deflated member: ``header``, then ``nbytes`` zero bytes written in chunks."""
    with archive.open(name, "w", force_zip64=True) as member:
        member.write(header)
        chunk = bytes(1 << 22)
        while nbytes:
            member.write(chunk[: min(nbytes, len(chunk))])
            nbytes -= min(nbytes, len(chunk))


def _npy_header(shape, dtype="<f8") -> bytes:
    import io

    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": dtype, "fortran_order": False, "shape": shape})
    return buffer.getvalue()


def _bomb(path, members: dict) -> None:
    """A deflated checkpoint whose members are (the shape their header declares, zero bytes stored)."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        with archive.open(checkpoint.MARK + ".npy", "w") as member:
            np.lib.format.write_array(member, np.array(checkpoint.FORMAT))
        for name, (shape, stored) in members.items():
            _deflated_zeros(archive, name + ".npy", _npy_header(shape), stored)


def _peak_bytes(fn) -> int:
    tracemalloc.start()
    try:
        fn()
    except wb.FormatError:
        pass
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


# -- zip bombs: headers are checked before any data is read (fixes: checkpoint zip bomb) ------


def test_a_member_that_inflates_past_its_variable_is_refused_before_reading(small, tmp_path):
    g, _, _ = small
    sess = wb.Session(g)
    # a truthful header: 12.5 million float64 (100 MB) where the graph's 'w' has 2
    _bomb(tmp_path / "bomb.npz", {"variables/w": ((12_500_000,), 100_000_000)})
    assert os.path.getsize(tmp_path / "bomb.npz") < 1_000_000
    with pytest.raises(
        wb.FormatError, match=r"checkpoint value of 'w' is float64 \(12500000,\), the variable is float64 \(2,\)"
    ):
        sess.restore(tmp_path / "bomb.npz")
    assert _peak_bytes(lambda: sess.restore(tmp_path / "bomb.npz")) < 5_000_000


def test_a_header_that_lies_about_its_size_is_refused_before_allocating(tmp_path):
    # 4 GB declared by the header, 1 MB stored: no check by name can help (read() knows no graph)
    _bomb(tmp_path / "liar.npz", {"variables/w": ((500_000_000,), 1_000_000)})
    with pytest.raises(wb.FormatError, match="holds 1000128 bytes; its header declares 4000000128"):
        checkpoint.read(tmp_path / "liar.npz")
    assert _peak_bytes(lambda: checkpoint.read(tmp_path / "liar.npz")) < 5_000_000


def test_a_shape_beyond_the_element_limit_is_refused(tmp_path):
    _bomb(tmp_path / "huge.npz", {"variables/w": ((10**12,), 1000)})
    with pytest.raises(wb.FormatError, match="more than the limit"):
        checkpoint.read(tmp_path / "huge.npz")


def test_unknown_members_are_refused(small, tmp_path):
    g, _, _ = small
    sess = wb.Session(g)
    _bomb(tmp_path / "other.npz", {"variables/w": ((2,), 16), "evil": ((2,), 16)})
    with pytest.raises(wb.FormatError, match="unexpected members 'evil'"):
        sess.restore(tmp_path / "other.npz")
    _bomb(tmp_path / "extra.npz", {"variables/w": ((2,), 16), "variables/zz": ((1,), 8)})
    with pytest.raises(wb.FormatError, match="has variables this graph lacks: zz"):
        sess.restore(tmp_path / "extra.npz")


# -- every variable name saves and restores (fixes: reserved names in checkpoints) -----------


@pytest.mark.parametrize("name", ["__step__", "__workbench_checkpoint__", "variables/w"])
def test_variables_with_the_checkpoint_s_own_names_round_trip(tmp_path, name):
    g = wb.Graph()
    with g.as_default():
        x = wb.placeholder("x", shape=(None,), dtype="float64")
        v = wb.variable(name, shape=(1,), init=1.0, dtype="float64")
        loss = wb.mean((x * v - 2.0 * x) ** 2)
        train = wb.optimizers.SGD(0.1).minimize(loss)
    data = {"x": np.linspace(0.5, 1.5, 8)}
    sess = wb.Session(g)
    sess.fit(train, data, batch_size=4, steps=3, checkpoint_dir=tmp_path / "run")
    trained = sess.variables[name]
    assert trained[0] != 1.0
    sess.save(tmp_path / "c.npz")
    fresh = wb.Session(g)
    fresh.restore(tmp_path / "c.npz")
    np.testing.assert_array_equal(fresh.variables[name], trained)
    history = wb.Session(g).fit(train, data, batch_size=4, steps=5, checkpoint_dir=tmp_path / "run")
    assert [r["step"] for r in history.records] == [4, 5]  # resumed, not restarted from step 0


def test_a_nul_in_a_name_is_refused_when_the_variable_is_made():
    g = wb.Graph()
    with g.as_default(), pytest.raises(wb.GraphError, match="invalid name 'a\\\\x00b'"):
        wb.variable("a\0b", shape=(1,), init=0.0)


def test_checkpoints_of_the_previous_format_still_restore(small, tmp_path):
    g, _, _ = small
    np.savez(tmp_path / "old.npz", __workbench_checkpoint__=np.array(1), w=np.array([3.0, 4.0]))
    sess = wb.Session(g)
    sess.restore(tmp_path / "old.npz")
    np.testing.assert_array_equal(sess.variables["w"], [3.0, 4.0])


# -- paths (fixes: save onto a directory, into a missing one, NUL in a path) -----------------


def test_save_to_a_directory_a_missing_directory_or_a_nul_path(small, tmp_path):
    sess = wb.Session(small[0])
    with pytest.raises(wb.FileError, match="is a directory") as info:
        sess.save(tmp_path)
    assert isinstance(info.value, OSError) and isinstance(info.value, wb.WorkbenchError)
    with pytest.raises(wb.FileError, match="directory '.*/nowhere' does not exist"):
        sess.save(tmp_path / "nowhere" / "c.npz")
    with pytest.raises(wb.PathError, match="contains a NUL byte") as info:
        sess.save(str(tmp_path / "a\0b.npz"))
    assert isinstance(info.value, ValueError)
    with pytest.raises(wb.PathError):
        sess.restore(str(tmp_path / "a\0b.npz"))
    assert os.listdir(tmp_path) == []


# -- killed writes and permissions (fixes: stale temporaries, umask) --------------------------


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_opening_a_checkpoint_directory_removes_abandoned_temporaries(small, tmp_path):
    g, train, data = small
    run = tmp_path / "run"
    run.mkdir()
    host = checkpoint._HOST
    abandoned = [f".tmp-{host}-{_dead_pid()}-k3x9_a.npz", ".tmp-abc123xy.npz"]
    kept = [f".tmp-{host}-{os.getpid()}-live0001.npz", ".tmp-otherhost-17-fresh001.npz", "notes.tmp", ".tmp-notes.txt"]
    for name in abandoned + kept:
        (run / name).write_bytes(b"partial")
    old = time.time() - 2 * checkpoint.STALE_SECONDS
    os.utime(run / ".tmp-abc123xy.npz", (old, old))
    wb.Session(g).fit(train, data, batch_size=4, steps=2, checkpoint_dir=run)
    assert sorted(os.listdir(run)) == sorted(kept + ["step-00000002.npz"])


def test_checkpoints_follow_the_umask_unless_private(small, tmp_path):
    sess = wb.Session(small[0])
    previous = os.umask(0o022)
    try:
        shared = sess.save(tmp_path / "shared.npz")
        private = sess.save(tmp_path / "private.npz", private=True)
        os.umask(0o077)
        strict = sess.save(tmp_path / "strict.npz")
    finally:
        os.umask(previous)
    assert stat.S_IMODE(os.stat(shared).st_mode) == 0o644
    assert stat.S_IMODE(os.stat(private).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(strict).st_mode) == 0o600
