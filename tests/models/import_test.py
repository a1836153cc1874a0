"""Importing keras_ctl changes nothing of Keras: every function and class
attribute of every Keras module loaded before is the same object after
`import keras_ctl`, and a plain `keras.Model` trains bit for bit as without
it. Keras's behaviour changes only inside keras_ctl's replica steps, which
install every patch of `steps.PATCHES` they need."""

import json

import children

SNAPSHOT = """
import json
import sys

import keras
import tensorflow


def snapshot():
    seen = {}
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "keras" or name.startswith("keras.")):
            continue
        seen[name] = id(module)
        for attr, value in list(vars(module).items()):
            if callable(value):
                seen[f"{name}.{attr}"] = id(value)
            if isinstance(value, type) and value.__module__ == name:
                seen[f"{name}.{attr}"] = id(value)
                for key, member in list(vars(value).items()):
                    seen[f"{name}.{attr}.{key}"] = id(member)
    return seen


def changed(before, after):
    # Keys changed, or added to a module or class that existed before.
    return sorted(
        key
        for key, value in after.items()
        if before.get(key) != value and key.rsplit(".", 1)[0] in before
    )


before = snapshot()
import keras_ctl  # noqa: E402,F401

imported = snapshot()
with keras_ctl._keras.replica_step():
    in_step = snapshot()
print(json.dumps({
    "checked": len(before),
    "changed": changed(before, imported),
    "in_step": changed(imported, in_step),
}))
"""

TRAIN = """
import sys

import numpy as np
import keras

if sys.argv[1] == "with":
    import keras_ctl  # noqa: F401

keras.utils.set_random_seed(0)
inputs = keras.Input((6,))
hidden = keras.layers.Dense(8, activation="relu")(inputs)
model = keras.Model(inputs, keras.layers.Dense(3)(hidden))
model.compile(
    optimizer="adam",
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    metrics=["accuracy"],
)
rng = np.random.default_rng(0)
x, y = rng.random((37, 6)).astype("float32"), rng.integers(0, 3, 37)
history = model.fit(x, y, batch_size=8, epochs=2, verbose=0).history
model.save(sys.argv[2] + ".keras")
loaded = keras.saving.load_model(sys.argv[2] + ".keras")
np.savez(sys.argv[2], *model.get_weights(), *loaded.get_weights(),
         history=np.asarray(history["loss"] + history["accuracy"]))
"""


def test_importing_keras_ctl_replaces_nothing_in_keras():
    result = children.run([children.PYTHON, "-c", SNAPSHOT], timeout=120)
    assert result.returncode == 0, children.output(result)
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found["checked"] > 10000
    assert found["changed"] == []
    # A replica step installs each of its patches (`steps.PATCHES`), once.
    assert set(found["in_step"]) >= {
        "keras.src.losses.loss.reduce_weighted_values",
        "keras.src.backend.tensorflow.nn._compute_moments_sync",
        "keras.src.backend.tensorflow.nn.sparse_categorical_crossentropy",
        "keras.src.backend.tensorflow.numpy.argmax",
        "keras.src.layers.layer.Layer.__call__",
        "keras.src.optimizers.base_optimizer.BaseOptimizer.apply",
        "keras.src.optimizers.loss_scale_optimizer.LossScaleOptimizer.apply",
        "keras.src.backend.tensorflow.core.Variable._direct_assign",
        "keras.src.backend.tensorflow.core.Variable.assign_add",
        "keras.src.backend.tensorflow.core.Variable.assign_sub",
        "keras.src.backend.tensorflow.optimizer.TFOptimizer._distributed_tf_update_step",
    }


def test_a_plain_keras_model_trains_bit_for_bit_with_keras_ctl_imported(tmp_path):
    import numpy as np

    runs = {}
    for side in ("without", "with"):
        out = tmp_path / side
        result = children.run([children.PYTHON, "-c", TRAIN, side, out], timeout=120)
        assert result.returncode == 0, children.output(result)
        runs[side] = np.load(f"{out}.npz")
    assert runs["with"].files == runs["without"].files
    for name in runs["with"].files:
        np.testing.assert_array_equal(runs["with"][name], runs["without"][name])
