"""Collective frames on a byte stream: read into the registered array, refused when they are not frames."""

import asyncio
import socket
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
from tornado.iostream import SSLIOStream

from workbench.cluster.collective.array_stream import SMALL, ArrayStreams, frame_header
from workbench.cluster.collective.communicator import Mailbox


class BytesStream:
    """The reading half of a stream over fixed bytes; closed (an OSError) once they are used up."""

    def __init__(self, data: bytes):
        self.data, self.pos = memoryview(data), 0

    def _take(self, n: int) -> memoryview:
        if self.pos + n > len(self.data):
            raise OSError("stream closed")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    async def read_bytes(self, n: int) -> bytes:
        return bytes(self._take(n))

    async def read_into(self, buf) -> int:
        buf[:] = self._take(len(buf))
        return len(buf)


class Comm:
    def __init__(self, data: bytes):
        self.stream, self.aborted = BytesStream(data), False

    def abort(self):
        self.aborted = True


def frame(group: str, key: str, value: np.ndarray) -> bytes:
    return frame_header(group, key, value) + value.tobytes()


def read_all(mailbox: Mailbox, data: bytes) -> tuple[list, Comm]:
    got = []

    def deliver(group, key, array):
        got.append((group, key, array))
        mailbox.put(group, key, array)

    streams = ArrayStreams(None, deliver, mailbox.destination)
    comm = Comm(data)

    async def main():
        mailbox.join("g")
        await streams.read(comm)

    asyncio.run(main())
    return got, comm


def test_frames_arrive_in_the_registered_array_or_a_fresh_one():
    mailbox = Mailbox()
    into = np.zeros(1000, dtype="float32")
    mailbox.expect("g", "b|ag|1", into)
    small = np.arange(5, dtype="int64")
    big = np.linspace(0, 1, 1000, dtype="float32")
    got, comm = read_all(mailbox, frame("g", "b|all|1", small) + frame("g", "b|ag|1", big))
    assert [(g, k) for g, k, _ in got] == [("g", "b|all|1"), ("g", "b|ag|1")]
    assert got[0][2].dtype == np.int64 and got[0][2].tolist() == small.tolist()
    assert got[1][2] is into and into.tobytes() == big.tobytes()  # read straight into it
    assert comm.aborted  # the stream ended: the comm is let go


@pytest.mark.parametrize("wrong", ["dtype", "length"])
def test_a_registered_array_of_another_dtype_or_length_is_left_alone(wrong):
    mailbox = Mailbox()
    into = np.zeros(10, dtype="float64")
    mailbox.expect("g", "k", into)
    value = np.ones(10, dtype="float32") if wrong == "dtype" else np.ones(9)
    got, _ = read_all(mailbox, frame("g", "k", value))
    assert got[0][2] is not into and not into.any()  # the receiver refuses it by its shape or dtype


def test_a_frame_of_objects_or_a_garbled_header_ends_the_stream():
    bad = frame_header("g", "x", np.zeros(1)).replace(b"<f8", b"|O8") + b"\0" * 8
    good = np.ones(3)
    got, comm = read_all(Mailbox(), bad + frame("g", "after", good))
    assert got == [] and comm.aborted  # never an object array built from a peer's bytes
    garbled = b"\xff" * 12 + frame("g", "after", good)
    got, comm = read_all(Mailbox(), garbled)
    assert got == [] and comm.aborted


def test_a_small_payload_goes_out_in_the_header_write():
    writes = []

    class Stream:
        def write(self, data):
            writes.append(bytes(data))
            done = asyncio.get_running_loop().create_future()
            done.set_result(None)
            return done

    handshakes = []

    class Open:
        stream = Stream()

        async def write(self, msg):  # the one Dask message: hand this comm to the peer's stream handler
            handshakes.append(msg)

        def closed(self):
            return False

    async def connect(address):
        return Open()

    streams = ArrayStreams(connect, None, None)

    async def main():
        await streams.send("tcp://peer", "g", "small", np.ones(16))
        await streams.send("tcp://peer", "g", "large", np.ones(SMALL // 8 + 1))

    asyncio.run(main())
    assert handshakes == [{"op": "workbench_collective_stream", "reply": False}]  # one comm for both
    assert len(writes) == 3
    assert writes[0] == frame("g", "small", np.ones(16))
    assert writes[1] + writes[2] == frame("g", "large", np.ones(SMALL // 8 + 1))


class SocketComm:
    """A comm over one end of a socket pair, as Dask's TCP comm (its stream holds the socket)."""

    def __init__(self, sock, tls=False):
        self.stream = SimpleNamespace(socket=sock) if not tls else SSLIOStream.__new__(SSLIOStream)
        self.written, self.aborted = [], False

    async def write(self, msg):
        self.written.append(msg)

    def abort(self):
        self.aborted = True
        if not isinstance(self.stream, SSLIOStream):
            self.stream.socket.close()  # the loop's descriptor goes; the one handed to the threads stays


def test_small_frames_go_out_from_the_calling_thread_on_a_socket_of_its_own():
    ours, theirs = socket.socketpair()
    opened, got = [], []
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    # the peer: its stream handler takes the comm over (its own end of the pair) and reads it on the loop
    peer = ArrayStreams(None, lambda *frame: got.append(frame), lambda *_: None, loop)

    async def connect(address):
        opened.append(address)
        comm = SocketComm(ours)
        real_write = comm.write

        async def write(msg):  # the handler's message reaches the peer's handler
            await real_write(msg)
            asyncio.ensure_future(peer.read(SocketComm(theirs), direct=msg.get("direct", False)))

        comm.write = write
        return comm

    def until(condition):
        deadline = time.monotonic() + 5
        while not condition() and time.monotonic() < deadline:
            time.sleep(0.01)
        return condition()

    try:
        streams = ArrayStreams(connect, None, None, loop)
        assert not streams.send_now("tcp://peer", "g", "first", np.ones(4), 5.0)  # none yet: opened meanwhile
        assert until(streams.direct_to) and streams.direct_to() == ["tcp://peer"] and opened == ["tcp://peer"]
        values = [np.arange(10, dtype="float32"), np.full(3, 7, dtype="int64"), np.ones(SMALL // 8)]
        assert all(streams.send_now("tcp://peer", "g", f"k{i}", v, 5.0) for i, v in enumerate(values))
        assert not streams.send_now("tcp://peer", "g", "large", np.ones(SMALL // 8 + 1), 5.0)  # the loop's
        assert until(lambda: len(got) == 3)
        assert [(g, k) for g, k, _ in got] == [("g", "k0"), ("g", "k1"), ("g", "k2")]
        assert all(a.dtype == v.dtype and a.tobytes() == v.tobytes() for (_, _, a), v in zip(got, values))
        loop.call_soon_threadsafe(peer.close)  # the peer went away: a send fails, then a new socket is opened
        with pytest.raises(OSError):
            for _ in range(1000):  # the first writes may still reach the socket's buffer
                streams.send_now("tcp://peer", "g", "gone", np.ones(4), 5.0)
                time.sleep(0.001)
        assert streams.direct_to() == []
        streams.close()
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


def test_a_direct_socket_that_sends_garbage_is_closed():
    ours, theirs = socket.socketpair()
    got = []

    async def main():
        loop = asyncio.get_running_loop()
        streams = ArrayStreams(None, lambda *frame: got.append(frame), lambda *_: None, loop)
        await streams.read(SocketComm(theirs), direct=True)
        ours.setblocking(False)
        assert await loop.sock_recv(ours, 1) == b"\x01"  # the reader took it over
        whole = frame("g", "split", np.arange(3.0)) + frame("g", "ok", np.ones(2))
        for cut in (5, 30, 60):  # cut in a header, in a payload, in the second frame: each arrives whole
            await loop.sock_sendall(ours, whole[:cut])
            await asyncio.sleep(0.05)
            await loop.sock_sendall(ours, whole[cut:])
            await asyncio.sleep(0.05)
        objects = frame_header("g", "x", np.zeros(1)).replace(b"<f8", b"|O8") + b"\0" * 8
        await loop.sock_sendall(ours, objects + frame("g", "after", np.ones(2)))
        async with asyncio.timeout(5):
            assert await loop.sock_recv(ours, 1) == b""  # the reader closed its end
        streams.close()

    asyncio.run(main())
    assert [k for _, k, _ in got] == ["split", "ok"] * 3  # never an object array, nor what followed it
    assert got[0][2].tolist() == [0.0, 1.0, 2.0] and got[1][2].tolist() == [1.0, 1.0]


def test_no_socket_of_its_own_over_tls():
    async def connect(address):
        return SocketComm(None, tls=True)

    async def main():
        streams = ArrayStreams(connect, None, None, asyncio.get_running_loop())
        assert not streams.send_now("tls://peer", "g", "k", np.ones(4), 5.0)
        for _ in range(10):
            await asyncio.sleep(0.01)
        assert not streams.send_now("tls://peer", "g", "k", np.ones(4), 5.0)  # never: the loop sends them all
        assert streams.direct_to() == []

    asyncio.run(main())
