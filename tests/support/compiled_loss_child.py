"""Child process: each loss of `compiled_losses` under N replicas against
one device, and the coupled one's refusal.

Usage: python compiled_loss_child.py N OUTPUT_JSON
"""

import json
import sys

import devices

replicas, output_path = int(sys.argv[1]), sys.argv[2]
devices.configure_logical_cpus(replicas)

import compiled_losses  # noqa: E402
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_ctl  # noqa: E402

strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(replicas)])
one_device = tf.distribute.get_strategy()
found = {}
for kind in compiled_losses.LOSSES:
    _, expected = compiled_losses.run(kind, keras.Model, one_device)
    _, got = compiled_losses.run(kind, keras_ctl.CTLModel, strategy)
    found[kind] = compiled_losses.largest_difference(expected, got)
try:
    compiled_losses.run("coupled", keras_ctl.CTLModel, strategy)
    found["coupled"] = "trained"
except ValueError as error:
    found["coupled"] = str(error)
with open(output_path, "w") as f:
    json.dump(found, f)
