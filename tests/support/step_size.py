"""The size of a traced train function: its ops (the graph and its
function library, every branch) and its collectives, for `keras.Model` and
`CTLModel` on the same model (issue: the exact step at Keras's size).

The models are the ones the benchmarks time: an MLP (784-64-64-10, Adam,
accuracy), a CNN (conv 32-64, dense 64), one transformer block (attention
of 4 heads of 16, a feed-forward of 128) and the MLP with Dropout.
"""

import collections

import keras
import numpy as np

import keras_ctl
from keras_ctl.demos import models

MODELS = ("mlp", "cnn", "transformer_block", "mlp_dropout")
COLLECTIVES = ("CollectiveReduceV2", "CollectiveGatherV2", "CollectiveAllToAllV2")


def _layers(name):
    if name == "cnn":
        inputs = keras.Input((28, 28, 1))
        h = keras.layers.Conv2D(32, 3, activation="relu")(inputs)
        h = keras.layers.MaxPooling2D()(h)
        h = keras.layers.Conv2D(64, 3, activation="relu")(h)
        h = keras.layers.GlobalAveragePooling2D()(h)
        h = keras.layers.Dense(64, activation="relu")(h)
    elif name == "transformer_block":
        block = models.transformer_block(keras.Model)
        return block.inputs[0], block.outputs[0]
    else:
        inputs = keras.Input((784,))
        h = keras.layers.Dense(64, activation="relu")(inputs)
        if name == "mlp_dropout":
            h = keras.layers.Dropout(0.2, seed=1)(h)
        h = keras.layers.Dense(64, activation="relu")(h)
    return inputs, keras.layers.Dense(10)(h)


def _data(name, rows=64):
    rng = np.random.default_rng(0)
    shape = {"cnn": (28, 28, 1), "transformer_block": (16, 64)}.get(name, (784,))
    return rng.random((rows, *shape), dtype="float32"), rng.integers(0, 10, rows)


def trained(name, model_class, strategy, rows=64, optimizer=None, **compile_options):
    """`model_class` of model `name`, compiled (Adam, or `optimizer`'s
    options to Adam, and `compile_options`) and fit on `rows` examples in
    batches of 32: 2 steps of 32 by default."""
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = model_class(*_layers(name))
        model.compile(
            keras.optimizers.Adam(1e-3, **(optimizer or {})),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
            **compile_options,
        )
    x, y = _data(name, rows)
    model.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
    return model


def train_graph(model):
    """The graph of `model`'s traced train function."""
    if isinstance(model, keras_ctl.CTLModel):
        return model.train_function.graphs()[0].as_graph_def()
    # Keras wraps its `tf.function`s in plain functions: the traced one
    # (one step, or several a call; Keras 3.16 keeps both) is found in
    # their closures.
    functions, seen = [model.train_function], set()
    while functions:
        function = functions.pop(0)
        if id(function) in seen:
            continue
        seen.add(id(function))
        if hasattr(function, "_list_all_concrete_functions"):
            traced = [
                f.graph.as_graph_def() for f in function._list_all_concrete_functions()
            ]
            if traced:
                # Keras 3.16 traces a partial last batch again, with the
                # batch's size relaxed: the general trace is the largest.
                return max(traced, key=lambda graph: sum(op_counts(graph).values()))
            function = function.python_function
        cells = getattr(function, "__closure__", None) or ()
        functions += [c.cell_contents for c in cells if callable(c.cell_contents)]
    raise RuntimeError("Keras's train function holds no tf.function")


def op_counts(graph_def):
    """`Counter` of op types in `graph_def` and its function library."""
    counts = collections.Counter(node.op for node in graph_def.node)
    for function in graph_def.library.function:
        counts.update(node.op for node in function.node_def)
    return counts


def size(name, strategy, rows=64):
    """`{"keras": (ops, collectives), "ctl": (ops, collectives)}` of model
    `name` under `strategy`, fit on `rows` examples."""
    return {
        key: size_of(trained(name, model_class, strategy, rows))
        for key, model_class in (("keras", keras.Model), ("ctl", keras_ctl.CTLModel))
    }


def size_of(model):
    """`(ops, collectives)` of `model`'s traced train function."""
    counts = op_counts(train_graph(model))
    return sum(counts.values()), sum(counts[op] for op in COLLECTIVES)
