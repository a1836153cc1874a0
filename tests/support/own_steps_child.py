"""Child process: every step of `own_steps` under MirroredStrategy on N
logical CPUs, each compared with keras.Model on one device.

Usage: python own_steps_child.py N OUTPUT_JSON
"""

import json
import sys

import devices

replicas, output_path = int(sys.argv[1]), sys.argv[2]
devices.configure_logical_cpus(replicas)

import generated_steps  # noqa: E402
import keras  # noqa: E402
import own_steps  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_ctl  # noqa: E402

strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(replicas)])
one_device = tf.distribute.get_strategy()
found = {
    case: generated_steps.largest_difference(
        own_steps.run(case, keras_ctl.CTLModel, strategy),
        own_steps.run(case, keras.Model, one_device),
    )
    for case in own_steps.CASES
}
with open(output_path, "w") as f:
    json.dump(found, f)
