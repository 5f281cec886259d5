import numpy as np
import pytest

import workbench as wb


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture
def graph():
    g = wb.Graph(name="test")
    with g.as_default():
        yield g
