"""Models and data shared by the cluster tests (the ``kit`` fixture: test modules cannot import each other)."""

import asyncio
import threading
from types import SimpleNamespace

import numpy as np
import pytest

import workbench as wb


def mlp(
    layers: int = 2,
    dtype: str = "float64",
    hidden: int = 8,
    optimizer=None,
    name: str = "mlp",
    features: int = 6,
    dropout: float = 0.0,
):
    """A classifier of ``layers`` dense layers on ``features`` inputs, trained with Adam by default;
    with ``dropout`` after each hidden layer."""
    g = wb.Graph(name=name)
    with g.as_default():
        x = wb.placeholder("x", shape=(None, features), dtype=dtype)
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        h, width = x, features
        for i in range(layers):
            out = 3 if i == layers - 1 else hidden
            w = wb.variable(f"w{i}", shape=(width, out), init="glorot_uniform", dtype=dtype)
            b = wb.variable(f"b{i}", shape=(out,), init="zeros", dtype=dtype)
            h = wb.matmul(h, w) + b
            if i < layers - 1:
                h = wb.tanh(h)
                if dropout:
                    h = wb.dropout(h, dropout)
            width = out
        loss = wb.mean(wb.softmax_cross_entropy(h, y))
        train = (optimizer or wb.optimizers.Adam(0.05)).minimize(loss)
    return {"graph": g, "x": x, "y": y, "loss": loss, "train": train, "logits": h}


def blobs(n: int = 96, features: int = 6, dtype: str = "float64", seed: int = 0) -> dict:
    """Three noisy classes: ``{"x": ..., "y": ...}``."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, size=n)
    centers = rng.normal(size=(3, features)) * 2
    x = centers[y] + rng.normal(size=(n, features))
    return {"x": x.astype(dtype), "y": y.astype("int64")}


def assert_same_variables(a: dict, b: dict, rtol: float) -> None:
    """``b`` holds ``a``'s variables to ``rtol`` of each variable's largest value (elements near zero are
    as exact as the largest ones, not more: the BLAS kernel may round them differently)."""
    assert sorted(a) == sorted(b)
    for name in a:
        scale = float(np.abs(np.asarray(a[name], dtype="float64")).max(initial=0.0))
        np.testing.assert_allclose(b[name], a[name], rtol=rtol, atol=rtol * scale, err_msg=name)


def local_client(n_workers: int):
    """A real cluster of ``n_workers`` worker processes, one thread each, on 127.0.0.1."""
    client = wb.cluster.connect("local", n_workers=n_workers)
    try:
        client.wait_for_workers(n_workers, timeout=60)
        yield client
    finally:
        wb.cluster.close(client)


@pytest.fixture(scope="session")
def shared_client():
    """One real cluster of 2 worker processes for every module whose tests leave its workers as they were."""
    yield from local_client(2)


@pytest.fixture(scope="module")
def client(request):
    """A real cluster of 2 worker processes: the shared one, or one of the module's own where the module
    says ``OWN_CLUSTER = True`` (its tests kill, stop or close workers, or count what the cluster holds)."""
    if getattr(request.module, "OWN_CLUSTER", False):
        yield from local_client(2)
    else:
        yield request.getfixturevalue("shared_client")


@pytest.fixture(scope="module")
def client3():
    """One real cluster per test module: 3 worker processes."""
    yield from local_client(3)


@pytest.fixture(scope="session")
def kit():
    return SimpleNamespace(mlp=mlp, blobs=blobs, assert_same_variables=assert_same_variables)


@pytest.fixture(scope="module")
def loop():
    """An asyncio loop in a thread of its own, as a worker's (tasks left at the end are cancelled)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop

    async def cancel_the_rest():
        rest = asyncio.all_tasks() - {asyncio.current_task()}
        for task in rest:
            task.cancel()
        await asyncio.gather(*rest, return_exceptions=True)

    asyncio.run_coroutine_threadsafe(cancel_the_rest(), loop).result(5)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
