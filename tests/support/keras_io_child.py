"""Child process: keras.io examples under MirroredStrategy on N logical
CPUs (N = 1: no strategy), each compared with keras.Model on one device,
or trained as written (`--as-written`: the problems found, none expected).

Usage: python keras_io_child.py N OUTPUT_JSON [--dtypes D ...]
           [--as-written] [--names NAME ...]
"""

import argparse
import json

import devices

parser = argparse.ArgumentParser()
parser.add_argument("replicas", type=int)
parser.add_argument("output")
parser.add_argument("--dtypes", nargs="+", default=["float64", "float32"])
parser.add_argument("--as-written", action="store_true")
parser.add_argument("--names", nargs="+")
arguments = parser.parse_args()
devices.configure_logical_cpus(max(arguments.replicas, 2))

import keras  # noqa: E402
import keras_io  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_ctl  # noqa: E402

strategy = tf.distribute.get_strategy()
if arguments.replicas > 1:
    devices_ = [f"/cpu:{i}" for i in range(arguments.replicas)]
    strategy = tf.distribute.MirroredStrategy(devices_)
if arguments.as_written:
    found = {}
    for name in arguments.names or keras_io.AS_WRITTEN:
        keras.utils.set_random_seed(1)
        got = keras_io.train(name, keras_ctl.CTLModel, strategy, parity=False)
        found[name] = keras_io.problems_as_written(name, got)
    for name in [] if arguments.names else keras_io.REFUSED_AS_WRITTEN:
        keras.utils.set_random_seed(1)
        found[name] = keras_io.refusal_as_written(name, strategy)
else:
    names = arguments.names or keras_io.EXACT
    found = keras_io.compare(names, strategy, arguments.dtypes)
with open(arguments.output, "w") as f:
    json.dump(found, f)
