"""A `compute_loss` of one's own that is not a mean over examples, found
before the first step under 2 replicas (`compile(compute_loss_over=None)`,
the default).

The loss is measured on the first batch the step would train on, on the
whole batch and on its halves. A sum over examples (keras.io's masked
language model) and a mean over a count of entries written by hand (a
coupling of the batch's examples) are refused with the numbers and both
choices, and nothing trains. A mean (a penalty added to
`super().compute_loss`) and Keras's own mean over the batch's sample
weights (not a mean of its halves' values, but exact in the step) train as
`keras.Model` on one device in float64, with a shuffled `tf.data` pipeline
and 2 steps an execution (the measured batch is the one the first step
reads, so the order is one device's). `"replica_batch"` runs the sum as
written; one device is never measured.
"""

import configurations
import devices
import keras
import numpy as np
import pytest
import refusals
import tensorflow as tf
from keras import ops

import keras_ctl

ROWS, BATCH = 21, 8  # the last batch (5 rows) splits 3 / 2


def model_class(base, kind):
    per_token = keras.losses.SparseCategoricalCrossentropy(reduction=None)
    weighted_mean = keras.losses.SparseCategoricalCrossentropy(
        reduction="mean_with_sample_weight"
    )

    class OwnLoss(base):
        def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None):
            if kind == "sum":  # keras.io's masked language model
                return ops.sum(per_token(y, y_pred, sample_weight))
            if kind == "masked_mean":  # over the batch's count of entries
                losses = per_token(y, y_pred) * sample_weight
                return ops.sum(losses) / ops.sum(sample_weight)
            if kind == "keras_masked_mean":  # the same, by Keras: exact
                return weighted_mean(y, y_pred, sample_weight)
            penalty = 0.1 * ops.mean(ops.square(y_pred))
            return super().compute_loss(x, y, y_pred, sample_weight) + penalty

    return OwnLoss


def data():
    rng = np.random.default_rng(3)
    tokens = rng.integers(0, 6, (ROWS, 4))
    weights = (rng.random((ROWS, 4)) < 0.5).astype(keras.config.floatx())
    return rng.normal(size=(ROWS, 4, 3)), tokens, weights


def built(strategy, kind, base=keras_ctl.CTLModel, **options):
    keras.utils.set_random_seed(2)
    with strategy.scope():
        inputs = keras.Input((4, 3))
        outputs = keras.layers.Dense(6, activation="softmax")(inputs)
        model = model_class(base, kind)(inputs, outputs)
        loss = None
        if kind == "mean":
            loss = keras.losses.SparseCategoricalCrossentropy()
        model.compile(
            keras.optimizers.Adam(0.05), loss, steps_per_execution=2, **options
        )
    return model


def shuffled_dataset():
    x, y, weights = data()
    dataset = tf.data.Dataset.from_tensor_slices((x, y, weights))
    # The same order each epoch: one device's `fit()` opens an iterator of
    # its data more than keras_ctl's (to build the model), which would
    # reshuffle its later epochs otherwise.
    return dataset.shuffle(ROWS, seed=4, reshuffle_each_iteration=False).batch(BATCH)


def fitted(model):
    history = model.fit(shuffled_dataset(), epochs=2, shuffle=False, verbose=0)
    return model.get_weights(), history.history["loss"]


@pytest.mark.parametrize(
    "kind, found",
    [
        ("sum", "a sum over examples"),
        ("masked_mean", "a loss that couples the batch's examples"),
    ],
)
def test_a_loss_that_is_not_a_mean_is_refused_before_training(kind, found):
    with configurations.computing_in("float64"):
        model = built(devices.get("mirrored"), kind)
        before = model.get_weights()
        with pytest.raises(ValueError) as refused:
            fitted(model)
    message = str(refused.value)
    assert message.startswith(
        "OwnLoss.compute_loss is not a mean over examples: on the first batch "
        f"({BATCH // 2} of its {BATCH} examples, on 2 replicas), the gradient of "
        "each replica's loss "
    )
    off = refusals.relative_difference(message)
    assert off > 0.01
    assert found in message
    assert 'compute_loss_over="global_batch"' in message
    assert 'compute_loss_over="replica_batch"' in message
    # Measured on the first batch's slices (each replica's first 2 of its 4
    # examples: within a replica's memory); nothing trained.
    with configurations.computing_in("float64"):
        x, y, weights = (
            tf.gather(t, [0, 1, 4, 5]) for t in next(iter(shuffled_dataset()))
        )
        one_device = built(devices.get("default"), kind, keras.Model)
        whole = float(one_device.compute_loss(x, y, one_device(x), weights))
    assert f"it is {whole:.6g} on the whole batch" in message
    assert model.optimizer.iterations.numpy() == 0
    for kept, now in zip(before, model.get_weights()):
        np.testing.assert_array_equal(kept, now)


def test_evaluate_measures_its_first_batch_too():
    model = built(devices.get("mirrored"), "sum")
    with pytest.raises(ValueError, match="is not a mean over examples"):
        model.evaluate(shuffled_dataset(), verbose=0)


@pytest.mark.parametrize("kind", ["mean", "keras_masked_mean"])
def test_a_mean_trains_as_one_device_in_the_order_of_its_data(kind):
    # A Keras `Loss` divided by the batch's weights is exact in the step
    # (the global batch's denominators), though not a mean of its halves.
    with configurations.computing_in("float64"):
        expected, expected_loss = fitted(
            built(devices.get("default"), kind, keras.Model)
        )
        got, loss = fitted(built(devices.get("mirrored"), kind))
    for e, g in zip(expected, got):
        np.testing.assert_allclose(g, e, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(loss, expected_loss, rtol=1e-9)


def test_replica_batch_runs_a_sum_as_written_and_one_device_is_not_measured():
    with configurations.computing_in("float64"):
        expected, _ = fitted(built(devices.get("default"), "sum", keras.Model))
        alone, _ = fitted(built(devices.get("default"), "sum"))
        as_written, _ = fitted(
            built(devices.get("mirrored"), "sum", compute_loss_over="replica_batch")
        )
        global_batch, _ = fitted(
            built(devices.get("mirrored"), "sum", compute_loss_over="global_batch")
        )
    for e, a, g in zip(expected, alone, global_batch):
        np.testing.assert_allclose(a, e, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(g, e, rtol=1e-9, atol=1e-12)
    differences = [np.max(np.abs(w - e)) for w, e in zip(as_written, expected)]
    assert max(differences) > 1e-4
