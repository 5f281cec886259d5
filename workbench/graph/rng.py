"""The generators a plan hands to random ops (dropout).

Every draw is keyed by the session's seed, the op's seed and the run (the
training step). When the op's input is batch-first (its static first axis is
unknown) the draws are also keyed by each example's row in the global batch,
so a replica that runs a shard of the batch draws exactly the numbers that a
local run of the whole batch draws for those rows.
"""

from __future__ import annotations

import math

import numpy as np


class RowGenerator:
    """``random(shape)`` for the rows ``offset .. offset + shape[0]`` of a global batch.

    Element ``k`` (in C order) of the whole batch's draws is number ``k`` of one
    counter-based Philox stream; a slice of rows starts the stream at its first
    element, so it draws only its own rows and never the ones before it.

    Examples
    --------
    >>> whole = RowGenerator([1, 2, 3], 0).random((5, 3))
    >>> rows = RowGenerator([1, 2, 3], 2).random((3, 3))
    >>> bool((whole[2:] == rows).all())
    True
    """

    def __init__(self, key, offset: int):
        self.key, self.offset = key, int(offset)

    def random(self, shape) -> np.ndarray:
        shape = tuple(int(d) for d in shape)
        start = self.offset * math.prod(shape[1:])
        bits = np.random.Philox(self.key)
        bits.advance(start // 4)  # each step of Philox's counter gives four numbers
        skip = start % 4
        return np.random.Generator(bits).random(skip + math.prod(shape))[skip:].reshape(shape)


def generator(key, batched: bool, row_offset: int):
    """What a random op's kernel gets as ``rng``: row-keyed draws for a batch-first input,
    else a NumPy Generator seeded by ``key`` alone."""
    return RowGenerator(key, row_offset) if batched else np.random.default_rng(key)
