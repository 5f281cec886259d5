"""The default session: what ``Tensor.eval()`` and ``Operation.run()`` run in.

A session becomes the default inside ``with sess.as_default():`` and ``with sess:``;
``workbench.tf1.InteractiveSession`` is the default from its creation until it closes.
The stack is per thread, as in TensorFlow 1.x.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from workbench.errors import GraphError

_local = threading.local()


def _stack() -> list:
    if not hasattr(_local, "sessions"):
        _local.sessions = []
    return _local.sessions


def get_default_session() -> Any | None:
    """The innermost default session of this thread, or None."""
    stack = _stack()
    return stack[-1] if stack else None


def push(session) -> None:
    _stack().append(session)


def remove(session) -> None:
    """Take ``session`` off this thread's stack (wherever it is; nothing if it is not there)."""
    stack = _stack()
    for i in range(len(stack) - 1, -1, -1):
        if stack[i] is session:
            del stack[i]
            return


@contextlib.contextmanager
def as_default(session) -> Iterator[Any]:
    push(session)
    try:
        yield session
    finally:
        remove(session)


def running_session(session, what: str):
    """``session``, else the default session, else a GraphError saying how to get one."""
    if session is not None:
        return session
    found = get_default_session()
    if found is None:
        raise GraphError(
            f"{what} needs a session: run it inside 'with sess.as_default():' or 'with wb.Session(g) as sess:', "
            "create a workbench.tf1.InteractiveSession(), or pass session=sess"
        )
    return found
