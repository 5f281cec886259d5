"""Distributed strategies written as graph: what a replica does with its gradients.

A strategy is a function of ``r``, the replica context (:mod:`workbench.strategies.context`), that
builds one replica's update: ``r.gradients``, ``r.weight``, ``r.variables``, ``r.apply``,
``r.assign``, ``with r.every(k):``, ``r.slot`` and the collective ops (``wb.all_reduce``,
``wb.all_gather``, ``wb.broadcast``). Register one with :func:`strategy`; the built-ins
(:mod:`workbench.strategies.builtins`) are ``"allreduce"``, :func:`local_sgd`, :func:`diloco`
and :func:`compressed`. ``Session.fit(..., replicas=R, strategy=...)`` without a cluster runs
the R replicas in one process (:mod:`workbench.simulation`); :func:`strategy_graph` shows one
replica's program.
"""

from workbench.strategies.builtins import allreduce, compressed, diloco, local_sgd
from workbench.strategies.context import ReplicaContext
from workbench.strategies.program import ReplicaProgram, strategy_graph
from workbench.strategies.registry import Strategy, is_strategy, names, resolve, strategy

__all__ = [
    "ReplicaContext",
    "ReplicaProgram",
    "Strategy",
    "allreduce",
    "compressed",
    "diloco",
    "is_strategy",
    "local_sgd",
    "names",
    "resolve",
    "strategy",
    "strategy_graph",
]
