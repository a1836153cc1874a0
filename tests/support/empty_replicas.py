"""A replica without examples in the last batch, on every input rank: the
cases `empty_replica_test.py` runs on 2 replicas and its child on 3.

The tutorial's classifier (Conv2D, Flatten, Dense) on 97 of the 8x8
digits, batch 8; and generated configurations (`configurations`) with
one axis set per input rank (2: dense, 3: sequence, 4: image) and step
(Keras's, one's own calling the model's layers one by one, one's own
calling a model with a nested encoder), the rest drawn, in float32
(oneDNN's kernels and graph rewrites, which float64 never reaches) and a
size whose last batch holds one example, for `fit()` with validation
data, `evaluate()` and `predict()`.
"""

import configurations
import keras
import numpy as np
from sklearn.datasets import load_digits

EXAMPLES, BATCH = 97, 8
TOLERANCE = {"float32": 1e-5, "float64": 1e-9}

RANK_KINDS = {2: "mlp", 3: "rnn", 4: "conv"}
STEPS = {
    "keras": {"override": "none"},
    "own_layers": {"override": "keras_io_steps", "calls": "layers"},
    "own_nested": {"override": "keras_io_steps", "calls": "model", "nested": True},
}
# The last batch holds one example: one replica of 2, or two of 3, get none.
SIZE = {2: 17, 3: 25}


def generated(replicas, every=True):
    """`{name: configuration}` of every rank and step, for `replicas`; not
    `every`: each rank with one step, each step with one rank (the
    suite's share on 3 replicas; a long check runs every one)."""
    return {
        f"rank{rank}-{step}": configurations.with_axes(
            700 + 10 * rank + index,
            kind=kind,
            size=SIZE[replicas],
            floatx="float32",
            validation=True,
            **axes,
        )
        for row, (rank, kind) in enumerate(RANK_KINDS.items())
        for index, (step, axes) in enumerate(STEPS.items())
        if every or index == row
    }


def classifier(model_class):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8, 8, 1))
    h = keras.layers.Conv2D(4, 3, activation="relu")(inputs)
    outputs = keras.layers.Dense(10)(keras.layers.Flatten()(h))
    model = model_class(inputs, outputs)
    model.compile(
        optimizer=keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def classifier_run(model_class, strategy, floatx):
    """The classifier's weights, history, `evaluate()` and `predict()`."""
    with configurations.computing_in(floatx):
        digits = load_digits()
        x = (digits.data[:EXAMPLES] / 16).reshape(-1, 8, 8, 1).astype(floatx)
        y = digits.target[:EXAMPLES].astype("int32")
        with strategy.scope():
            model = classifier(model_class)
        history = model.fit(
            x, y, batch_size=BATCH, epochs=2, verbose=0, validation_data=(x, y)
        )
        return {
            "weights": model.get_weights(),
            "history": [history.history[k] for k in sorted(history.history)],
            "evaluate": model.evaluate(x, y, batch_size=BATCH, verbose=0),
            "predict": model.predict(x, batch_size=BATCH, verbose=0),
        }


def largest_difference(expected, got):
    """The largest absolute difference between two `classifier_run`s."""

    def parts(value):
        return value if isinstance(value, list) else [value]

    return max(
        float(np.max(np.abs(np.asarray(a, "float64") - np.asarray(b, "float64"))))
        for part in expected
        for a, b in zip(parts(expected[part]), parts(got[part]), strict=True)
    )
