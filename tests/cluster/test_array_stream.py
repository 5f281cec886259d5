"""Collective frames on a byte stream: read into the registered array, refused when they are not frames."""

import asyncio

import numpy as np
import pytest

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
