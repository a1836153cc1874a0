"""Child process: runs every case under MirroredStrategy on N logical CPUs.

Usage: python replica_child.py N OUTPUT_JSON

One device set per process (collective keys collide otherwise), so each
replica count runs here, in a fresh interpreter.
"""

import json
import sys

import devices

replicas, output_path = int(sys.argv[1]), sys.argv[2]
devices.configure_logical_cpus(replicas)

import cases  # noqa: E402
import tensorflow as tf  # noqa: E402

strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(replicas)])
with open(output_path, "w") as f:
    json.dump(cases.run_all(strategy), f)
