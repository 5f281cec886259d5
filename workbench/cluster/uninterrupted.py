"""Client calls that an interrupt does not cut in half.

``KeyboardInterrupt`` (the notebook's interrupt) in the middle of a ``distributed`` call cancels
the client's wait, not always cleanly:

- ``Client.scatter`` cut short cancels the client's wait, not the scheduler's work: the data
  still reaches the workers, the scheduler records this client as wanting it, and no future
  exists that could ever release it, so the workers keep that copy for as long as the client lives;
- ``Future.result`` cut short cancels the client's batched gather that other results attach to:
  the next results fetched (the next fit's) fail with ``UnboundLocalError`` from ``sync``.

Both hold the first SIGINT back until the call returns, then raise it: the futures exist and the
client is whole, and dropping the futures (the engines' ``close``) frees the workers. A second
SIGINT interrupts at once, as anywhere. Waiting for a result to be ready is not held back
(``distributed.wait`` is safe to interrupt); only fetching it is.
"""

from __future__ import annotations

from workbench.fitloop import interrupts_at_step_boundaries


def scatter_whole(client, data, **kwargs):
    """``client.scatter(data, **kwargs)``, finished before an interrupt that came meanwhile is raised."""
    with interrupts_at_step_boundaries() as pending:
        try:
            return client.scatter(data, **kwargs)
        finally:
            if pending():
                raise KeyboardInterrupt  # the futures made go with this frame: the scheduler releases them


def results_whole(futures, timeout: float | None = None) -> list:
    """``[f.result(timeout) for f in futures]``, fetched before an interrupt that came meanwhile is raised
    (wait for the futures to finish first, with ``distributed.wait``: that wait may be interrupted)."""
    with interrupts_at_step_boundaries() as pending:
        try:
            return [future.result(timeout=timeout) for future in futures]
        finally:
            if pending():
                raise KeyboardInterrupt
