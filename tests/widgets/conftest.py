import pytest

import workbench as wb


class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self, now: float = 100.0):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def mlp():
    """The graph of the issue's example, built without the magic."""
    g = wb.Graph(name="mlp")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 64))
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        w = wb.variable("w", shape=(64, 10), init="glorot_uniform")
        b = wb.variable("b", shape=(10,), init="zeros")
        g.loss = wb.mean(wb.softmax_cross_entropy(wb.matmul(x, w) + b, y))
        g.train = wb.optimizers.SGD(0.1).minimize(g.loss)
    return g


@pytest.fixture
def linear():
    """A one-variable regression to train quickly: ``(graph, train, loss)``."""
    g = wb.Graph(name="lin")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 2))
        w = wb.variable("w", shape=(2,), init=0.0)
        loss = wb.mean((wb.sum(x * w, axis=1) - 1.0) ** 2.0)
        train = wb.optimizers.SGD(0.1).minimize(loss)
    return g, train, loss
