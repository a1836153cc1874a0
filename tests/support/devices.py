"""Strategies built once per process (one device set per process).

`conftest.py` splits the CPU into `LOGICAL_CPUS` logical devices before
TensorFlow starts. Two `MirroredStrategy` objects over different device sets
in one process collide on collective keys, so this process uses a single
mirrored device set; other replica counts run in child processes.
"""

import functools
import os

LOGICAL_CPUS = 4
IN_PROCESS_REPLICAS = 2


def configure_logical_cpus(count=LOGICAL_CPUS):
    """Splits the first CPU into `count` logical devices (before TF starts)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * count
    )


@functools.cache
def get(kind):
    """Returns the process-wide strategy of `kind`."""
    import tensorflow as tf

    if kind == "default":
        return tf.distribute.get_strategy()
    if kind == "onedevice":
        return tf.distribute.OneDeviceStrategy("/cpu:0")
    if kind == "mirrored":
        devices = [f"/cpu:{i}" for i in range(IN_PROCESS_REPLICAS)]
        return tf.distribute.MirroredStrategy(devices)
    if kind == "centralstorage":
        devices = [f"/cpu:{i}" for i in range(IN_PROCESS_REPLICAS)]
        return tf.distribute.experimental.CentralStorageStrategy(devices)
    raise ValueError(f"Unknown strategy kind: {kind}")
