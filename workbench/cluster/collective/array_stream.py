"""Arrays between two workers as raw frames on one long-lived Dask comm per peer.

A collective's messages are many, regular and small in number of fields: a group, a key and
one flat array. Sent as Dask messages (``rpc``, one per array, with a reply) each pays the
connection pool, msgpack, the frame header, the handler's dispatch and a reply's round trip.
Here a worker opens one comm to each peer it sends to (Dask's ``connect`` with the worker's
own connection arguments, so TLS comes for free), hands it to the peer's stream handler with
one Dask message, and from then on writes frames straight to the comm's stream::

    <u32 length of the names> <u64 payload bytes> group \\0 key \\0 dtype   payload

The receiver reads the payload straight into the array the receiving rank registered for the
key (:meth:`~workbench.cluster.collective.communicator.Mailbox.expect`), or into a fresh one: no copy
between the socket's buffer and where the array is used. A frame whose payload is small goes
out in one write with its header (one system call). No reply: once the stream has handed the
payload to the socket the array is the sender's again, and a sum the peer sends back depends
on having read it all. Comms without a byte stream (UCX, in-process) fall back to messages.

Small arrays skip the event loop on the way out: a second comm to each peer, opened the same
way, is handed over to the sending threads as a plain socket (:meth:`ArrayStreams.send_now`), so
the thread that computed an array writes its frame itself, with no hop to the loop. The peer's
stream handler takes that comm's socket over too (:class:`DirectReader`): a callback of its loop
reads the frames when the socket is readable and delivers each in that same loop iteration. Only
for plain TCP: over TLS every frame goes through the comm's stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import struct
import threading
from collections.abc import Awaitable, Callable

import numpy as np
from tornado.iostream import SSLIOStream

HANDLER = "workbench_collective_stream"
HEADER = struct.Struct("<IQ")  # length of the names that follow, payload bytes
SMALL = 64 << 10  # a payload up to this many bytes goes out in the header's write
NAMES = 4 << 10  # at most this many bytes of names in a frame on a direct socket
ACK = b"\x01"  # a direct socket's reader took it over: frames may follow
ACK_SECONDS = 30.0
KINDS = "biufc"  # dtypes a frame may carry: plain numbers only, never objects


class FrameError(OSError):
    """A frame that is not one (a bad header or dtype): the stream it came on is dropped."""


def frame_header(group: str, key: str, value) -> bytes:
    names = f"{group}\0{key}\0{value.dtype.str}".encode()
    return HEADER.pack(len(names), value.nbytes) + names


class ArrayStreams:
    """One worker's outgoing streams, by peer address, and the reader of its incoming ones.

    Parameters
    ----------
    connect : coroutine function ``connect(address)``
        A new Dask comm to ``address`` (the worker's connection arguments applied).
    deliver : ``deliver(group, key, array)``
        Where an array that arrived goes (a mailbox's ``put``).
    into : ``into(group, key, dtype, nbytes)``
        The array registered to receive ``key`` of ``group``, or None for a fresh one.
    loop : asyncio event loop, optional
        The loop the comms live on; without one there are no sockets for :meth:`send_now`.
    """

    def __init__(self, connect: Callable[[str], Awaitable], deliver: Callable, into: Callable, loop=None):
        self._connect, self._deliver, self._into, self._loop = connect, deliver, into, loop
        self._out: dict[str, asyncio.Future] = {}
        self._lock = threading.Lock()
        # peer address -> (socket, its lock) the sending threads write to; False: none to be had
        self._direct: dict[str, tuple | bool] = {}
        self._opening: set[str] = set()
        self._incoming: set[DirectReader] = set()

    async def stream_to(self, address: str):
        """The open stream to ``address`` (opened on first use, again after it broke), or None
        where the comm has no byte stream to write frames on."""
        opening = self._out.get(address)
        if opening is not None and opening.done():
            comm = None if opening.cancelled() or opening.exception() else opening.result()
            if comm is None or comm is not False and comm.closed():
                opening = None
        if opening is None:
            opening = self._out[address] = asyncio.ensure_future(self._open(address))
        comm = await asyncio.shield(opening)
        return None if comm is False else comm.stream

    def open_to(self) -> list[str]:
        """The peers this worker has a frame stream to now."""
        return sorted(
            a
            for a, f in self._out.items()
            if f.done()
            and not f.cancelled()
            and not f.exception()
            and f.result() is not False
            and not f.result().closed()
        )

    def direct_to(self) -> list[str]:
        """The peers the calling threads can write frames to directly now (see :meth:`send_now`)."""
        with self._lock:
            return sorted(a for a, d in self._direct.items() if d)

    async def _open(self, address: str):
        comm = await self._connect(address)
        if getattr(comm, "stream", None) is None:
            comm.abort()
            return False
        await comm.write({"op": HANDLER, "reply": False})
        return comm

    async def send(self, address: str, group: str, key: str, value) -> bool:
        """Write ``value`` (a contiguous array) to ``address`` as one frame; False where that
        peer takes messages only. Returns once the payload is in the socket's hands."""
        stream = await self.stream_to(address)
        if stream is None:
            return False
        head, payload = frame_header(group, key, value), memoryview(value).cast("B")
        try:
            if value.nbytes <= SMALL:
                done = stream.write(head + payload)
            else:  # two writes, no await between them: no other frame comes in between
                stream.write(head)
                done = stream.write(payload)
            await done
        except OSError:  # the stream broke: the next frame opens another
            self._drop(address)
            raise
        return True

    def send_now(self, address: str, group: str, key: str, value, timeout: float) -> bool:
        """Write ``value`` (a contiguous array of at most :data:`SMALL` bytes) to ``address`` as one
        frame from the calling thread, at most ``timeout`` seconds; False (nothing sent) where there
        is no socket for it yet, or none to be had (then one is opened in the background)."""
        with self._lock:
            direct = self._direct.get(address)
            if direct is None and address not in self._opening and self._loop is not None:
                self._opening.add(address)
                asyncio.run_coroutine_threadsafe(self._open_direct(address), self._loop)
        if not direct or value.nbytes > SMALL:
            return False
        sock, lock = direct
        data = frame_header(group, key, value) + memoryview(value).cast("B")
        with lock:  # whole frames: threads of two groups may write to one peer
            try:
                if sock.gettimeout() != timeout:
                    sock.settimeout(timeout)
                sock.sendall(data)
            except OSError:  # the socket broke or timed out (a frame may be cut short): the next opens another
                self._drop_direct(address, direct)
                raise
        return True

    async def _open_direct(self, address: str) -> None:
        """A comm to ``address``'s stream handler whose socket the sending threads then own."""
        direct: tuple | bool | None = None
        try:
            comm = await self._connect(address)
            stream = getattr(comm, "stream", None)
            if stream is None or isinstance(stream, SSLIOStream) or not isinstance(stream.socket, socket.socket):
                comm.abort()
                direct = False
                return
            await comm.write({"op": HANDLER, "reply": False, "direct": True})
            # the peer sends one byte once its reader owns the socket, nothing after: the loop lets go
            # of its descriptor (its reads and writes end there) and the connection lives on in ours
            sock = socket.socket(fileno=os.dup(stream.socket.fileno()))
            comm.abort()
            sock.setblocking(False)
            try:
                async with asyncio.timeout(ACK_SECONDS):
                    ack = await asyncio.get_running_loop().sock_recv(sock, 1)
            except BaseException:
                sock.close()
                raise
            if ack != ACK:  # the peer closed it: it reads no direct sockets (the loop sends it all)
                sock.close()
                direct = False
                return
            direct = (sock, threading.Lock())
        except OSError:  # not now (TimeoutError included): a later send tries again
            pass
        finally:
            with self._lock:
                self._opening.discard(address)
                if direct is not None:
                    self._direct[address] = direct

    def _drop_direct(self, address: str, direct: tuple) -> None:
        with self._lock:
            if self._direct.get(address) is direct:
                del self._direct[address]
        direct[0].close()

    def _drop(self, address: str) -> None:
        opening = self._out.pop(address, None)
        if opening is not None and opening.done() and not opening.cancelled() and not opening.exception():
            comm = opening.result()
            if comm is not False:
                comm.abort()

    async def read(self, comm, direct: bool = False) -> None:
        """Deliver every frame that arrives on ``comm`` until it closes (the stream handler); with
        ``direct`` (a peer's sending threads write to it) by a :class:`DirectReader` of its socket."""
        if direct:
            return self._read_direct(comm)
        stream = comm.stream
        try:
            while True:
                names, nbytes = HEADER.unpack(await stream.read_bytes(HEADER.size))
                group, key, dtype = _names(await stream.read_bytes(names))
                array = _target(self._into, group, key, dtype, nbytes)
                if nbytes:
                    await stream.read_into(memoryview(array).cast("B"))
                self._deliver(group, key, array)
        except (OSError, ValueError, UnicodeDecodeError):  # the peer went away, or sent garbage
            pass
        finally:
            comm.abort()

    def _read_direct(self, comm) -> None:
        stream = comm.stream
        sock = getattr(stream, "socket", None)
        if isinstance(stream, SSLIOStream) or not isinstance(sock, socket.socket):
            comm.abort()
            return
        # nothing came after the handler's message (the peer waits for our byte): the comm's buffer is
        # empty, and the socket is the reader's from here on
        sock = socket.socket(fileno=os.dup(sock.fileno()))
        comm.abort()
        sock.setblocking(False)
        try:
            sock.send(ACK)
        except OSError:
            sock.close()
            return
        self._incoming.add(DirectReader(sock, self._deliver, self._into, self._incoming.discard))

    def close(self) -> None:
        for reader in list(self._incoming):
            reader.close()
        for address, opening in list(self._out.items()):
            if not opening.done():
                opening.cancel()
            self._drop(address)
        with self._lock:
            direct, self._direct = self._direct, {}
        for found in direct.values():
            if found:
                found[0].close()


class DirectReader:
    """Frames of at most :data:`SMALL` bytes from a socket of its own, read by a callback of the event
    loop when the socket is readable (no coroutine, no stream buffer): each is copied once, from the
    reader's buffer into the array it arrives in, and delivered at once."""

    def __init__(self, sock: socket.socket, deliver: Callable, into: Callable, closed: Callable):
        self.sock, self._deliver, self._into, self._closed = sock, deliver, into, closed
        self.buffer = bytearray(2 * (HEADER.size + NAMES + SMALL))  # room for a whole frame and more
        self.view, self.end = memoryview(self.buffer), 0
        self.loop = asyncio.get_running_loop()
        self.loop.add_reader(sock.fileno(), self._readable)

    def _readable(self) -> None:
        try:
            n = self.sock.recv_into(self.view[self.end :])
            if n == 0:  # the peer closed it
                raise ConnectionResetError
            self.end += n
            self._frames()
        except BlockingIOError:
            pass
        except (OSError, ValueError, UnicodeDecodeError):  # the peer went away, or sent garbage
            self.close()

    def _frames(self) -> None:
        """Deliver the whole frames in the buffer; keep what is left of the next."""
        pos = 0
        while self.end - pos >= HEADER.size:
            names, nbytes = HEADER.unpack_from(self.buffer, pos)
            if names > NAMES or nbytes > SMALL:
                raise FrameError(f"a frame of {names} bytes of names and {nbytes} of payload on a direct socket")
            start = pos + HEADER.size + names
            if start + nbytes > self.end:
                break
            group, key, dtype = _names(bytes(self.view[pos + HEADER.size : start]))
            array = _target(self._into, group, key, dtype, nbytes)
            if nbytes:
                memoryview(array).cast("B")[:] = self.view[start : start + nbytes]
            self._deliver(group, key, array)
            pos = start + nbytes
        if pos:
            rest = self.end - pos
            if rest:  # the start of the next frame to the front (through a copy: the two may overlap)
                self.buffer[:rest] = bytes(self.view[pos : self.end])
            self.end = rest

    def close(self) -> None:
        if self.sock.fileno() >= 0:
            self.loop.remove_reader(self.sock.fileno())
            self.sock.close()
        self._closed(self)


def _target(into, group: str, key: str, dtype: np.dtype, nbytes: int) -> np.ndarray:
    """The array a frame's payload is read into: the one its receiver registered for it (``into``), or a
    fresh one; a FrameError for a dtype no array is sent in, or a payload that is not whole elements."""
    if dtype.kind not in KINDS or nbytes % dtype.itemsize:
        raise FrameError(f"a frame of {nbytes} bytes of {dtype} for {key!r}")
    array = into(group, key, dtype, nbytes)
    return np.empty(nbytes // dtype.itemsize, dtype) if array is None else array


def _names(raw: bytes) -> tuple[str, str, np.dtype]:
    parts = raw.decode().split("\0")
    if len(parts) != 3:
        raise FrameError(f"a frame header names {len(parts)} fields, not 3")
    with contextlib.suppress(TypeError):
        return parts[0], parts[1], np.dtype(parts[2])
    raise FrameError(f"a frame of unknown dtype {parts[2]!r}")
