"""Worker-to-worker collectives over Dask's own comm, bootstrapped through Dask.

The pattern of Dask's P2P shuffle: a worker plugin registers handlers on every
worker, and ranks send each other arrays over Dask's own comms (so TLS comes for
free): one long-lived comm per peer, on which arrays travel as raw frames read
straight into where they are used (:mod:`workbench.cluster.collective.array_stream`); over a
comm without a byte stream (UCX, in-process) as messages to ``workbench_collective``
with the worker's pooled ``rpc``. NumPy arrays are never pickled. Small arrays go out from the
task's own thread, on a second comm per peer whose socket the sending threads own (plain TCP only).

On the client, :meth:`CollectiveGroup.create` fixes the ranks (the workers of a
run, in order) and a token unique to the run and its generation: two runs on one
cluster, or a run and its restart, never exchange a message. The group is plain
data; a task on a member worker turns it into that rank's communicator::

    group = CollectiveGroup.create(client, run="mlp", generation=0)
    def task(group, x):
        comm = communicator(group)          # this worker's rank
        handle = comm.start("grads", x)     # the transfer runs on the worker's event loop
        ...                                 # while this thread computes
        return handle.wait(timeout=30)      # x now holds the sum over the ranks
    futures = [client.submit(task, group, x, workers=[a]) for a in group.addresses]

With ``backend="nccl"`` (GPU workers, CuPy arrays) the same calls go through NCCL,
its unique id made on rank 0 and handed out in the group (see :mod:`workbench.cluster.collective.nccl`).
"""

from __future__ import annotations

import contextlib

import functools
import uuid
from dataclasses import dataclass

from distributed.comm import connect
from distributed.diagnostics.plugin import WorkerPlugin
from distributed.protocol import to_serialize

from workbench.cluster.collective import array_stream
from workbench.cluster.collective.array_stream import ArrayStreams
from workbench.cluster.collective.communicator import Communicator, Mailbox
from workbench.cluster.health import scheduler_workers
from workbench.cluster.malloc import reuse_freed_memory
from workbench.errors import ClusterError

NAME = "workbench-collective"
HANDLER = "workbench_collective"


@dataclass(frozen=True)
class CollectiveGroup:
    """Who takes part in a collective, and how: plain data, sent to each member's tasks.

    Attributes
    ----------
    token : str
        ``"<run>.<generation>"``; names every message of the group.
    addresses : tuple of str
        Member workers, in rank order.
    timeout : float
        Seconds a rank waits for any one peer before :class:`ClusterError`.
    algorithm : {"auto", "direct", "ring", "gather"}
        See :mod:`workbench.cluster.collective.communicator`.
    backend : {"dask", "nccl"}
    nccl_id : tuple
        NCCL's unique id (backend ``"nccl"`` only).
    """

    token: str
    addresses: tuple
    timeout: float = 60.0
    algorithm: str = "auto"
    backend: str = "dask"
    nccl_id: tuple = ()

    @classmethod
    def create(
        cls,
        client,
        workers=None,
        *,
        run: str | None = None,
        generation: int = 0,
        timeout: float = 60.0,
        algorithm: str = "auto",
        backend: str = "dask",
    ) -> CollectiveGroup:
        """A new group over ``workers`` (default: every worker of ``client``, sorted).

        Registers the plugin on the cluster (also on workers that join later).
        """
        addresses = tuple(workers) if workers else tuple(sorted(scheduler_workers(client, timeout)))
        if not addresses:
            raise ClusterError("a collective needs at least one worker; the cluster has none")
        if len(set(addresses)) != len(addresses):
            raise ClusterError(f"a worker may hold one rank only, got {list(addresses)}")
        if backend not in ("dask", "nccl"):
            raise ClusterError(f"unknown collective backend {backend!r}; use 'dask' or 'nccl'")
        client.register_plugin(CollectivePlugin())
        token = f"{run or uuid.uuid4().hex[:12]}-{uuid.uuid4().hex[:6]}.{int(generation)}"
        nccl_id: tuple = ()
        if backend == "nccl":
            from workbench.cluster.collective.nccl import unique_id

            nccl_id = tuple(client.submit(unique_id, workers=[addresses[0]], pure=False).result(timeout=timeout))
        return cls(token, addresses, float(timeout), algorithm, backend, nccl_id)

    @property
    def size(self) -> int:
        return len(self.addresses)

    def release(self, client, skip=(), timeout: float = 10.0) -> None:
        """Forget the group on its workers that are still there (dropping messages in flight);
        ``skip``: members known to have stopped answering. Bounded whatever the members and the scheduler do
        (nothing with a client that no longer runs: no scheduler to go through; the members' leases end it)."""
        if getattr(client, "status", "running") != "running":
            return
        alive = set(scheduler_workers(client, timeout))
        members = [a for a in self.addresses if a in alive and a not in skip]
        if members:
            with contextlib.suppress(TimeoutError, OSError):
                client.run(_release, self.token, workers=members, on_error="ignore", callback_timeout=5)


def _release(token: str, dask_worker=None) -> None:
    collectives = dask_worker.extensions.get(NAME)
    if collectives is not None:
        collectives.release(token)


def communicator(group: CollectiveGroup):
    """This worker's rank of ``group`` (call it inside a task on a member worker); made once per worker."""
    from distributed import get_worker

    try:
        worker = get_worker()
    except ValueError:
        raise ClusterError("communicator() runs inside a task on a worker of the group") from None
    collectives = worker.extensions.get(NAME)
    if collectives is None:
        raise ClusterError(
            f"worker {worker.address} lacks the collective plugin; create groups with CollectiveGroup.create"
        )
    return collectives.communicator(group)


class WorkerCollectives:
    """One worker's collectives: the mailbox where peers' arrays arrive, and its communicators by group."""

    def __init__(self, worker):
        self.worker = worker
        self.mailbox = Mailbox()
        self.communicators: dict[str, object] = {}
        self.streams = ArrayStreams(self._connect, self.mailbox.put, self.mailbox.destination, worker.loop.asyncio_loop)

    async def _connect(self, address: str):
        return await connect(address, **self.worker.connection_args)

    def receive(self, group: str, key: str, data) -> None:
        """The message handler: an array from a peer (runs on the worker's event loop)."""
        self.mailbox.put(group, key, data)

    async def receive_stream(self, comm, direct: bool = False) -> None:
        """The stream handler: the arrays a peer sends on a comm of its own, until it closes
        (``direct``: one its sending threads write to, read by the loop without a coroutine)."""
        await self.streams.read(comm, direct)

    async def send(self, group: CollectiveGroup, peer: int, key: str, value) -> None:
        address = group.addresses[peer]
        if await self.streams.send(address, group.token, key, value):
            return
        # as a message, with a reply: the comm hands our buffer to the socket without copying it, and
        # only the reply says the peer has it all, so the array is free to change after this returns
        await self.worker.rpc(address).workbench_collective(group=group.token, key=key, data=to_serialize(value))

    def send_now(self, group: CollectiveGroup, peer: int, key: str, value) -> bool:
        """A small array to ``peer`` from the calling thread (see :meth:`ArrayStreams.send_now`)."""
        return self.streams.send_now(group.addresses[peer], group.token, key, value, group.timeout)

    def communicator(self, group: CollectiveGroup):
        found = self.communicators.get(group.token)
        if found is not None:
            return found
        address = self.worker.address
        if address not in group.addresses:
            raise ClusterError(f"worker {address} is not in collective {group.token!r} ({list(group.addresses)})")
        rank = group.addresses.index(address)
        if group.backend == "nccl":
            from workbench.cluster.collective.nccl import NcclCommunicator

            found = NcclCommunicator(group.token, rank, group.addresses, group.nccl_id, group.timeout)
        else:
            found = Communicator(
                group.token,
                rank,
                group.addresses,
                functools.partial(self.send, group),
                self.mailbox,
                self.worker.loop.asyncio_loop,
                timeout=group.timeout,
                algorithm=group.algorithm,
                send_now=functools.partial(self.send_now, group),
            )
        self.communicators[group.token] = found
        return found

    def release(self, token: str) -> None:
        found = self.communicators.pop(token, None)
        if found is not None:
            found.close()
        else:
            self.mailbox.release(token)

    def close(self) -> None:
        """Close the streams to the peers (the worker is closing)."""
        self.streams.close()


class CollectivePlugin(WorkerPlugin):
    """Gives every worker its :class:`WorkerCollectives` and the handler peers send to.

    Registering it again (another client, another run) keeps what a worker already has. Also makes
    the worker reuse freed memory (:func:`~workbench.cluster.malloc.reuse_freed_memory`).
    """

    name = NAME
    idempotent = True

    def setup(self, worker):
        reuse_freed_memory()  # each message arrives in a fresh buffer: from the heap, not a fresh mmap
        collectives = worker.extensions.get(NAME)
        if collectives is None:
            collectives = worker.extensions[NAME] = WorkerCollectives(worker)
        worker.handlers[HANDLER] = collectives.receive
        worker.handlers[array_stream.HANDLER] = collectives.receive_stream

    def teardown(self, worker):
        collectives = worker.extensions.get(NAME)
        if collectives is not None:
            collectives.close()
