"""Child process: prints, as JSON, the message a case of `named_errors`
stops with on 2 logical CPU replicas (MirroredStrategy).

Usage: python named_errors_child.py CASE EXAMPLES DATA
"""

import json
import sys

import devices

devices.configure_logical_cpus(2)

import named_errors  # noqa: E402
import tensorflow as tf  # noqa: E402

case, examples, data = sys.argv[1], int(sys.argv[2]), sys.argv[3]
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
print(json.dumps(named_errors.message(case, strategy, examples, data)))
