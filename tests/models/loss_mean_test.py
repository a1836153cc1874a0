"""A `compute_loss` of one's own read as measured before the first step
under 2 replicas (`compile(compute_loss_over=None)`, the default).

The loss is measured on the first batch the step would train on. A sum
over examples (keras.io's masked language model) is read in shares and
trains as `keras.Model` on one device, its logged loss and a tracker given
its one value included. A mean over a count of entries written by hand (a
coupling of the batch's examples) is refused with the numbers and both
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
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.summed = keras.metrics.Mean(name="summed")

        def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None):
            if kind == "sum":  # keras.io's masked language model
                loss = ops.sum(per_token(y, y_pred, sample_weight))
                self.summed.update_state(loss)  # one value: the batch's sum
                return loss
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


def test_a_loss_that_couples_the_batch_is_refused_before_training():
    with configurations.computing_in("float64"):
        model = built(devices.get("mirrored"), "masked_mean")
        before = model.get_weights()
        with pytest.raises(ValueError) as refused:
            fitted(model)
    message = str(refused.value)
    assert message.startswith(
        "OwnLoss.compute_loss is neither a mean nor a sum over examples: on the "
        f"first batch ({BATCH // 2} of its {BATCH} examples, on 2 replicas), the "
        "gradient of each replica's loss on its part, weighed by the part's "
        "share of the batch and summed (summed as it is: "
    )
    off = refusals.relative_difference(message)
    assert off > 0.01
    assert "a loss that couples the batch's examples" in message
    assert 'compute_loss_over="global_batch"' in message
    assert 'compute_loss_over="replica_batch"' in message
    # Measured on the first batch's slices (each replica's first 2 of its 4
    # examples: within a replica's memory); nothing trained.
    with configurations.computing_in("float64"):
        x, y, weights = (
            tf.gather(t, [0, 1, 4, 5]) for t in next(iter(shuffled_dataset()))
        )
        one_device = built(devices.get("default"), "masked_mean", keras.Model)
        whole = float(one_device.compute_loss(x, y, one_device(x), weights))
    assert f"it is {whole:.6g} on the whole batch" in message
    assert model.optimizer.iterations.numpy() == 0
    for kept, now in zip(before, model.get_weights()):
        np.testing.assert_array_equal(kept, now)


def test_evaluate_measures_its_first_batch_too():
    model = built(devices.get("mirrored"), "masked_mean")
    with pytest.raises(ValueError, match="is neither a mean nor a sum over"):
        model.evaluate(shuffled_dataset(), verbose=0)


def test_a_sum_over_examples_is_read_in_shares_as_one_device():
    # keras.io's masked language model as written: each replica's sum,
    # summed as it is, is one device's; the loss logged and a tracker given
    # the sum are one device's too (in `fit()` and `evaluate()`).
    with configurations.computing_in("float64"):
        one_device = built(devices.get("default"), "sum", keras.Model)
        replicas = built(devices.get("mirrored"), "sum")
        for model in (one_device, replicas):
            model.history_seen = model.fit(
                shuffled_dataset(), epochs=2, shuffle=False, verbose=0
            ).history
            model.evaluated = model.evaluate(
                shuffled_dataset(), verbose=0, return_dict=True
            )
    for e, g in zip(one_device.get_weights(), replicas.get_weights()):
        np.testing.assert_allclose(g, e, rtol=1e-9, atol=1e-12)
    assert set(replicas.history_seen) == {"loss", "summed"}
    for key, values in one_device.history_seen.items():
        np.testing.assert_allclose(replicas.history_seen[key], values, rtol=1e-9)
    for key, value in one_device.evaluated.items():
        np.testing.assert_allclose(replicas.evaluated[key], value, rtol=1e-9)
    # Summed over 8 examples, not a mean: the measurement had to tell.
    assert replicas.history_seen["loss"][0] > 5


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
