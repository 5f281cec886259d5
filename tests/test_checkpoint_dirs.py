"""A checkpoint_dir shared by mistake: another model's files are refused and kept, two fits writing
one directory both finish, an unreadable directory is a FileError naming it."""

import errno
import os
import threading

import numpy as np
import pytest

import workbench as wb
from workbench import checkpoint
from workbench.errors import FileError, FormatError


def model(width: int, name: str):
    g = wb.Graph(name=name)
    with g.as_default():
        x = wb.placeholder("x", (None, 3))
        w = wb.variable("w", (3, width))
        loss = wb.mean(wb.matmul(x, w) ** 2.0)
        train = wb.optimizers.SGD(0.01).minimize(loss)
    return g, train


DATA = {"x": np.random.default_rng(0).standard_normal((64, 3)).astype("float32")}


def test_another_model_s_checkpoints_are_refused_and_kept(tmp_path):
    g, train = model(2, "first")
    wb.Session(g, seed=0).fit(train, DATA, batch_size=16, steps=6, checkpoint_dir=tmp_path, checkpoint_every=2)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert sorted(before) == ["step-00000004.npz", "step-00000006.npz"]
    other, other_train = model(5, "second")
    sess = wb.Session(other, seed=0)
    start = dict(sess.variables)
    with pytest.raises(FormatError, match=r"holds checkpoints of another model \(step-00000006.npz: .*'w' is float32"):
        sess.fit(other_train, DATA, batch_size=16, steps=4, checkpoint_dir=tmp_path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # nothing skipped, nothing deleted
    assert np.array_equal(sess.variables["w"], start["w"])


def test_a_damaged_newest_file_still_falls_back_to_the_one_before(tmp_path):
    g, train = model(2, "first")
    wb.Session(g, seed=0).fit(train, DATA, batch_size=16, steps=6, checkpoint_dir=tmp_path, checkpoint_every=2)
    (tmp_path / "step-00000006.npz").write_bytes(b"truncated")
    variables, step = checkpoint.latest(tmp_path, checkpoint.specs(g.variables))
    assert step == 4


@pytest.mark.slow
def test_two_fits_writing_one_directory_both_finish(tmp_path):
    errors = []

    def fit(seed):
        g, train = model(2, f"m{seed}")
        try:
            wb.Session(g, seed=seed).fit(train, DATA, batch_size=8, steps=150, checkpoint_dir=tmp_path,
                                         checkpoint_every=1)  # fmt: skip
        except Exception as e:  # noqa: BLE001 - collected for the assertion
            errors.append(e)

    threads = [threading.Thread(target=fit, args=(seed,)) for seed in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not [e for e in errors if isinstance(e, FileNotFoundError)]
    assert len(list(tmp_path.glob("step-*.npz"))) <= 3


def test_save_step_survives_a_file_dropped_by_another_writer(tmp_path, monkeypatch):
    arrays = {"w": np.zeros(3, "float32")}
    for step in (1, 2, 3):
        checkpoint.save_step(tmp_path, arrays, step)
    real = os.unlink

    def raced(path, *a, **k):  # the other writer removed it just before
        real(path)
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)

    monkeypatch.setattr(os, "unlink", raced)
    checkpoint.save_step(tmp_path, arrays, 4)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-00000003.npz", "step-00000004.npz"]


def test_an_unreadable_checkpoint_dir_is_a_file_error_naming_it(tmp_path, monkeypatch):
    g, train = model(2, "first")
    target = str(tmp_path)
    real = os.listdir

    def listdir(path="."):
        if os.fspath(path) == target:
            raise PermissionError(errno.EACCES, "Permission denied", target)
        return real(path)

    monkeypatch.setattr(os, "listdir", listdir)
    with pytest.raises(FileError, match=rf"cannot read checkpoint directory '{target}': Permission denied"):
        wb.Session(g, seed=0).fit(train, DATA, batch_size=16, steps=2, checkpoint_dir=tmp_path)


def test_restore_takes_a_fit_directory_and_leaves_the_replicas_state_out(tmp_path):
    g = wb.Graph()
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 2), dtype="float64")
        y = wb.placeholder("y", shape=(None, 1), dtype="float64")
        w = wb.variable("w", shape=(2, 1), init="zeros", dtype="float64")
        train = wb.optimizers.Adam(0.1).minimize(wb.mean((x @ w - y) ** 2))
    xs = np.random.default_rng(0).normal(size=(64, 2))
    data = {"x": xs, "y": xs @ np.array([[1.0], [2.0]])}
    fitted = wb.Session(g, seed=0)
    fitted.fit(train, data, batch_size=16, steps=8, replicas=2, checkpoint_dir=tmp_path / "ck", checkpoint_every=4)
    again = wb.Session(g, seed=0)
    again.restore(tmp_path / "ck")  # strict: the graph's variables, not replicas/<rank>/...
    for name, value in fitted.variables.items():
        np.testing.assert_array_equal(again.variables[name], value)
    (tmp_path / "empty").mkdir()
    with pytest.raises(wb.FormatError, match=r"holds no step-<n>.npz checkpoint"):
        again.restore(tmp_path / "empty")
