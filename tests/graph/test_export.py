"""Inference files: Session.export and wb.load_model (pruning, inference mode, signature, hostile files)."""

import io
import json
import os
import pickle
import zipfile

import numpy as np
import pytest

import workbench as wb
from workbench import modelfile
from workbench.graph.export import inference_graph

TRAINING_OPS = {
    "assign", "assign_add", "assign_sub", "no_op", "dropout", "fused_update", "softmax_cross_entropy",
    "softmax_cross_entropy_grad", "softmax_cross_entropy_with_grad", "relu_grad", "unreduce", "reduce_to_like",
    "broadcast_like", "concat_part", "getitem_grad", "gather_grad", "conv2d_input_grad", "conv2d_filter_grad",
    "max_pool2d_grad",
}  # fmt: skip


def mlp(dropout=0.0, batch=None):
    g = wb.Graph(name="mlp")
    with g.as_default():
        x = wb.placeholder("x", shape=(batch, 6))
        y = wb.placeholder("y", shape=(batch,), dtype="int64")
        h = wb.tanh(x @ wb.variable("w0", shape=(6, 16)) + wb.variable("b0", shape=(16,), init="zeros"))
        kept = wb.dropout(h, dropout) if dropout else h
        logits = kept @ wb.variable("w1", shape=(16, 3)) + wb.variable("b1", shape=(3,), init="zeros")
        probs = wb.softmax(logits, name="probs")
        loss = wb.mean(wb.softmax_cross_entropy(logits, y), name="loss")
        train = wb.optimizers.Adam(0.05).minimize(loss)
    return g, x, y, h, probs, loss, train


def cnn():
    g = wb.Graph(name="cnn")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 1, 9, 9))
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        h = wb.relu(wb.conv2d(x, wb.variable("k0", shape=(4, 1, 3, 3), init="he_normal"), stride=2, padding="same"))
        h = wb.max_pool2d(h, 2, stride=2, padding="same")  # 5x5 -> 3x3, padded at the end
        h = wb.reshape(h, (-1, 36))
        logits = h @ wb.variable("w", shape=(36, 3))
        probs = wb.softmax(logits, name="probs")
        train = wb.optimizers.SGD(0.1).minimize(wb.mean(wb.softmax_cross_entropy(logits, y)))
    return g, x, y, probs, train


def data(shape=(64, 6), seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=shape).astype("float32")
    return x, (x.reshape(len(x), -1)[:, 0] > 0).astype("int64")


@pytest.fixture
def trained_mlp(tmp_path):
    g, x, y, h, probs, loss, train = mlp()
    sess = wb.Session(g, seed=1)
    X, Y = data()
    sess.fit(train, {x: X, y: Y}, batch_size=16, steps=20, stats=5)  # adds statistic ops to the graph
    path = sess.export(tmp_path / "mlp.wbmodel", inputs={"x": x}, outputs={"probs": probs})
    return sess, probs, x, path


def manifest(path):
    with np.load(path, allow_pickle=False) as members:
        return json.loads(members["model"].tobytes())


@pytest.mark.parametrize("n", [1, 37])
def test_load_model_predicts_exactly_what_the_session_runs(trained_mlp, n):
    sess, probs, x, path = trained_mlp
    X = data((n, 6), seed=5)[0]
    got = wb.load_model(path).predict({"x": X})
    assert list(got) == ["probs"]
    np.testing.assert_array_equal(got["probs"], sess.run(probs, {x: X}))


@pytest.mark.parametrize("n", [2, 19])
def test_a_cnn_with_same_padding_and_strides_predicts_exactly(tmp_path, n):
    g, x, y, probs, train = cnn()
    sess = wb.Session(g)
    X, Y = data((32, 1, 9, 9))
    sess.fit(train, {x: X, y: Y}, batch_size=8, steps=4)
    model = wb.load_model(sess.export(tmp_path / "cnn.wbmodel", {"x": x}, {"probs": probs}))
    X = data((n, 1, 9, 9), seed=2)[0]
    np.testing.assert_array_equal(model.predict(X)["probs"], sess.run(probs, {x: X}))


def test_the_file_holds_only_the_inference_graph_and_its_signature(trained_mlp):
    sess, probs, x, path = trained_mlp
    found = manifest(path)
    types = {op["type"] for op in found["graph"]["operations"]}
    names = [op["name"] for op in found["graph"]["operations"]]
    assert types <= {"placeholder", "variable", "matmul", "add", "tanh", "softmax", "constant"}, types
    assert not types & TRAINING_OPS
    assert not [n for n in names if n.startswith(("stats/", "gradients")) or "adam" in n.lower()]
    variables = sorted(op["name"] for op in found["graph"]["operations"] if op["type"] == "variable")
    assert variables == ["b0", "b1", "w0", "w1"]  # no optimizer slots
    assert found["format"] == "workbench-model" and found["version"] == 1 and found["workbench"] == wb.__version__
    assert found["signature"] == {
        "inputs": [{"name": "x", "tensor": "x", "dtype": "float32", "shape": [None, 6]}],
        "outputs": [{"name": "probs", "tensor": "probs", "dtype": "float32", "shape": [None, 3]}],
    }
    with np.load(path, allow_pickle=False) as members:
        assert sorted(members.files) == ["model", "values/b0", "values/b1", "values/w0", "values/w1"]
        np.testing.assert_array_equal(members["values/w0"], sess.variables["w0"])


def test_a_model_has_its_signature_graph_and_trained_values(trained_mlp):
    sess, probs, x, path = trained_mlp
    model = wb.load_model(path)
    assert isinstance(model, wb.Model) and model.version == wb.__version__
    info = model.inputs["x"]
    assert (info.name, info.tensor, info.dtype, info.shape) == ("x", "x", "float32", (None, 6))
    assert model.outputs["probs"].shape == (None, 3) and isinstance(model.graph, wb.Graph)
    assert repr(model) == "<Model 'mlp' (<x: float32 (None, 6)>) -> (<probs: float32 (None, 3)>)>"
    for name, value in model.variables.items():
        np.testing.assert_array_equal(value, sess.variables[name])
    X = data((5, 6))[0]  # the graph alone runs with the trained values
    np.testing.assert_array_equal(wb.Session(model.graph).run("probs", {"x": X}), sess.run(probs, {x: X}))


def test_a_fixed_batch_size_becomes_any_batch_size(tmp_path):
    g, x, y, h, probs, loss, train = mlp(batch=16)
    sess = wb.Session(g)
    model = wb.load_model(sess.export(tmp_path / "m", {"x": x}, {"probs": probs}))
    assert model.inputs["x"].shape == (None, 6) and model.outputs["probs"].shape == (None, 3)
    X = data((16, 6))[0]
    np.testing.assert_array_equal(model.predict({"x": X})["probs"], sess.run(probs, {x: X}))
    assert model.predict({"x": X[:3]})["probs"].shape == (3, 3)


def test_dropout_is_the_identity_in_the_inference_graph(tmp_path):
    g, x, y, h, probs, loss, train = mlp(dropout=0.5)
    sess = wb.Session(g)
    X, Y = data()
    sess.fit(train, {x: X, y: Y}, batch_size=16, steps=3)
    model = wb.load_model(sess.export(tmp_path / "m", {"x": x}, {"probs": probs}))
    assert "dropout" not in {op.type for op in model.graph.operations}
    v = sess.variables
    logits = sess.run(h, {x: X}).astype("float64") @ v["w1"] + v["b1"]  # h is before dropout
    expected = np.exp(logits - logits.max(1, keepdims=True))
    np.testing.assert_allclose(model.predict(X)["probs"], expected / expected.sum(1, keepdims=True), rtol=1e-5)


def batch_norm_like():
    """A layer that uses batch statistics in training and moving ones in inference, updating the moving mean."""
    g = wb.Graph(name="bn")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 4))
        training = wb.placeholder("training", shape=(), dtype="bool")
        moving = wb.variable("moving_mean", shape=(4,), init=0.5, trainable=False)
        batch_mean = wb.mean(x, axis=0)
        update = wb.assign(moving, 0.9 * moving + 0.1 * batch_mean)
        with g.control_dependencies([update]):
            centred = wb.where(training, x - batch_mean, x - moving)
        out = wb.identity(centred * wb.variable("gamma", shape=(4,), init=2.0), name="out")
    return g, x, training, out


def test_a_training_switch_is_off_and_the_branch_not_taken_is_pruned(tmp_path):
    g, x, training, out = batch_norm_like()
    sess = wb.Session(g)
    model = wb.load_model(sess.export(tmp_path / "bn", inputs={"x": x}, outputs={"out": out}))
    types = [op.type for op in model.graph.operations]
    assert "assign" not in types and "mean" not in types and "where" not in types, types
    X = data((7, 4))[0]
    half, two = np.float32(0.5), np.float32(2.0)
    np.testing.assert_array_equal(model.predict(X)["out"], (X - half) * two)  # the moving mean, not updated


def test_feed_dict_freezes_other_placeholders(tmp_path):
    g, x, training, out = batch_norm_like()
    sess = wb.Session(g)
    path = sess.export(tmp_path / "bn", {"x": x}, {"out": out}, feed_dict={"training": True})
    X = data((7, 4))[0]
    np.testing.assert_array_equal(wb.load_model(path).predict(X)["out"], sess.run(out, {x: X, training: True}))


def test_a_placeholder_that_is_neither_input_nor_fixed_is_named(tmp_path):
    g = wb.Graph()
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 2))
        scale = wb.placeholder("scale", shape=())
        y = x * scale
    with pytest.raises(wb.GraphError, match=r"placeholder 'scale', which is not an input.*feed_dict\n.*test_export"):
        wb.Session(g).export(tmp_path / "m", {"x": x}, {"y": y})


def test_a_placeholder_only_the_training_branch_needs_need_not_be_given(tmp_path):
    g = wb.Graph()
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 2))
        training = wb.placeholder("training", shape=(), dtype="bool")
        noise = wb.placeholder("noise", shape=(None, 2))  # fed while training only
        y = wb.where(training, x + noise, x) * 3.0
    model = wb.load_model(wb.Session(g).export(tmp_path / "m", {"x": x}, {"y": y}))
    assert sorted(op.type for op in model.graph.operations) == ["constant", "identity", "multiply", "placeholder"]
    X = np.array([[1.0, -2.0]], "float32")
    np.testing.assert_array_equal(model.predict(X)["y"], X * np.float32(3.0))


@pytest.mark.parametrize(
    "inputs, outputs, error, match",
    [
        ({"x": "probs"}, {"p": "probs"}, wb.GraphError, r"inputs must be placeholders: 'x' \('probs', a softmax\)"),
        ({"x": "x"}, {"x": "probs"}, wb.ArgumentError, r"names must differ.*'x'"),
        ({"": "x"}, {"p": "probs"}, wb.ArgumentError, r"signature name '' must be a non-empty string"),
        ({}, {"p": "probs"}, wb.ArgumentError, r"inputs must be a dict of names to tensors"),
        ({"x": "x"}, {"p": "nothing"}, wb.GraphError, r"no tensor or operation named 'nothing'"),
    ],
)
def test_bad_signatures_are_refused(tmp_path, inputs, outputs, error, match):
    g, *_ = mlp()
    with pytest.raises(error, match=match):
        wb.Session(g).export(tmp_path / "m", inputs, outputs)


def test_an_output_that_needs_an_update_is_refused():
    g = wb.Graph()
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 2))
        v = wb.variable("v", shape=(2,), init="zeros")
        y = x + wb.assign_add(v, wb.constant([1.0, 1.0]))
    with pytest.raises(
        wb.GraphError,
        match=r"need 'assign_add' \(assign_add\), which updates a variable; .*\n.*line \d+: y = x \+ wb.assign_add",
    ):
        inference_graph(g, {"x": x}, {"y": y})


def test_predict_checks_its_feeds(trained_mlp):
    model = wb.load_model(trained_mlp[3])
    with pytest.raises(wb.FeedError, match=r"predict: unknown inputs 'z'; missing 'x'; the model's inputs are 'x'"):
        model.predict({"z": np.zeros((1, 6))})
    with pytest.raises(wb.FeedError, match=r"placeholder 'x' expects shape \(None, 6\), got shape \(2, 5\)"):
        model.predict({"x": np.zeros((2, 5), "float32")})


def test_predict_on_the_gpu_path(trained_mlp):
    sess, probs, x, path = trained_mlp
    X = data((9, 6))[0]
    got = wb.load_model(path).predict({"x": X}, device="gpu", emulate=True)["probs"]  # the GPU's rewrite, on NumPy
    np.testing.assert_allclose(got, sess.run(probs, {x: X}), rtol=1e-6)


@pytest.mark.gpu
def test_predict_on_a_real_gpu(trained_mlp):
    cp = pytest.importorskip("cupy")
    try:
        count = cp.cuda.runtime.getDeviceCount()
    except Exception:  # noqa: BLE001 - no driver
        count = 0
    if not count:
        pytest.skip("no CUDA device")
    sess, probs, x, path = trained_mlp
    X = data((33, 6))[0]
    got = wb.load_model(path).predict({"x": X}, device="gpu")["probs"]
    assert isinstance(got, np.ndarray)
    np.testing.assert_allclose(got, sess.run(probs, {x: X}), rtol=1e-5, atol=1e-7)


def test_export_is_atomic_and_checks_its_path(trained_mlp, tmp_path, monkeypatch):
    sess, probs, x, path = trained_mlp
    before = open(path, "rb").read()

    def broken(file, arrays):
        file.write(b"PK half a file")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(modelfile.checkpoint, "write_npz", broken)
    with pytest.raises(wb.FileError, match="cannot write model file .*No space left on device"):
        sess.export(path, {"x": x}, {"probs": probs})
    monkeypatch.undo()
    assert open(path, "rb").read() == before and sorted(os.listdir(tmp_path)) == ["mlp.wbmodel"]
    with pytest.raises(wb.FileError, match="directory .* does not exist"):
        sess.export(tmp_path / "missing" / "m", {"x": x}, {"probs": probs})
    with pytest.raises(wb.FileError, match="it is a directory"):
        sess.export(tmp_path, {"x": x}, {"probs": probs})


# -- hostile files -------------------------------------------------------------------------------------------


def members_of(path) -> dict:
    with zipfile.ZipFile(path) as archive:
        return {info.filename: archive.read(info) for info in archive.infolist()}


def write_members(path, members: dict) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)


def npy(array, allow_pickle=False) -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, array, allow_pickle=allow_pickle)
    return buffer.getvalue()


def with_manifest(path, change) -> None:
    members = members_of(path)
    doc = manifest(path)
    change(doc)
    members["model.npy"] = npy(np.frombuffer(json.dumps(doc).encode(), dtype=np.uint8))
    write_members(path, members)


class Boom:
    def __reduce__(self):
        return (exec, ("open('UNPICKLED', 'w').write('ran')",))


def _truncate(path):
    data = open(path, "rb").read()
    open(path, "wb").write(data[: len(data) // 2])


def _bad_json(path):
    members = members_of(path)
    members["model.npy"] = npy(np.frombuffer(b'{"format": "workbench-model", "version": 1,', dtype=np.uint8))
    write_members(path, members)


def _huge_shape(path):
    with_manifest(path, lambda d: d["graph"]["operations"][0]["attrs"].update(shape=[None, 2**40]))


def _huge_value(path):
    members = members_of(path)
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": (2**20, 2**20)})
    members["values/w0.npy"] = header.getvalue() + b"\0" * 64
    write_members(path, members)


def _pickled_value(path):
    members = members_of(path)
    members["values/w0.npy"] = npy(np.array([Boom()], dtype=object), allow_pickle=True)
    write_members(path, members)


def _pickle_file(path):
    open(path, "wb").write(pickle.dumps(Boom()))


def _pickle_member(path):
    members = members_of(path)
    members["payload.pkl"] = pickle.dumps(Boom())
    write_members(path, members)


def _lying_manifest_header(path):
    members = members_of(path)
    header = io.BytesIO()
    shape = (modelfile.MAX_MANIFEST_BYTES + 1,)
    np.lib.format.write_array_header_1_0(header, {"descr": "|u1", "fortran_order": False, "shape": shape})
    members["model.npy"] = header.getvalue() + b"{" * 1024
    write_members(path, members)


def _tampered_value(path):
    members = members_of(path)
    members["values/w0.npy"] = npy(np.zeros((6, 17), "float32"))
    write_members(path, members)


def _flipped_byte(path):
    data = bytearray(open(path, "rb").read())
    at = data.index(b'"tanh"')
    data[at + 1 : at + 5] = b"TANH"  # the zip's CRC no longer matches
    open(path, "wb").write(bytes(data))


def _unknown_op(path):
    with_manifest(path, lambda d: d["graph"]["operations"][-1].update(type="os.system"))


def _update_op(path):
    def change(doc):
        ops = doc["graph"]["operations"]
        ops.append({"name": "evil", "type": "assign", "inputs": ["w0", "w0"], "attrs": {}})

    with_manifest(path, change)


def _missing_value(path):
    members = members_of(path)
    del members["values/b1.npy"]
    write_members(path, members)


def _signature_lies(path):
    with_manifest(path, lambda d: d["signature"]["inputs"][0].update(shape=[None, 7]))


HOSTILE = [
    (_truncate, r"cannot read model file .*BadZipFile"),
    (_bad_json, r"the manifest is not JSON"),
    (_huge_shape, r"more than the limit of 2,147,483,648"),
    (_huge_value, r"more than the limit|declares"),
    (_pickled_value, r"holds Python objects"),
    (_pickle_file, r"cannot read model file .*not a zip file"),
    (_pickle_member, r"unexpected member 'payload.pkl'"),
    (_lying_manifest_header, r"member 'model.npy' holds 1\d+ bytes; its header declares 268435\d+"),
    (_tampered_value, r"stored value of 'w0' is float32 \(6, 17\), the variable is float32 \(6, 16\)"),
    (_flipped_byte, r"Bad CRC-32|BadZipFile|not JSON"),
    (_unknown_op, r"unknown op type 'os.system'"),
    (_update_op, r"'evil' \(assign\) has no place in an inference graph"),
    (_missing_value, r"lacks variables: b1"),
    (_signature_lies, r"signature entry 'x' says float32 \(None, 7\)"),
]


@pytest.mark.parametrize("damage, match", HOSTILE, ids=[d.__name__[1:] for d, _ in HOSTILE])
def test_hostile_files_are_format_errors_and_run_nothing(trained_mlp, tmp_path, monkeypatch, damage, match):
    monkeypatch.chdir(tmp_path)
    path = trained_mlp[3]
    damage(path)
    with pytest.raises(wb.FormatError, match=match):
        wb.load_model(path)
    assert not os.path.exists(tmp_path / "UNPICKLED")


def test_an_oversized_manifest_is_refused_before_it_is_read(trained_mlp, monkeypatch):
    monkeypatch.setattr(modelfile, "MAX_MANIFEST_BYTES", 1000)
    with pytest.raises(wb.FormatError, match=r"the manifest must be at most 1000 bytes \(uint8\), got uint8 \(\d+,\)"):
        wb.load_model(trained_mlp[3])


def test_a_newer_format_says_so(trained_mlp):
    path = trained_mlp[3]
    with_manifest(path, lambda d: d.update(version=2, workbench="9.0"))
    with pytest.raises(wb.FormatError, match=r"format version 2 \(written by workbench 9.0\) is newer than this"):
        wb.load_model(path)


def test_a_checkpoint_or_a_missing_file_is_not_a_model(trained_mlp, tmp_path):
    sess = trained_mlp[0]
    with pytest.raises(wb.FormatError, match="is not a workbench model file"):
        wb.load_model(sess.save(tmp_path / "ckpt.npz"))
    with pytest.raises(wb.FileError, match="no model file at"):
        wb.load_model(tmp_path / "nothing")
