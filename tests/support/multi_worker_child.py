"""One worker of a multi-worker test job (started by keras_ctl.launch).

Usage: python multi_worker_child.py OUTPUT_DIR CASE [CASE ...]

Writes OUTPUT_DIR/worker_<index>.json with the results of each case.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from keras_ctl import strategies  # noqa: E402

strategy = strategies.multi_worker_strategy()

import cases  # noqa: E402

output_dir, names = sys.argv[1], sys.argv[2:]
index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
results = {}
for name in names:
    if name == "gan":
        results[name] = cases.run_gan(strategy)
    elif name == "dataset_data_policy":
        results[name] = cases.run_dataset("uneven", strategy, "DATA")
    elif name == "uneven_spe4":  # logs reduced once per execution
        results[name] = cases.run("uneven", strategy=strategy, steps_per_execution=4)
    elif name == "predict":
        results[name] = cases.run_predict(strategy)
    else:
        results[name] = cases.run(name, strategy=strategy)
with open(os.path.join(output_dir, f"worker_{index}.json"), "w") as f:
    json.dump(results, f)
