"""The seam's contract with Keras: every private name keras_ctl uses is
looked up in one place, listed by reading the source (not by hand), and
exists in the installed Keras (`.ci/compat` runs this at both ends of the
supported range and on the next Keras); a missing one fails naming itself;
every replacement is one row of one table."""

import ast
import pathlib

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_ctl
from keras_ctl import _keras
from keras_ctl._keras import behaviours
from keras_ctl._keras import names

PACKAGE = pathlib.Path(keras_ctl.__file__).parent
# Private names of Python itself, not of Keras or TensorFlow.
PYTHON_PRIVATE = {"_replace", "_exit"}


def live_objects():
    """Live Keras and TensorFlow objects whose private attributes the seam
    reads, so an attribute set per instance is found too."""
    inputs = keras.Input((3,))
    masked = keras.layers.Masking()(inputs)
    model = keras.Model(inputs, keras.layers.Dense(2)(masked))
    model.compile(optimizer="adam", loss="mse", metrics=["mae"])
    x, y = np.zeros((4, 3), "float32"), np.zeros((4, 2), "float32")
    model.fit(x, y, epochs=1, verbose=0)
    epoch_iterator = names.member(
        "keras.src.backend.tensorflow.trainer", "TFEpochIterator"
    )(x=x, y=y, batch_size=2, distribute_strategy=tf.distribute.get_strategy())
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    dataset = tf.data.Dataset.from_tensor_slices(x).batch(2)
    # The state an optimizer builds only for these options.
    accumulating = keras.optimizers.SGD(gradient_accumulation_steps=2, use_ema=True)
    accumulating.build(model.trainable_variables)
    with tf.Graph().as_default():  # Keras leaves the logits on a traced tensor
        probabilities = keras.activations.softmax(tf.constant(x))
    return [
        probabilities,
        accumulating,
        model,
        keras.Model,
        model._compile_loss,
        model.optimizer,
        model.weights[0],
        model.weights[0].value,
        model.layers[1],
        model.layers[1](tf.constant(x)),
        epoch_iterator,
        strategy.experimental_distribute_dataset(dataset),
        iter(strategy.experimental_distribute_dataset(dataset)),
        tf.function(lambda: 0),
    ]


def test_every_private_name_the_seam_uses_exists_in_this_keras():
    found = _keras.names.inventory()
    assert {kind for kind, _, _ in found} == {"module", "member", "attribute"}
    objects = live_objects()
    missing = []
    for kind, where, name in found:
        if kind == "module":
            names.module(where)
        elif kind == "member":
            names.member(where, name)
        elif not any(hasattr(o, name) for o in objects):
            missing.append(name)
    assert missing == [], f"Keras {keras.__version__} lacks {missing}"


def private_uses(path):
    """`[(line, name)]`: private attributes and `keras.src`/`tensorflow.
    python` imports in `path` that keras_ctl does not define itself."""
    uses = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            modules = [node.module]
        elif isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        else:
            modules = []
        for module in modules:
            if module.startswith(("keras.src", "tensorflow.python")):
                uses.append((node.lineno, module))
        if isinstance(node, ast.Attribute) and _private(node.attr):
            uses.append((node.lineno, node.attr))
    return [(line, name) for line, name in uses if name not in DEFINED_HERE]


def _private(name):
    return name.startswith("_") and not name.startswith("__")


def defined_in_keras_ctl():
    """Every name keras_ctl defines: functions, classes, variables,
    arguments, and attributes it sets on its own objects."""
    defined = set(PYTHON_PRIVATE)
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                defined.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                defined.add(node.id)
            elif isinstance(node, ast.arg):
                defined.add(node.arg)
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and getattr(node.value, "id", None) in ("self", "cls")
            ):
                defined.add(node.attr)
    return defined


DEFINED_HERE = defined_in_keras_ctl()


def test_private_keras_names_are_used_only_through_the_lookups():
    looked_up = {name for kind, _, name in names.inventory() if kind == "attribute"}
    outside, unlisted = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        if relative == pathlib.Path("_keras/names.py"):
            continue
        for line, name in private_uses(path):
            where = f"{relative}:{line} {name}"
            if relative.parts[0] != "_keras":
                outside.append(where)
            elif name not in looked_up:
                # Read through `names` elsewhere: a store or `del` of it here
                # is covered by that lookup.
                unlisted.append(where)
    assert outside == [], "private Keras names outside keras_ctl/_keras/"
    assert unlisted == [], "private names not looked up through `names`"


def test_the_inventory_is_read_from_literal_names():
    for kind, where, name in names.inventory():
        assert (where if kind != "attribute" else name) is not None, (kind, where)
        assert kind != "attribute" or _private(name), name


def test_a_missing_name_fails_naming_it_and_the_keras_versions():
    with pytest.raises(names.KerasInternalMissing) as error:
        names.member("keras.src.losses.loss", "no_such_reduction")
    message = str(error.value)
    assert "keras.src.losses.loss.no_such_reduction" in message
    assert keras.__version__ in message
    others = [v for v in names.CHECKED_ON if v != keras.__version__]
    assert all(version in message for version in others)
    # A version checked is said to be checked only on a copy that had it.
    assert f"on a copy of {keras.__version__}" in message or (
        keras.__version__ not in names.CHECKED_ON
        and f"checked on Keras {', '.join(others)})" in message
    )
    with pytest.raises(names.KerasInternalMissing, match=r"Dense\._no_such"):
        names.attribute(keras.layers.Dense(1), "_no_such")
    with pytest.raises(ImportError, match="keras.src.no_such_module"):
        names.module("keras.src.no_such_module")


def test_a_module_keras_moved_is_found_at_either_place():
    moved = [
        where
        for kind, where, _ in names.inventory()
        if kind != "attribute" and where.rpartition(".")[0] in names.MOVED
    ]
    assert "keras.src.backend.tensorflow.image" in moved
    for old in moved:
        package, _, leaf = old.rpartition(".")
        found = names.module(old)
        assert found.__name__ in (old, f"{names.MOVED[package]}.{leaf}")
        assert hasattr(found, "__file__")


def test_a_row_one_feature_needs_falls_back_to_its_public_owner():
    # As in a Keras that lacks the private module: the row wraps the
    # public class that calls it, and the rest of the table is unchanged.
    from keras_ctl._keras import replacements

    (elastic,) = [r for r in _keras.REPLACEMENTS if r.fallback is not None]
    missing = elastic._replace(
        owner=lambda: names.module("keras.src.backend.tensorflow.no_such")
    )
    assert replacements._where(missing) == (
        keras.layers.RandomElasticTransform,
        "transform_images",
    )
    assert replacements._where(elastic)[1] == "elastic_transform"
    with pytest.raises(names.KerasInternalMissing, match="no_such"):
        replacements._where(missing._replace(fallback=None))


def test_each_replacement_is_one_row_saying_why():
    rows = [(r.owner(), r.name) for r in _keras.REPLACEMENTS]
    present = [(owner, name) for owner, name in rows if owner is not None]
    assert len(set(present)) == len(present) == len(_keras.replaced())
    for replacement in _keras.REPLACEMENTS:
        make = behaviours.named(replacement.behaviour)
        assert make.__doc__ and replacement.why
    for owner, name in present:
        assert hasattr(owner, name), f"{owner}.{name}"


def test_a_row_whose_behaviour_nobody_registered_fails_naming_it(monkeypatch):
    # The seam is handed keras_ctl's behaviours; a row left without one is
    # refused before anything is replaced.
    from keras_ctl._keras import replacements

    orphan = _keras.REPLACEMENTS[0]._replace(behaviour="no_such_behaviour")
    monkeypatch.setattr(replacements, "REPLACEMENTS", (*_keras.REPLACEMENTS, orphan))
    keras_own = [(o, n, getattr(o, n)) for o, n in replacements.replaced()]
    with pytest.raises(behaviours.BehaviourMissing, match="no_such_behaviour"):
        with _keras.in_effect():
            pass
    assert all(getattr(o, n) is own for o, n, own in keras_own)
