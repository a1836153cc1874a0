"""Child process: the matrix of seeded random layers on N logical CPU
replicas (MirroredStrategy), or as one of the workers of a job
(`workers`: MultiWorkerMirroredStrategy, started by `keras-ctl launch`;
the chief writes the output), every layer in float64 and float32, on
static (48 examples) and dynamic (49) batches, in the default training
step or (`--own-step`) the keras.io guide's step of one's own, but for
the refusals that stop a running step (`random_layers.REFUSED_AS_IT_RUNS`):
such a step aborts the process's collectives, so each runs alone
(`NAME:EXAMPLES`). `--only NAME,NAME`: those layers.

Usage: python random_layers_child.py N|workers OUTPUT_JSON [--own-step]
    [--only NAMES] [NAME:EXAMPLES]
"""

import argparse
import json

import devices

parser = argparse.ArgumentParser()
parser.add_argument("where")
parser.add_argument("output")
parser.add_argument("alone", nargs="?")
parser.add_argument("--own-step", action="store_true")
parser.add_argument("--only")
args = parser.parse_args()
workers = args.where == "workers"
replicas = 1 if workers else int(args.where)
if not workers:
    devices.configure_logical_cpus(max(replicas, 2))

import random_layers  # noqa: E402
import tensorflow as tf  # noqa: E402

from keras_ctl.distribute import topology  # noqa: E402

strategy = tf.distribute.get_strategy()
if workers:
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
elif replicas > 1:
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(replicas)])
names = args.only.split(",") if args.only else sorted(random_layers.BUILDERS)
cases = [
    (name, dtype, examples)
    for name in names
    for dtype in random_layers.TOLERANCE
    for examples in (48, 49)
    if (name, examples) not in random_layers.REFUSED_AS_IT_RUNS
]
if args.alone:
    name, examples = args.alone.split(":")
    cases = [(name, "float32", int(examples))]
found = []
for name, dtype, examples in cases:
    expected, got = random_layers.check(
        name, dtype, examples, strategy, own_step=args.own_step
    )
    passed = random_layers.passed(expected, got)
    found.append([name, dtype, examples, expected, got, passed])
if topology.of(strategy).chief:
    with open(args.output, "w") as f:
        json.dump(found, f)
