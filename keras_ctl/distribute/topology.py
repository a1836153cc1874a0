"""What a `tf.distribute` strategy is, decided in one place: how many
replicas and processes train together, whether this process is the chief,
and where the variables live. Everything else asks here instead of testing
strategy classes."""

import dataclasses

import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class Topology:
    """Attributes:
    replicas: Replicas in sync (all processes).
    workers: Processes that train together (1 without a cluster).
    chief: Whether this process writes the user's files.
    parameter_servers: Variables live on parameter servers; this process
        schedules steps on workers (`ParameterServerStrategy`).
    one_copy: One copy of each variable, which replica updates reach
        through `merge_call` (`CentralStorageStrategy`).
    """

    replicas: int
    workers: int
    chief: bool
    parameter_servers: bool
    one_copy: bool


def of(strategy=None):
    """The `Topology` of `strategy` (default: the current strategy)."""
    strategy = strategy or tf.distribute.get_strategy()
    multi_worker = isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
    resolver = getattr(strategy, "cluster_resolver", None) if multi_worker else None
    cluster = resolver.cluster_spec().as_dict() if resolver else {}
    return Topology(
        replicas=strategy.num_replicas_in_sync,
        workers=max(1, len(cluster.get("worker", [])) + len(cluster.get("chief", []))),
        chief=_is_chief(resolver, cluster),
        parameter_servers=isinstance(strategy, tf.distribute.ParameterServerStrategy),
        one_copy=isinstance(
            strategy, tf.distribute.experimental.CentralStorageStrategy
        ),
    )


def _is_chief(resolver, cluster):
    # The `chief` task, or worker 0 when the cluster has none.
    if not cluster or resolver.task_type == "chief":
        return True
    return (
        resolver.task_type == "worker"
        and resolver.task_id == 0
        and "chief" not in cluster
    )


def needs_equal_shapes(strategy=None):
    """Whether every replica's tensors must have one shape (XLA on TPUs):
    rows that differ in number from replica to replica cannot be gathered."""
    strategy = strategy or tf.distribute.get_strategy()
    return isinstance(
        strategy, (tf.distribute.TPUStrategy, tf.distribute.experimental.TPUStrategy)
    )
