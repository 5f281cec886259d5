"""The all-reduce algorithms over an in-memory transport: no cluster, one event loop in a thread."""

import asyncio
import threading
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


def inline_group(loop, size, timeout=10.0, name="i", refuse=(), fail=(), send_now=None):
    """``size`` communicators that send small arrays from the calling thread: delivered to the peer's
    mailbox on the loop, as the peer's stream reader would; ``refuse``: peers with no direct way yet
    (the loop sends to them), ``fail``: peers the direct send fails for. Each rank's loop sends are counted."""
    boxes = [Mailbox() for _ in range(size)]
    loop_sends = [0] * size

    def sender(rank):
        async def send(peer, key, value):
            loop_sends[rank] += 1
            boxes[peer].put(name, key, np.array(value))

        def now(peer, key, value):
            if peer in fail:
                raise ConnectionResetError("the peer went away")
            if peer in refuse:
                return False
            loop.call_soon_threadsafe(boxes[peer].put, name, key, np.array(value))
            return True

        return send, send_now or now

    addresses = [f"inproc://{r}" for r in range(size)]
    comms = []
    for r in range(size):
        send, now = sender(r)
        comms.append(Communicator(name, r, addresses, send, boxes[r], loop, timeout, "auto", send_now=now))
    return comms, loop_sends


@pytest.mark.parametrize("size", [2, 3, 5])
def test_small_gathers_from_the_calling_thread_give_the_gathers_bits(loop, size):
    rng = np.random.default_rng(size)
    parts = [rng.standard_normal(1003) * 10.0 ** rng.integers(-8, 8, 1003) for _ in range(size)]
    comms, loop_sends = inline_group(loop, size, name=f"inline-{size}")
    for c in comms:
        c.algorithm = "gather"  # "auto" gathers between 2 ranks only
    for step in range(3):  # several buckets one after the other, as steps do
        flats = [p.copy() for p in parts]
        handles = [c.start(f"step-{step}", f, scale=0.25) for c, f in zip(comms, flats)]
        results = [h.wait(10) for h in handles]
        expected = tree_sum(parts, np.empty_like(parts[0])) * 0.25  # over the ranks, in rank order
        for r in results:
            assert r.tobytes() == expected.tobytes()
    assert loop_sends == [0] * size  # every array went out from the calling thread
    for c in comms:
        assert c.bytes_sent == c.bytes_received == 3 * (size - 1) * parts[0].nbytes


def test_auto_takes_the_calling_thread_for_small_arrays_between_2_ranks_only(loop):
    comms, loop_sends = inline_group(loop, 2, name="auto-2")
    small, large = [np.full(100, r + 1.0) for r in range(2)], [np.full(10_000, r + 1.0) for r in range(2)]
    for flats in (small, large):
        for h in [c.start(f"b{len(flats[0])}", f) for c, f in zip(comms, flats)]:
            assert h.wait(10)[0] == 3.0
    assert loop_sends == [2, 2]  # the large one was direct's, through the loop: a chunk each way, each round
    comms3, loop_sends3 = inline_group(loop, 3, name="auto-3")
    for h in [c.start("b", np.ones(100)) for c in comms3]:
        assert h.wait(10).tolist() == [3.0] * 100
    assert loop_sends3 == [4, 4, 4]  # 3 ranks: direct's two rounds, through the loop


@pytest.mark.parametrize("refuse", [(0, 1), (1,)])
def test_peers_without_a_direct_way_get_the_array_through_the_loop(loop, refuse):
    comms, loop_sends = inline_group(loop, 3, name=f"refuse-{len(refuse)}", refuse=refuse)
    for c in comms:
        c.algorithm = "gather"
    flats = [np.arange(50.0) * (r + 1) for r in range(3)]
    for h in [c.start("b", f) for c, f in zip(comms, flats)]:
        np.testing.assert_array_equal(h.wait(10), np.arange(50.0) * 6)
    # a rank whose first peer has no direct way sends it all through the loop; else only to those without
    assert loop_sends == {(0, 1): [2, 2, 2], (1,): [2, 0, 1]}[refuse]
    assert all(c.bytes_sent == c.bytes_received == 2 * 50 * 8 for c in comms)


def test_a_silent_peer_or_a_short_wait_is_named_on_the_calling_threads_path(loop):
    comms, _ = inline_group(loop, 2, timeout=0.3, name="silent-inline")
    handle = comms[0].start("b", np.ones(8))  # rank 1 never starts
    started = time.monotonic()
    with pytest.raises(ClusterError, match=r"nothing from rank 1 \(inproc://1\) for 0.3 s \(did it die or hang\?\)"):
        handle.wait(5)
    assert time.monotonic() - started < 2
    with pytest.raises(ClusterError, match="nothing from rank 1"):  # the failure stays
        handle.summed(5)
    comms, _ = inline_group(loop, 2, timeout=10, name="short-inline")
    handle = comms[0].start("b", np.ones(8))
    assert not handle.done()
    with pytest.raises(ClusterError, match=r"bucket 'b' on rank 0 timed out after 0.2 s waiting for rank 1"):
        handle.wait(0.2)


def test_a_failed_direct_send_or_a_bad_array_is_named_at_wait(loop):
    comms, _ = inline_group(loop, 2, name="fail-inline", fail=(1,))
    handle = comms[0].start("b", np.ones(8))
    assert handle.done()  # nothing left to wait for: wait raises at once
    with pytest.raises(
        ClusterError, match=r"sending 'b\|all\|0' to rank 1 \(inproc://1\) failed: ConnectionResetError"
    ):
        handle.wait(5)
    comms, _ = inline_group(loop, 2, name="bad-inline")
    wrong = comms[1].start("b", np.ones(8, dtype="float32"))
    with pytest.raises(ClusterError, match=r"rank 1 \(inproc://1\) sent float32 \(8,\) .* float64 \(8,\) belongs"):
        comms[0].start("b", np.ones(8)).wait(5)
    with pytest.raises(ClusterError, match="sent float64"):
        wrong.wait(5)


def test_closing_ends_a_wait_on_the_calling_threads_path(loop):
    comms, _ = inline_group(loop, 2, name="closed-inline")
    handle = comms[0].start("b", np.ones(8))
    threading.Timer(0.2, comms[0].close).start()
    with pytest.raises(ClusterError, match="collective 'closed-inline' was released while it waited for rank 1"):
        handle.wait(5)
