"""``tf.train``: the optimizers with TensorFlow 1.x's names and arguments, ``SyncReplicasOptimizer``
(meaning ``fit(replicas=..., backup_replicas=...)``), ``Saver``, and the distributed idioms that
workbench replaces (each raises, saying what to use)."""

from __future__ import annotations

import weakref

import numpy as np

from workbench import ops, optimizers
from workbench.errors import ArgumentError
from workbench.graph.core import Graph, Variable, get_default_graph
from workbench.tf1._common import unsupported


class _Tf1Optimizer:
    """``minimize(loss, global_step=None, var_list=None, name=None)`` and
    ``apply_gradients(grads_and_vars, global_step=None, name=None)``, as in TensorFlow 1.x:
    ``global_step`` (a variable) grows by one with each update."""

    _global_step: Variable | None = None

    def minimize(self, loss, global_step=None, var_list=None, gate_gradients=None, name=None, **kwargs):
        self._global_step = global_step
        try:
            return super().minimize(loss, var_list=var_list, name=name, **kwargs)
        finally:
            self._global_step = None

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        outer = self._global_step  # minimize's, when it calls this
        self._global_step = global_step if global_step is not None else outer
        try:
            return super().apply_gradients(grads_and_vars, name=name)
        finally:
            self._global_step = outer

    def _apply(self, grads_and_vars):
        updates = super()._apply(grads_and_vars)
        if self._global_step is not None:
            updates.append(ops.assign_add(self._global_step, 1))
        return updates


def _checked_name(use_locking, name, default):
    if use_locking:
        raise ArgumentError("use_locking=True has no meaning here: updates never race (one step at a time)")
    return name or default


class GradientDescentOptimizer(_Tf1Optimizer, optimizers.SGD):
    """``tf.train.GradientDescentOptimizer(learning_rate)``: :class:`workbench.optimizers.SGD`."""

    def __init__(self, learning_rate, use_locking=False, name="GradientDescent"):
        super().__init__(learning_rate, name=_checked_name(use_locking, name, "GradientDescent"))


class MomentumOptimizer(_Tf1Optimizer, optimizers.Momentum):
    """``tf.train.MomentumOptimizer(learning_rate, momentum, use_nesterov=False)``: :class:`~workbench.optimizers.Momentum`."""

    def __init__(self, learning_rate, momentum, use_locking=False, name="Momentum", use_nesterov=False):
        super().__init__(
            learning_rate, momentum=momentum, nesterov=use_nesterov, name=_checked_name(use_locking, name, "Momentum")
        )


class AdamOptimizer(_Tf1Optimizer, optimizers.Adam):
    """``tf.train.AdamOptimizer(learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-08)``: the same
    update as TensorFlow's (bias correction folded into the step size)."""

    def __init__(self, learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-08, use_locking=False, name="Adam"):
        super().__init__(
            learning_rate, beta1=beta1, beta2=beta2, epsilon=epsilon, name=_checked_name(use_locking, name, "Adam")
        )


# -- synchronous replicas ---------------------------------------------------------------

#: graph -> update op name -> the fit options its SyncReplicasOptimizer stands for
_FIT_OPTIONS: weakref.WeakKeyDictionary[Graph, dict[str, dict]] = weakref.WeakKeyDictionary()


def fit_options(train) -> dict:
    """The ``fit`` arguments (``replicas``, ``backup_replicas``) a SyncReplicasOptimizer gave ``train``."""
    return dict(_FIT_OPTIONS.get(train.graph, {}).get(train.name, {}))


class SyncReplicasOptimizer:
    """``tf.train.SyncReplicasOptimizer(opt, replicas_to_aggregate, total_num_replicas)``.

    In TensorFlow 1.x, ``total_num_replicas`` workers each compute gradients and the
    first ``replicas_to_aggregate`` are averaged (the rest are backups). Here that is
    ``sess.fit(train, ..., replicas=replicas_to_aggregate, backup_replicas=total_num_replicas -
    replicas_to_aggregate)`` on a cluster session: ``minimize`` returns the wrapped optimizer's
    update, and :class:`workbench.tf1.Session`'s ``fit`` uses these options when none are given
    (also :attr:`fit_options`). There are no parameter servers, queues, tokens or hooks to set up.
    """

    def __init__(self, opt, replicas_to_aggregate, total_num_replicas=None, variable_averages=None,
                 variables_to_average=None, use_locking=False, name="sync_replicas"):  # fmt: skip
        if variable_averages is not None or variables_to_average is not None:
            raise ArgumentError("SyncReplicasOptimizer: variable averages are not supported")
        total = replicas_to_aggregate if total_num_replicas is None else int(total_num_replicas)
        if replicas_to_aggregate < 1 or total < replicas_to_aggregate:
            raise ArgumentError(
                f"SyncReplicasOptimizer: need 1 <= replicas_to_aggregate ({replicas_to_aggregate}) "
                f"<= total_num_replicas ({total})"
            )
        self.optimizer = opt
        self.fit_options = {
            "replicas": int(replicas_to_aggregate),
            "backup_replicas": total - int(replicas_to_aggregate),
        }

    def compute_gradients(self, *args, **kwargs):
        return self.optimizer.compute_gradients(*args, **kwargs)

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        return self._record(self.optimizer.apply_gradients(grads_and_vars, global_step=global_step, name=name))

    def minimize(self, loss, global_step=None, var_list=None, name=None, **kwargs):
        return self._record(
            self.optimizer.minimize(loss, global_step=global_step, var_list=var_list, name=name, **kwargs)
        )

    def _record(self, update):
        _FIT_OPTIONS.setdefault(update.graph, {})[update.name] = dict(self.fit_options)
        return update

    def make_session_run_hook(self, *args, **kwargs):
        return unsupported("train.SyncReplicasOptimizer.make_session_run_hook", _USE_FIT)(*args, **kwargs)


# -- checkpoints ------------------------------------------------------------------------


class Saver:
    """``tf.train.Saver().save(sess, path)`` / ``.restore(sess, path)``: :meth:`Session.save` and
    :meth:`Session.restore` (one ``.npz`` file of every variable)."""

    def __init__(self, var_list=None, **kwargs):
        if var_list is not None:
            raise ArgumentError("tf.train.Saver: var_list is not supported; a checkpoint holds every variable")

    def save(self, sess, save_path, global_step=None, **kwargs) -> str:
        path = str(save_path) if global_step is None else f"{save_path}-{int(_value(sess, global_step))}"
        return sess.save(path if path.endswith(".npz") else path + ".npz")

    def restore(self, sess, save_path) -> None:
        path = str(save_path)
        sess.restore(path if path.endswith(".npz") else path + ".npz")


def _value(sess, step):
    return sess.run(step) if hasattr(step, "op") else step


_USE_FIT = (
    "create tf.Session(cluster='local' or 'tcp://scheduler:8786') and call sess.fit(train, data, batch_size, "
    "replicas=N, backup_replicas=B): the replicas, their placement and the gradient exchange are the fit's"
)
_NO_QUEUES = "feed NumPy arrays (sess.run(..., feed_dict=...)) or give sess.fit(train, data={...}) whole arrays (dask arrays on a cluster)"

_OTHER_OPTIMIZERS = (
    "workbench has SGD, Momentum (Nesterov too) and Adam: tf.train.GradientDescentOptimizer, MomentumOptimizer, "
    "AdamOptimizer"
)
RMSPropOptimizer = unsupported("train.RMSPropOptimizer", _OTHER_OPTIMIZERS)
AdagradOptimizer = unsupported("train.AdagradOptimizer", _OTHER_OPTIMIZERS)
AdadeltaOptimizer = unsupported("train.AdadeltaOptimizer", _OTHER_OPTIMIZERS)
FtrlOptimizer = unsupported("train.FtrlOptimizer", _OTHER_OPTIMIZERS)
_NO_SCHEDULES = (
    "learning rates are numbers here, not graph tensors: run fit() in segments with a new optimizer's rate, "
    "or compute the rate in Python for each sess.run"
)
exponential_decay = unsupported("train.exponential_decay", _NO_SCHEDULES)
piecewise_constant = unsupported("train.piecewise_constant", _NO_SCHEDULES)
polynomial_decay = unsupported("train.polynomial_decay", _NO_SCHEDULES)


def get_or_create_global_step(graph=None):
    """The graph's ``global_step`` variable (int64, not trainable), made at its first use; pass it to
    ``minimize(loss, global_step=...)`` to count updates."""
    graph = graph or get_default_graph()
    found = get_global_step(graph)
    if found is not None:
        return found
    with graph.as_default():
        return Variable(np.zeros((), dtype="int64"), name="global_step", trainable=False)


def get_global_step(graph=None):
    """The graph's ``global_step`` variable, or None."""
    graph = graph or get_default_graph()
    return next((v for v in graph.variables if v.name == "global_step"), None)


create_global_step = get_or_create_global_step

replica_device_setter = unsupported("train.replica_device_setter", _USE_FIT)
ClusterSpec = unsupported("train.ClusterSpec", _USE_FIT)
Server = unsupported("train.Server", _USE_FIT)
MonitoredTrainingSession = unsupported(
    "train.MonitoredTrainingSession", _USE_FIT + "; checkpoint_dir= and validation= are fit's too"
)
Supervisor = unsupported("train.Supervisor", _USE_FIT)
start_queue_runners = unsupported("train.start_queue_runners", _NO_QUEUES)
QueueRunner = unsupported("train.QueueRunner", _NO_QUEUES)
Coordinator = unsupported("train.Coordinator", _NO_QUEUES)
string_input_producer = unsupported("train.string_input_producer", _NO_QUEUES)
batch = unsupported("train.batch", _NO_QUEUES)
shuffle_batch = unsupported("train.shuffle_batch", _NO_QUEUES)
