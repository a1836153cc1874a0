"""Local strategies for examples and scripts: GPUs, or logical CPU devices."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from keras_ctl import _checks
from keras_ctl.distribute import slurm
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
    import keras
    import keras_ctl

    strategy = keras_ctl.strategies.local_mirrored_strategy(2)  # first: sets up devices
    with strategy.scope():
        inputs = keras.Input((8, 8, 1))
        model = keras_ctl.CTLModel(inputs, keras.layers.Dense(10)(
            keras.layers.Flatten()(inputs)))
    print(strategy.num_replicas_in_sync)  # 2
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
    """Returns a `MultiWorkerMirroredStrategy` for the cluster in `TF_CONFIG`,
    or for the tasks of the Slurm step it runs in.

    Call it first in the script, before other TensorFlow calls (TensorFlow
    must configure its collectives before it starts). Under
    `python -m keras_ctl.launch`, `TF_CONFIG` names the local workers (a
    Kubernetes operator writes it in each pod too). Without `TF_CONFIG`,
    under `srun -n N python train.py` the N tasks are the workers, on the
    ports Slurm reserved for the step (`SLURM_STEP_RESV_PORTS`), else on
    8888 and up on each node; on GPU and CPU nodes alike.

    Returns:
        A `tf.distribute.MultiWorkerMirroredStrategy`.

    Raises:
        RuntimeError: if `TF_CONFIG` is not set and this is not a task of a
            Slurm step, or the step's variables are incomplete (naming the
            missing one).

    Example:

    ```python
    import keras
    import keras_ctl

    strategy = keras_ctl.strategies.multi_worker_strategy()  # first: reads TF_CONFIG
    (x, y), _ = keras_ctl.datasets.load("digits")
    with strategy.scope():
        inputs = keras.Input((8, 8, 1))
        model = keras_ctl.CTLModel(inputs, keras.layers.Dense(10)(
            keras.layers.Flatten()(inputs)))
        model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(
            from_logits=True))
    history = model.fit(x, y, batch_size=64, epochs=2)  # each worker its part
    print(history.history["loss"])  # the same on every worker: one device's
    ```
    """
    if os.environ.get("TF_CONFIG"):
        return tf.distribute.MultiWorkerMirroredStrategy()
    if slurm.in_step():
        resolver = slurm.cluster_resolver()
        return tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver)
    raise RuntimeError(
        "MultiWorkerMirroredStrategy needs the cluster in `TF_CONFIG` or a "
        "Slurm step. Received: no TF_CONFIG, and no SLURM_STEP_ID. Start the "
        "script with `python -m keras_ctl.launch --workers N -- python "
        "script.py`, with `srun -n N python script.py` under Slurm, or set "
        "TF_CONFIG on every machine."
    )


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
    # train.py
    import keras
    import tensorflow as tf
    import keras_ctl

    strategy = keras_ctl.strategies.parameter_server_strategy()  # first
    (x, y), _ = keras_ctl.datasets.load("digits")

    def dataset_fn(input_context):  # built on each worker
        return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(64)

    with strategy.scope():
        inputs = keras.Input((8, 8, 1))
        model = keras_ctl.CTLModel(inputs, keras.layers.Dense(10)(
            keras.layers.Flatten()(inputs)))  # or a GAN
        model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(
            from_logits=True))
    history = model.fit(dataset_fn, epochs=2, steps_per_epoch=10)
    print(history.history["loss"])
    ```

    ```bash
    keras-ctl launch --workers 1 --ps 1 -- python train.py
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
    if not keras_ctl.strategies.is_parameter_server(strategy):  # steps on workers
        model.fit(x, y, batch_size=64, validation_split=0.1)  # not available there
    ```
    """
    here: topology.Topology = topology.of(strategy)
    return here.parameter_servers


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
    history = model.fit(x, y, batch_size=64, epochs=1)
    if keras_ctl.strategies.is_chief(strategy):  # one copy, from the chief
        with open("history.json", "w") as f:
            json.dump(history.history, f)
    ```
    """
    here: topology.Topology = topology.of(strategy)
    return here.chief


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
    if keras_ctl.strategies.worker_count(strategy) > 1:
        print("training across processes")
    ```
    """
    here: topology.Topology = topology.of(strategy)
    return here.workers


def task_index() -> int:
    """This worker's index in the cluster of `TF_CONFIG`, or in the Slurm
    step it runs in (0 without either).

    Returns:
        `task.index` of `TF_CONFIG`, else `SLURM_PROCID` in a Slurm step
        (`srun`), else 0.

    Example:

    ```python
    index = keras_ctl.strategies.task_index()
    print(f"worker {index} of {keras_ctl.strategies.worker_count(strategy)}")
    ```
    """
    config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    if not config and slurm.in_step():
        return slurm.rank()
    return int(config.get("task", {}).get("index", 0))


def write_path(
    path: str | os.PathLike[str], strategy: tf.distribute.Strategy | None = None
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
    target = keras_ctl.strategies.write_path("weights.npz", strategy)
    np.savez(target, *model.get_weights())  # every worker writes
    if not keras_ctl.strategies.is_chief(strategy):
        os.remove(target)  # the other workers' temporary copies
    ```
    """
    if is_chief(strategy):
        return str(path)
    path = os.path.normpath(str(path))
    stem, extension = os.path.splitext(path)
    return f"{stem}_workertemp_{task_index()}{extension}"
