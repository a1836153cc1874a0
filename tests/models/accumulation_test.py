"""`gradient_accumulation_steps` under a strategy: one device's updates,
learning-rate schedule and counts, with one gradient all-reduce per update;
the `"examples"` variant equals one step on the union of the k batches."""

import devices
import keras
import numpy as np
import pytest
import tensorflow as tf
from small_classifier import assert_weights_equal
from small_classifier import compile_classifier
from small_classifier import functional
from small_classifier import small_data

import keras_ctl

STEPS = 3  # 37 examples, batch 8: 5 steps an epoch, groups across epochs


def schedule():
    return keras.optimizers.schedules.ExponentialDecay(0.2, 1, 0.7)


def train(where, model_class=keras_ctl.CTLModel, learning_rate=None, **compile_kwargs):
    x, y = small_data()
    with devices.get(where).scope():
        optimizer = keras.optimizers.SGD(
            learning_rate or schedule(), gradient_accumulation_steps=STEPS
        )
        model = compile_classifier(functional(model_class), optimizer, **compile_kwargs)
    history = model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    return model, history.history


def test_accumulation_under_replicas_equals_one_device():
    expected, expected_history = train("default", keras.Model)
    got, history = train("mirrored")
    assert_weights_equal(got, expected)
    for key in expected_history:
        np.testing.assert_allclose(history[key], expected_history[key], atol=1e-5)
    # 10 steps: 3 updates. Keras's schedule counts steps (0.2 x 0.7^10).
    assert int(got.optimizer.iterations) == int(expected.optimizer.iterations) == 3
    assert float(got.optimizer.learning_rate) == pytest.approx(0.2 * 0.7**10)
    assert float(expected.optimizer.learning_rate) == pytest.approx(0.2 * 0.7**10)


def test_accumulation_sums_gradients_across_replicas_once_per_update():
    model, _ = train("mirrored")
    graph = model.train_function.graphs()[0]
    # The step's `tf.cond`: the accumulating branch all-reduces the count
    # only, the updating one the count and the gradients (one collective
    # op per replica each).
    replicas = 2
    counts = []
    for function in graph.as_graph_def().library.function:
        ops = [n.op for n in function.node_def]
        reduces = sum(op.startswith("CollectiveReduce") for op in ops)
        if reduces:
            counts.append(reduces // replicas)
    assert sorted(counts) == [1, 2]


def union_of_groups_reference():
    """Plain SGD, one step per group of 3 batches (8, 8, 8 | 8, 5, 8 | ...)."""
    x, y = small_data()
    xs, ys = np.concatenate([x, x]), np.concatenate([y, y])
    bounds = np.cumsum([0, 24, 21, 24])  # 10 steps: 3 updates

    def groups():
        for start, end in zip(bounds[:-1], bounds[1:]):
            yield xs[start:end], ys[start:end]

    dataset = tf.data.Dataset.from_generator(
        groups,
        output_signature=(tf.TensorSpec((None, 4)), tf.TensorSpec((None,), tf.int32)),
    )
    model = functional(keras.Model)
    model.compile(
        optimizer=keras.optimizers.SGD(0.2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    model.fit(dataset, epochs=1, verbose=0)
    return model


@pytest.mark.parametrize("where", ["default", "mirrored"])
def test_accumulation_over_examples_equals_one_step_on_the_union(where):
    got, _ = train(where, learning_rate=0.2, gradient_accumulation="examples")
    assert_weights_equal(got, union_of_groups_reference())
    keras_mean, _ = train("default", keras.Model, learning_rate=0.2)
    difference = max(
        np.abs(a - b).max() for a, b in zip(got.get_weights(), keras_mean.get_weights())
    )
    assert difference > 1e-4  # the groups differ in size: a different mean


class OwnStep(keras_ctl.CTLModel):
    def train_step(self, data):
        return super().train_step(data)


@pytest.mark.parametrize(
    "where, model_class, problem",
    [
        ("mirrored", OwnStep, "a `train_step` of its own"),
        ("centralstorage", keras_ctl.CTLModel, "CentralStorageStrategy"),
    ],
)
def test_accumulation_where_it_cannot_run_says_what_to_do(where, model_class, problem):
    x, y = small_data()
    with devices.get(where).scope():
        inputs = keras.Input((4,))
        model = model_class(inputs, keras.layers.Dense(2)(inputs))
        model.compile(
            optimizer=keras.optimizers.SGD(0.1, gradient_accumulation_steps=STEPS),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    before = model.get_weights()
    with pytest.raises(
        ValueError,
        match=rf"Received: gradient_accumulation_steps=3 with {problem}.*global "
        "batch 3 times larger",
    ):
        model.fit(x, y, batch_size=8, verbose=0)
    for weight, initial in zip(model.get_weights(), before):
        np.testing.assert_array_equal(weight, initial)


def test_an_unknown_accumulation_mode_names_the_argument():
    with pytest.raises(ValueError, match=r"Received: gradient_accumulation='sum'"):
        functional().compile(optimizer="sgd", loss="mse", gradient_accumulation="sum")


def test_the_accumulation_mode_is_saved_with_the_model(tmp_path):
    model, _ = train("default", learning_rate=0.2, gradient_accumulation="examples")
    model.save(tmp_path / "model.keras")
    loaded = keras.saving.load_model(tmp_path / "model.keras")
    assert loaded.get_compile_config()["gradient_accumulation"] == "examples"
    assert loaded.optimizer.gradient_accumulation_steps == STEPS
    assert int(loaded.optimizer.iterations) == int(model.optimizer.iterations) == 3
