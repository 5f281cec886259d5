"""The all-reduce algorithms over an in-memory transport: no cluster, one event loop in a thread."""

import asyncio
import time

import numpy as np
import pytest

from workbench.cluster.collective.communicator import Communicator, Mailbox, chunk_bounds, tree_sum
from workbench.errors import ClusterError


def group(loop, size, algorithm, timeout=10.0, name="g"):
    """``size`` communicators whose sends copy the array into the peer's mailbox (as a network would)."""
    boxes = [Mailbox() for _ in range(size)]

    def sender(rank):
        async def send(peer, key, value):
            await asyncio.sleep(0)
            boxes[peer].put(name, key, np.array(value))

        return send

    addresses = [f"inproc://{r}" for r in range(size)]
    return [Communicator(name, r, addresses, sender(r), boxes[r], loop, timeout, algorithm) for r in range(size)]


def reference(parts, algorithm, size):
    """Each chunk summed in the order the algorithm promises."""
    out = np.empty_like(parts[0])
    if algorithm == "gather":
        return tree_sum(parts, out)
    for c, (a, b) in enumerate(chunk_bounds(len(out), size)):
        pieces = [p[a:b] for p in parts]
        if algorithm == "ring":  # g_c + g_c+1 + ... around the ring
            total = pieces[c].copy()
            for k in range(1, size):
                total = total + pieces[(c + k) % size]
            out[a:b] = total
        else:
            tree_sum(pieces, out[a:b])
    return out


@pytest.mark.parametrize("algorithm", ["direct", "ring", "gather"])
@pytest.mark.parametrize("size", [1, 2, 3, 5])
def test_every_rank_gets_the_same_bits_in_the_promised_order(loop, algorithm, size):
    rng = np.random.default_rng(size)
    parts = [rng.standard_normal(1003) * 10.0 ** rng.integers(-8, 8, 1003) for _ in range(size)]
    comms = group(loop, size, algorithm)
    flats = [p.copy() for p in parts]
    handles = [c.start("b0", f, scale=0.25) for c, f in zip(comms, flats)]
    results = [h.wait(10) for h in handles]
    expected = reference(parts, algorithm, size) * 0.25
    for r in results:
        assert r.tobytes() == results[0].tobytes()
    np.testing.assert_array_equal(results[0], expected)
    if size > 1:
        sent = comms[0].bytes_sent
        if algorithm == "gather":  # the whole array to every peer: for small arrays, one round of messages
            assert sent == (size - 1) * parts[0].nbytes
        else:  # bandwidth-optimal
            assert sent == pytest.approx(2 * (size - 1) / size * parts[0].nbytes, rel=0.01)


def test_buckets_in_flight_at_once_are_matched_by_name(loop):
    comms = group(loop, 3, "direct")
    flats = {(r, b): np.full(10, float(r + 1) * (b + 1), dtype="float32") for r in range(3) for b in range(4)}
    # rank 2 starts its buckets in the reverse order
    handles = {
        (r, b): comms[r].start(f"step-1.{b}", flats[r, b])
        for r in range(3)
        for b in (range(4) if r < 2 else range(3, -1, -1))
    }
    for (_, b), h in handles.items():
        np.testing.assert_array_equal(h.wait(10), np.full(10, 6.0 * (b + 1), dtype="float32"))


def test_a_silent_peer_is_named_within_the_timeout(loop):
    comms = group(loop, 3, "direct", timeout=0.3)
    handles = [comms[r].start("b", np.ones(8)) for r in (0, 1)]  # rank 2 never starts
    for h in handles:
        with pytest.raises(ClusterError, match=r"nothing from rank 2 \(inproc://2\) for 0.3 s"):
            h.wait(5)


def test_bad_arguments_are_named():
    with pytest.raises(ClusterError, match="unknown all-reduce algorithm 'tree'; use one of 'auto', 'direct'"):
        Communicator("g", 0, ["a"], None, Mailbox(), None, algorithm="tree")
    with pytest.raises(ClusterError, match=r"contiguous 1-d array, got shape \(2, 2\)"):
        Communicator("g", 0, ["a", "b"], None, Mailbox(), None).start("b", np.ones((2, 2)))


def test_the_sum_is_there_before_the_peers_reply_and_the_array_is_ours_after_wait(loop):
    boxes, replies = [Mailbox() for _ in range(2)], asyncio.Event()

    def sender(rank):
        async def send(peer, key, value):  # delivered at once; the reply (the peer has read it) waits
            boxes[peer].put("s", key, np.array(value))
            await replies.wait()

        return send

    comms = [Communicator("s", r, ["a", "b"], sender(r), boxes[r], loop, 10.0, "direct") for r in range(2)]
    flats = [np.full(8, 1.0 + r) for r in range(2)]
    handles = [c.start("b0", f) for c, f in zip(comms, flats)]
    for h, f in zip(handles, flats):  # while no reply has come
        assert h.summed(5) is f and f.tolist() == [3.0] * 8
    loop.call_soon_threadsafe(replies.set)
    assert all(h.wait(5) is f for h, f in zip(handles, flats))


@pytest.mark.parametrize("algorithm", ["direct", "ring", "gather"])
@pytest.mark.parametrize("corrupt", ["length", "dtype"])
def test_a_message_of_the_wrong_length_or_dtype_is_refused_not_summed(loop, algorithm, corrupt):
    size, name = 3, f"bad-{algorithm}-{corrupt}"
    boxes = [Mailbox() for _ in range(size)]

    def sender(rank):
        async def send(peer, key, value):
            value = np.array(value)
            if rank == 1:  # the right key, the wrong array
                value = value[:-1] if corrupt == "length" else value.astype(np.float32)
            boxes[peer].put(name, key, value)

        return send

    addresses = [f"inproc://{r}" for r in range(size)]
    comms = [Communicator(name, r, addresses, sender(r), boxes[r], loop, 0.75, algorithm) for r in range(size)]
    arrays = [np.arange(30, dtype=np.float64) + r for r in range(size)]
    handles = [c.start("b0", a) for c, a in zip(comms, arrays)]
    errors = []
    for rank, h in enumerate(handles):
        try:
            h.wait(10)
        except ClusterError as e:
            errors.append(str(e))
        else:  # only the rank that sent the bad arrays may finish (it received good ones)
            assert rank == 1 and algorithm == "gather"
    refused = [e for e in errors if "rank 1 (inproc://1) sent" in e and "belongs" in e]
    assert refused, errors  # the ranks that got rank 1's message refused it; the others timed out waiting
    for c in comms:
        c.close()


def test_messages_for_a_group_never_joined_are_dropped_after_a_while(loop):
    box = Mailbox(stray_seconds=0.3)

    async def deliver():
        box.put("stray", "b0|all|0", np.zeros(5 << 20))  # 40 MB nobody here will ever take
        box.put("mine", "b0|all|0", np.ones(3))

    box_join = asyncio.run_coroutine_threadsafe(asyncio.sleep(0), loop)
    box_join.result(5)
    loop.call_soon_threadsafe(box.join, "mine")
    asyncio.run_coroutine_threadsafe(deliver(), loop).result(5)
    assert len(box) == 2
    deadline = time.monotonic() + 5
    while len(box) > 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(box) == 1  # the stray is gone, the joined group's message waits to be taken
    taken = asyncio.run_coroutine_threadsafe(box.take("mine", "b0|all|0", 1.0), loop).result(5)
    assert np.array_equal(taken, np.ones(3))


@pytest.mark.parametrize("size", [2, 3])
def test_direct_pipelines_large_chunks_in_segments_with_the_same_bits(loop, size, monkeypatch):
    import workbench.cluster.collective.communicator as communicator

    monkeypatch.setattr(communicator, "SEGMENT", 64 << 10)  # 100 003 float64: chunks of 4-7 segments
    rng = np.random.default_rng(size)
    parts = [rng.standard_normal(100_003) * 10.0 ** rng.integers(-8, 8, 100_003) for _ in range(size)]
    comms = group(loop, size, "direct", name=f"seg-{size}")
    flats = [p.copy() for p in parts]
    results = [h.wait(30) for h in [c.start("big", f, scale=0.5) for c, f in zip(comms, flats)]]
    expected = reference(parts, "direct", size) * 0.5
    for r in results:
        assert r.tobytes() == expected.tobytes()
    assert comms[0].bytes_sent == pytest.approx(2 * (size - 1) / size * parts[0].nbytes, rel=0.01)
