"""Local strategies for examples and scripts: GPUs, or logical CPU devices."""

import tensorflow as tf


def local_mirrored_strategy(replicas):
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
    if not isinstance(replicas, int) or replicas < 1:
        raise ValueError(f"Expected `replicas` >= 1. Received: replicas={replicas!r}.")
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
