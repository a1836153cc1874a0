"""Child process: the matrix of seeded random layers on N logical CPU
replicas (MirroredStrategy), every layer in float64 and float32, on static
(48 examples) and dynamic (49) batches, but for the refusals that stop a
running step (`random_layers.REFUSED_AS_IT_RUNS`): such a step aborts the
process's collectives, so each runs alone (`NAME:EXAMPLES`).

Usage: python random_layers_child.py N OUTPUT_JSON [NAME:EXAMPLES ...]
"""

import json
import sys

import devices

replicas, output = int(sys.argv[1]), sys.argv[2]
devices.configure_logical_cpus(max(replicas, 2))

import random_layers  # noqa: E402
import tensorflow as tf  # noqa: E402

strategy = tf.distribute.get_strategy()
if replicas > 1:
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(replicas)])
cases = [
    (name, dtype, examples)
    for name in sorted(random_layers.BUILDERS)
    for dtype in random_layers.TOLERANCE
    for examples in (48, 49)
    if (name, examples) not in random_layers.REFUSED_AS_IT_RUNS
]
if sys.argv[3:]:
    name, examples = sys.argv[3].split(":")
    cases = [(name, "float32", int(examples))]
found = []
for name, dtype, examples in cases:
    expected, got = random_layers.check(name, dtype, examples, strategy)
    passed = random_layers.passed(expected, got)
    found.append([name, dtype, examples, expected, got, passed])
with open(output, "w") as f:
    json.dump(found, f)
