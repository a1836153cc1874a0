"""Importing keras_ctl changes nothing of Keras: every function and class
attribute of every Keras module loaded before (and of the modules outside
Keras whose attributes rows replace: TensorFlow's module of `tf.function`,
Python's `random`) is the same object after
`import keras_ctl`, and a plain `keras.Model` trains bit for bit as without
it. Keras's attributes are replaced only while a keras_ctl call runs (each
row of `table.REPLACEMENTS`), and are Keras's own again after."""

import json

import children

SNAPSHOT = """
import json
import sys

import keras
import tensorflow

# The modules outside Keras whose attributes the table replaces.
OUTSIDE_KERAS = (
    "tensorflow.python.eager.polymorphic_function.polymorphic_function",
    "random",
)


def snapshot():
    seen = {}
    for name, module in list(sys.modules.items()):
        watched = name == "keras" or name.startswith("keras.") or name in OUTSIDE_KERAS
        if module is None or not watched:
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
after = snapshot()
replaced = sorted(
    f"{owner.__module__}.{owner.__qualname__}.{name}" if isinstance(owner, type)
    else f"{owner.__name__}.{name}"
    for owner, name in keras_ctl._keras.replaced()
)
print(json.dumps({
    "checked": len(before),
    "changed": changed(before, imported),
    "in_step": changed(imported, in_step),
    "after": changed(imported, after),
    "replaced": replaced,
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
    # Within a replica step every row of the table is in place, and only
    # they; after it, none.
    assert found["in_step"] == found["replaced"]
    assert len(found["replaced"]) >= 14
    assert found["after"] == []


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
