"""The generated configurations that the drop-in issue reported, each a
failure before (crash, NaN or drift), compared with `keras.Model` on one
device."""

import configurations
import devices
import keras

from keras_ctl import CTLModel

# Configurations of `configurations.py`, each one a failure the
# drop-in issue reported (before: crash, NaN or drift).
REPORTED = {
    # Keras divides by the mask's sum: was 2.6e-2 off, on one device too.
    "ignore_class": {
        "loss": "sparse_ce_ignore",
        "reduction": "mean_with_sample_weight",
    },
    # A fully masked placeholder example: was NaN.
    "masked_empty_replica": {"kind": "masked_embedding", "size": 17},
    # Sparse gradient rows with an empty replica: was an index error.
    "adadelta_embedding": {
        "kind": "masked_embedding",
        "size": 17,
        "optimizer": "adadelta",
    },
    # Sparse gradient rows that change within one execution (8, 8, 1
    # examples in 3 steps, clipped as Keras clips the rows): was "Shape
    # mismatch in the collective instance" (generated seed 206).
    "sparse_rows_in_an_execution": {
        "kind": "masked_embedding",
        "size": 17,
        "steps_per_execution": 3,
        "dataset": True,
        "optimizer": "sgd",
        "options": {"clipnorm": 0.05},
    },
    # Unweighted scalar losses (one value per batch).
    "scalar_loss": {"loss": "scalar_loss", "size": 17},
    # SGD: Adam turns XLA's float64 round-off in near-zero gradients into
    # steps of 1e-8.
    "lstm_empty_replica": {
        "kind": "rnn",
        "size": 17,
        "jit_compile": True,
        "optimizer": "sgd",
    },
}

BASE = {
    "seed": 5,
    "kind": "mlp",
    "task": "classification",
    "loss": "sparse_ce",
    "reduction": "sum_over_batch_size",
    "weights": "none",
    "metrics": True,
    "optimizer": "adam",
    "options": {},
    "steps_per_execution": 1,
    "jit_compile": False,
    "dataset": False,
    "size": 25,
    "validation": True,
}


# XLA-compiling an LSTM takes the fast tier's budget: end to end.
SLOW = {"lstm_empty_replica"}


def difference(case, strategy):
    """`(largest difference, tolerance)` of case `case` under `strategy`
    (`"default"` or `"mirrored"`) against `keras.Model` on one device."""
    config = {**BASE, **REPORTED[case]}
    # Keras 3.15's `ignore_class` fails in float64 (a float32 mask).
    floatx = "float32" if case == "ignore_class" else "float64"
    expected = configurations.run(config, keras.Model, floatx=floatx)
    actual = configurations.run(config, CTLModel, devices.get(strategy), floatx=floatx)
    found = configurations.differences(expected, actual)
    # One device: Keras's own arithmetic; two replicas: round-off only.
    tolerance = 1e-12 if strategy == "default" else 1e-9
    if floatx == "float32":
        tolerance = 1e-5
    return max(found.values()), tolerance
