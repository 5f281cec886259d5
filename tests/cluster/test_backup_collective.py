"""The backup group's protocol over an in-memory transport: no cluster, one event loop in a thread.

The first ``R`` ranks to hand a gradient in are reduced among themselves (a reduce-scatter and an
all-gather), a late rank never holds them, and no rank receives more than about the model once.
"""

import asyncio
import threading
import time

import numpy as np

from workbench.cluster.collective.backups import BackupRank
from workbench.cluster.collective.communicator import Communicator, Mailbox, tree_sum
from workbench.errors import CollectiveError

N = 1001  # elements of one gradient bucket (chunks of unequal length)


class Net:
    """Mailboxes joined by sends that copy the array (as a network would); a rank can be killed."""

    def __init__(self, loop, size, name):
        self.loop, self.name, self.dead = loop, name, set()
        self.lost = lambda rank, peer, key: False  # messages the network loses
        self.boxes = [Mailbox() for _ in range(size)]
        addresses = [f"inproc://{r}" for r in range(size)]
        self.comms = [Communicator(name, r, addresses, self.sender(r), self.boxes[r], loop, 1.0) for r in range(size)]

    def sender(self, rank):
        async def send(peer, key, value):
            await asyncio.sleep(0)
            if rank in self.dead or peer in self.dead:
                raise OSError(f"rank {peer if peer in self.dead else rank} is gone")
            if not self.lost(rank, peer, key):
                self.boxes[peer].put(self.name, key, np.array(value))

        return send


def ranks(loop, size, needed, name, buckets=2, mean=True):
    net = Net(loop, size, name)
    return net, [BackupRank(c, needed, 0, buckets, mean) for c in net.comms]


def gradients(size, buckets=2, seed=0):
    rng = np.random.default_rng(seed)
    return [
        [rng.standard_normal(N + b) * 10.0 ** rng.integers(-6, 6, N + b) for b in range(buckets)] for _ in range(size)
    ]


def hand_in(backups, grads, rows, late=(), late_by=0.0, step=1):
    """Every rank's ``exchange`` in a thread of its own (the ``late`` ones ``late_by`` seconds after the
    others); each rank's (used ranks, buckets, seconds until its exchange returned)."""
    out: list = [None] * len(backups)
    t0 = time.monotonic()

    def run(r):
        if r in late:
            time.sleep(late_by)
        flats = [g.copy() for g in grads[r]]
        try:
            used = backups[r].exchange(step, flats, time.time(), time.time(), rows[r])
            out[r] = (used, flats, time.monotonic() - t0)
        except CollectiveError as e:
            out[r] = e

    threads = [threading.Thread(target=run, args=(r,)) for r in range(len(backups))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


def expected(grads, rows, used):
    """The gather's sum: whole buckets summed over the used ranks in rank order, then the mean."""
    total = sum(rows[r] for r in used)
    sums = [tree_sum([grads[r][b] for r in used]) for b in range(len(grads[0]))]
    for s in sums:
        np.multiply(s, 1.0 / total, out=s, casting="unsafe")
    return sums


def rank_1_dies_after_its_header(backups, net, told=(0, 2)):
    """Rank 1 is ready and chosen, then gone before sending its pieces; the ranks ``told`` hear of it
    0.5 s later. Returns rank 1's own ``_reduce``."""
    dying = backups[1]
    real = dying._reduce

    async def dies_after_its_header(*args):
        net.dead.add(1)
        raise CollectiveError("killed")

    dying._reduce = dies_after_its_header

    def tell():
        time.sleep(0.5)
        for r in told:
            backups[r].peer_gone([1])

    threading.Thread(target=tell).start()
    return real


def assert_bits(results, sums):
    """Each of ``results`` (a rank's buckets) holds the very bits of ``sums``."""
    for flats in results:
        for flat, s in zip(flats, sums):
            assert flat.tobytes() == s.tobytes()


def test_the_first_r_reduce_among_themselves_and_a_late_rank_never_holds_them(loop):
    net, backups = ranks(loop, 5, 3, "first-r")
    grads, rows = gradients(5), [8, 8, 8, 7, 7]
    out = hand_in(backups, grads, rows, late=(1, 3), late_by=0.6)
    used = out[0][0]
    assert used == [0, 2, 4]
    assert [out[r][0] for r in range(5)] == [used] * 5
    assert_bits([out[r][1] for r in range(5)], expected(grads, rows, used))  # summing whole gradients in rank order
    assert max(out[r][2] for r in used) < 0.5  # the used ranks went on without the late ones
    for b in backups:
        b.close()


def test_no_rank_receives_more_than_about_the_model_once(loop):
    size, needed = 6, 4
    net, backups = ranks(loop, size, needed, "bytes", buckets=1)
    grads, rows = gradients(size, buckets=1, seed=1), [5] * size
    model = grads[0][0].nbytes
    out = hand_in(backups, grads, rows, late=(4, 5), late_by=0.5)
    assert out[0][0] == [0, 1, 2, 3]
    received = [b.bytes_received for b in backups]
    # a used rank: 2 (R - 1) / R of the model, a dropped one the model once; the arbiter's rank besides
    # a few numbers per rank, where gathering to it cost (R + b - 1) models
    small = 64 * 8 * size
    assert max(received[1:4]) <= 2 * (needed - 1) / needed * model + small
    assert max(received[4:]) <= model + small
    assert max(received) <= 2 * model < (size - 1) * model
    for b in backups:
        b.close()


def test_a_used_rank_that_leaves_before_any_rank_applied_the_step_makes_it_decided_again(loop):
    net, backups = ranks(loop, 3, 2, "leaves")
    grads, rows = gradients(3, seed=2), [6, 6, 6]
    real = rank_1_dies_after_its_header(backups, net)
    out = hand_in(backups, grads, rows, late=(2,), late_by=0.3)
    backups[1]._reduce = real
    assert isinstance(out[1], CollectiveError)
    assert out[0][0] == out[2][0] == [0, 2]  # decided again with the late rank's gradient
    assert_bits([out[0][1], out[2][1]], expected(grads, rows, [0, 2]))
    for b in backups:
        b.close()


def out_rank_left_alone(backups, net, grads, rows, wanted):
    """Rank 1 (used) dies after its header; rank 2 had no gradient (it found the step decided before it
    began), so rank 0's is the only one left: rank 2 is asked for its gradient and ``wanted(out)``
    says what it does then. Each rank's outcome: (used, buckets), None (wanted), or the error."""
    rank_1_dies_after_its_header(backups, net)
    out: list = [None] * 3

    def run(r):
        flats = [g.copy() for g in grads[r]]
        try:
            used = backups[r].exchange(1, flats, time.time(), time.time(), rows[r], out=r == 2)
            out[r] = (used, flats)
            if used is None:
                out[r] = wanted(out)
        except CollectiveError as e:
            out[r] = e

    threads = [threading.Thread(target=run, args=(r,)) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


def test_an_out_rank_gives_its_gradient_where_a_used_rank_left_and_too_few_have_one(loop):
    net, backups = ranks(loop, 3, 2, "wanted")
    grads, rows = gradients(3, seed=3), [4, 4, 5]

    def computes_and_hands_in(out):  # what the replica does: its gradient of the step, for the next attempt
        attempt = backups[2].rejoin
        flats = [g.copy() for g in grads[2]]
        return backups[2].exchange(1, flats, time.time(), time.time(), rows[2], attempt=attempt), flats, attempt

    out = out_rank_left_alone(backups, net, grads, rows, computes_and_hands_in)
    assert isinstance(out[1], CollectiveError)
    used, flats, attempt = out[2]
    assert attempt == 1 and used == out[0][0] == [0, 2]  # the next attempt, with the out rank's gradient
    assert_bits([out[0][1], flats], expected(grads, rows, [0, 2]))
    for b in backups:
        b.close()


def test_too_few_ranks_left_fail_the_step_with_a_message(loop):
    net, backups = ranks(loop, 3, 2, "too-few")
    grads, rows = gradients(3, seed=3), [4, 4, 4]

    def leaves_too(out):  # the out rank, asked for its gradient, leaves as well
        net.dead.add(2)
        backups[0].peer_gone([2])
        return "left"

    out = out_rank_left_alone(backups, net, grads, rows, leaves_too)
    assert out[2] == "left" and isinstance(out[0], CollectiveError)
    assert "ranks [1, 2] left the cluster, and fewer than 2 ranks with a gradient are left" in str(out[0])
    for b in backups:
        b.close()


def test_an_owner_that_leaves_once_a_rank_applied_the_step_has_its_chunks_handed_on(loop):
    net, backups = ranks(loop, 3, 2, "relay")
    grads, rows = gradients(3, seed=4), [6, 6, 6]
    # rank 1 owns chunk 1 of step 1 and dies having sent it to rank 0 only (rank 2, late, never has it)
    net.lost = lambda rank, peer, key: rank == 1 and peer == 2 and "|s0." in key

    def kill_once_applied():
        time.sleep(0.3)
        net.dead.add(1)
        for r in (0, 2):
            backups[r].peer_gone([1])

    threading.Thread(target=kill_once_applied).start()
    out = hand_in(backups, grads, rows, late=(2,), late_by=0.6)
    assert out[0][0] == out[1][0] == out[2][0] == [0, 1]
    assert_bits([out[r][1] for r in range(3)], expected(grads, rows, [0, 1]))
    for b in backups:
        b.close()


def test_step_after_step_each_applies_the_mean_of_its_first_r(loop):
    net, backups = ranks(loop, 4, 2, "steps")
    rows = [3, 3, 3, 3]
    for step, late in ((1, (0, 1)), (2, (2, 3)), (3, (0, 3))):
        grads = gradients(4, seed=10 + step)
        out = hand_in(backups, grads, rows, late=late, late_by=0.4, step=step)
        used = sorted(set(range(4)) - set(late))
        assert [out[r][0] for r in range(4)] == [used] * 4
        assert_bits([out[r][1] for r in range(4)], expected(grads, rows, used))
    for b in backups:
        b.close()


def test_a_rank_that_does_not_report_after_a_departure_fails_the_step_rather_than_guess(loop):
    net, backups = ranks(loop, 3, 2, "silent")
    grads, rows = gradients(3, seed=5), [4, 4, 4]
    # rank 2 never hears of it: whether it applied the step is unknown
    rank_1_dies_after_its_header(backups, net, told=(0,))
    out = hand_in(backups, grads, rows, late=(2,), late_by=0.3)
    assert isinstance(out[0], CollectiveError)
    assert "or one of them did not say whether it applied the step" in str(out[0])
    for b in backups:
        b.close()
