"""Local strategies for examples and scripts: GPUs, or logical CPU devices."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from keras_ctl import _checks
from keras_ctl.distribute import topology


def local_mirrored_strategy(replicas: int) -> tf.distribute.MirroredStrategy:
    """Returns a `MirroredStrategy` with `replicas` replicas on this machine.

    Uses the first `replicas` GPUs when there are enough; otherwise splits
    the CPU into `replicas` logical devices, which only works before
    TensorFlow has initialized its devices (call this first). Create it once
    per process and reuse it: two strategies over different device sets
    collide on collective keys.

    Args:
        replicas: Number of replicas, >= 1.

    Returns:
        A `tf.distribute.MirroredStrategy`.

    Raises:
        ValueError: if `replicas` < 1.
        RuntimeError: if the CPU devices were initialized already with too
            few logical devices.

    Example:

    ```python
    strategy = keras_ctl.strategies.local_mirrored_strategy(2)
    with strategy.scope():
        model = build_model()
    ```
    """
    _checks.positive_int("replicas", replicas)
    gpus = tf.config.list_physical_devices("GPU")
    if len(gpus) >= replicas:
        return tf.distribute.MirroredStrategy([f"/gpu:{i}" for i in range(replicas)])
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * replicas
        )
    except RuntimeError as error:
        available = len(tf.config.list_logical_devices("CPU"))
        if available < replicas:
            raise RuntimeError(
                f"TensorFlow already started with {available} CPU device(s), "
                f"so {replicas} replicas cannot be made. Received: "
                f"replicas={replicas}. Create the strategy before any other "
                "TensorFlow call, or use fewer replicas."
            ) from error
    return tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(replicas)])


def multi_worker_strategy() -> tf.distribute.MultiWorkerMirroredStrategy:
    """Returns a `MultiWorkerMirroredStrategy` for the cluster in `TF_CONFIG`.

    Call it first in the script, before other TensorFlow calls (TensorFlow
    must configure its collectives before it starts). Under
    `python -m keras_ctl.launch`, `TF_CONFIG` names the local workers.

    Returns:
        A `tf.distribute.MultiWorkerMirroredStrategy`.

    Raises:
        RuntimeError: if `TF_CONFIG` is not set.

    Example:

    ```python
    strategy = keras_ctl.strategies.multi_worker_strategy()
    with strategy.scope():
        model = build_and_compile_model()
    model.fit(dataset, epochs=3)
    ```
    """
    if not os.environ.get("TF_CONFIG"):
        raise RuntimeError(
            "MultiWorkerMirroredStrategy needs the cluster in `TF_CONFIG`. "
            "Received: no TF_CONFIG. Start the script with "
            "`python -m keras_ctl.launch --workers N -- python script.py`, "
            "or set TF_CONFIG on every machine."
        )
    return tf.distribute.MultiWorkerMirroredStrategy()


def parameter_server_strategy(
    variable_partitioner: Callable[..., Any] | None = None,
) -> tf.distribute.ParameterServerStrategy:
    """Returns a `ParameterServerStrategy` for the cluster in `TF_CONFIG`.

    Run it in the chief (the coordinator), e.g. under `python -m
    keras_ctl.launch --workers N --ps M -- python script.py`, which starts
    the parameter servers and workers. `CTLModel.fit()` then schedules its
    steps on the workers.

    Args:
        variable_partitioner: Shards large variables across the parameter
            servers, e.g. `tf.distribute.experimental.partitioners.
            MinSizePartitioner(min_shard_bytes=256 << 10, max_shards=M)`.

    Returns:
        A `tf.distribute.ParameterServerStrategy`.

    Raises:
        RuntimeError: if `TF_CONFIG` names no parameter server and worker.

    Example:

    ```python
    strategy = keras_ctl.strategies.parameter_server_strategy()  # first
    with strategy.scope():
        model = build_and_compile()  # a CTLModel or GAN
    model.fit(dataset_fn, epochs=5, steps_per_epoch=20)
    ```
    """
    cluster = json.loads(os.environ.get("TF_CONFIG") or "{}").get("cluster", {})
    if not cluster.get("ps") or not cluster.get("worker"):
        raise RuntimeError(
            "ParameterServerStrategy needs parameter servers and workers in "
            f"`TF_CONFIG`. Received: cluster={cluster!r}. Start the script "
            "with `python -m keras_ctl.launch --workers N --ps M -- python "
            "script.py`, or set TF_CONFIG on every machine."
        )
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    return tf.distribute.ParameterServerStrategy(
        resolver, variable_partitioner=variable_partitioner
    )


def is_parameter_server(strategy: tf.distribute.Strategy | None = None) -> bool:
    """Whether `strategy` is a `ParameterServerStrategy` (steps run on
    workers, scheduled by this process).

    Args:
        strategy: A `tf.distribute.Strategy`. Defaults to the current one.

    Returns:
        `True` under parameter servers.

    Example:

    ```python
    if not keras_ctl.strategies.is_parameter_server(strategy):
        model.fit(x, y, validation_split=0.1)  # not taken with parameter servers
    ```
    """
    return topology.of(strategy).parameter_servers


def is_chief(strategy: tf.distribute.Strategy | None = None) -> bool:
    """Returns whether this process should write checkpoints and models.

    True for a single process and for the chief of a multi-worker cluster
    (the `chief` task, or worker 0 when there is none). The TensorFlow
    convention: every worker saves, the chief to the real path, the others
    to a temporary one they delete.

    Args:
        strategy: The strategy in use. Defaults to the current one.

    Returns:
        `True` on the chief (and without a cluster).

    Example:

    ```python
    path = "model.keras" if keras_ctl.strategies.is_chief() else tmp_path
    model.save(path)
    ```
    """
    return topology.of(strategy).chief


def worker_count(strategy: tf.distribute.Strategy | None = None) -> int:
    """Returns how many processes train together under `strategy`.

    1 for a single process; the chief and the workers of a
    `MultiWorkerMirroredStrategy` cluster.

    Args:
        strategy: The strategy in use. Defaults to the current one.

    Returns:
        The number of worker processes (1 without a cluster).

    Example:

    ```python
    if keras_ctl.strategies.worker_count() > 1:
        print("training across processes")
    ```
    """
    return topology.of(strategy).workers


def task_index() -> int:
    """This worker's index in the cluster of `TF_CONFIG` (0 without one).

    Returns:
        `task.index` of `TF_CONFIG`, or 0.

    Example:

    ```python
    keras.utils.set_random_seed(keras_ctl.strategies.task_index())
    ```
    """
    config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    return int(config.get("task", {}).get("index", 0))


def write_path(
    path: str | os.PathLike, strategy: tf.distribute.Strategy | None = None
) -> str:
    """Where this worker writes the file or folder `path`.

    The TensorFlow multi-worker convention: every worker writes (saving
    takes part in collectives), the chief to `path`, every other worker to a
    temporary sibling, `<path>_workertemp_<index>`, that it deletes after.

    Args:
        path: The file or folder the chief writes.
        strategy: The strategy in use. Defaults to the current one.

    Returns:
        `path` on the chief, the temporary sibling on the other workers.

    Example:

    ```python
    target = keras_ctl.strategies.write_path("model.keras")
    model.save(target)
    if not keras_ctl.strategies.is_chief():
        os.remove(target)
    ```
    """
    if is_chief(strategy):
        return str(path)
    path = os.path.normpath(str(path))
    stem, extension = os.path.splitext(path)
    return f"{stem}_workertemp_{task_index()}{extension}"
