"""``tf.Session`` and ``tf.InteractiveSession``: :class:`workbench.Session` with TensorFlow 1.x's arguments."""

from __future__ import annotations

from workbench.errors import ArgumentError
from workbench.graph import default_session
from workbench.session import Session as _Session
from workbench.tf1._common import UnsupportedError
from workbench.tf1.train import fit_options


class Session(_Session):
    """``tf.Session(target="", graph=None, config=None)``: a :class:`workbench.Session`.

    ``target`` may be ``"local"`` or a Dask scheduler address (``"tcp://host:8786"``), where
    :meth:`fit` trains data-parallel; TensorFlow's ``grpc://`` servers have no equivalent.
    ``with tf.Session() as sess:`` makes it the default session (for ``Tensor.eval()`` and
    ``Operation.run()``) and closes it at the end. Keyword arguments of
    :class:`workbench.Session` (``seed``, ``cluster``, ``device``) are taken too.
    """

    def __init__(self, target="", graph=None, config=None, **kwargs):
        if target:
            if str(target).startswith("grpc://"):
                raise UnsupportedError(
                    f"tf.Session({target!r}): TensorFlow servers have no equivalent; give a Dask scheduler address "
                    "(tf.Session('tcp://host:8786')) or 'local', and train with sess.fit(..., replicas=N)"
                )
            if "cluster" in kwargs:
                raise ArgumentError("give the cluster as target or as cluster=, not both")
            kwargs["cluster"] = target
        super().__init__(graph, **kwargs)

    def run(self, fetches, feed_dict=None, options=None, run_metadata=None, **kwargs):
        """``sess.run(fetches, feed_dict)``; ``options`` and ``run_metadata`` (tracing) are not supported:
        the session's event stream and ``wb.widgets.TimelineView`` show what ran and when."""
        if options is not None or run_metadata is not None:
            raise UnsupportedError(
                "sess.run(options=, run_metadata=): tracing is not supported; fit() records per-step times "
                "(History) and a cluster fit's spans (TimelineView)"
            )
        return super().run(fetches, feed_dict=feed_dict, **kwargs)

    def fit(self, train, data, batch_size, **kwargs):
        """:meth:`workbench.Session.fit`, with a ``SyncReplicasOptimizer``'s ``replicas`` and
        ``backup_replicas`` when the call does not give them (and the session has a cluster)."""
        if self.client is not None:
            for key, value in fit_options(self.graph.get(train) if isinstance(train, str) else train).items():
                kwargs.setdefault(key, value)
        return super().fit(train, data, batch_size, **kwargs)


class InteractiveSession(Session):
    """A session that makes itself the default when created (until :meth:`close`), for notebooks:
    ``accuracy.eval(feed_dict=...)`` and ``train_step.run(feed_dict=...)`` need no ``with`` block."""

    def __init__(self, target="", graph=None, config=None, **kwargs):
        super().__init__(target, graph, config, **kwargs)
        default_session.push(self)

    def close(self) -> None:
        default_session.remove(self)
        super().close()
