"""Scatters that an interrupt does not cut in half.

``Client.scatter`` cut short by ``KeyboardInterrupt`` (the notebook's interrupt) cancels the
client's wait, not the scheduler's work: the data still reaches the workers, the scheduler
records this client as wanting it, and no future exists that could ever release it, so the
workers keep that copy for as long as the client lives. :func:`scatter_whole` holds the first
SIGINT back until the scatter returns and then raises it: the futures exist, and dropping them
(the engines' ``close``) frees the workers. A second SIGINT interrupts at once, as anywhere.
"""

from __future__ import annotations

from workbench.fitloop import interrupts_at_step_boundaries


def scatter_whole(client, data, **kwargs):
    """``client.scatter(data, **kwargs)``, finished before an interrupt that came meanwhile is raised."""
    with interrupts_at_step_boundaries() as pending:
        placed = client.scatter(data, **kwargs)
    if pending():
        del placed  # nothing refers to the futures any more: the scheduler releases what they hold
        raise KeyboardInterrupt
    return placed
