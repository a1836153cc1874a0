"""Child process: the exact keras.io examples under MirroredStrategy on N
logical CPUs, each compared with keras.Model on one device.

Usage: python keras_io_child.py N OUTPUT_JSON
"""

import json
import sys

import devices

replicas, output_path = int(sys.argv[1]), sys.argv[2]
devices.configure_logical_cpus(replicas)

import keras_io  # noqa: E402
import tensorflow as tf  # noqa: E402

strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(replicas)])
with open(output_path, "w") as f:
    json.dump(keras_io.compare(keras_io.EXACT, strategy), f)
