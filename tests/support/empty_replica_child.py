"""Child process: the cases of `empty_replicas` under N replicas.

Usage: python empty_replica_child.py N OUTPUT_JSON [--every]

Writes `{case: [passed, differences]}`: the classifier in float32 and
float64, and the generated configurations (each rank with one step, or
`--every` rank and step).
"""

import json
import sys

import devices

replicas, output_path = int(sys.argv[1]), sys.argv[2]
every = "--every" in sys.argv[3:]
devices.configure_logical_cpus(replicas)

import configurations  # noqa: E402
import empty_replicas  # noqa: E402
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_ctl  # noqa: E402

strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(replicas)])
found = {}
for floatx, tolerance in empty_replicas.TOLERANCE.items():
    expected = empty_replicas.classifier_run(
        keras.Model, tf.distribute.get_strategy(), floatx
    )
    got = empty_replicas.classifier_run(keras_ctl.CTLModel, strategy, floatx)
    difference = empty_replicas.largest_difference(expected, got)
    found[f"classifier-{floatx}"] = [difference <= tolerance, difference]
for name, config in empty_replicas.generated(replicas, every).items():
    passed, differences = configurations.check(config, strategy)
    found[name] = [bool(passed), str(differences)]
with open(output_path, "w") as f:
    json.dump(found, f)
