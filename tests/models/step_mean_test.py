"""A `train_step` of one's own, read as one device's code, measured before
the first step under 2 replicas.

The gradients the step applies on the first batch (captured, not applied)
are compared with the gradients it applies on one device on the same
examples. The triplet siamese network's kind of step (a loss of one value
an example, which `tape.gradient` sums) runs in shares, where it equals
one device; a loss neither a mean nor a sum is refused with the numbers
and the choices, and nothing trains. A mean (with Dropout, whose draws
are one device's), a step that builds its compiled loss and metrics on
first use (its first step runs eagerly; the measurement's updates of them
are undone), the sum and the sum declared in shares train as
`keras.Model` on one device in float64. A declaration in shares is
measured too: a mean over the replica's examples declared in shares (as
the method or as it runs) is refused by name.
`compute_loss_over="replica_batch"` runs the sum as written; a step that
draws with TensorFlow's own random ops cannot be measured and is warned
of.
"""

import warnings

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
    class OwnStep(base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.tracker = keras.metrics.Mean(name="loss")

        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                if kind == "compiled":  # keras.io's guide: built on first use
                    loss = self.compute_loss(x, y, y_pred)
                else:
                    per_example = ops.mean(ops.square(y_pred - y), axis=-1)
                    loss = per_example if kind == "sum" else ops.mean(per_example)
                    if kind == "coupled":  # the spread of the batch's predictions
                        loss += 0.5 * ops.var(ops.mean(y_pred, axis=-1))
                    if kind == "tf_random":
                        loss *= 1.0 + tf.random.uniform((), dtype=loss.dtype)
            gradients = tape.gradient(loss, self.trainable_weights)
            self.optimizer.apply_gradients(zip(gradients, self.trainable_weights))
            if kind == "compiled":
                for metric in self.metrics:
                    if metric.name == "loss":
                        metric.update_state(loss)
                    else:
                        metric.update_state(y, y_pred)
                return {m.name: m.result() for m in self.metrics}
            self.tracker.update_state(loss)
            return {"loss": self.tracker.result()}

        @property
        def metrics(self):
            return super().metrics if kind == "compiled" else [self.tracker]

    if not kind.startswith("shares"):
        return OwnStep
    # Each replica's sum over its examples is its share of the batch's; a
    # mean over them is not.
    summed = "mean" if kind.startswith("shares_mean") else "sum"

    class InShares(model_class(base, summed)):
        @keras_ctl.written_in_shares
        def train_step(self, data):
            return super().train_step(data)

    class InSharesAsItRuns(model_class(base, summed)):
        def train_step(self, data):
            return keras_ctl.written_in_shares(super().train_step)(data)

    return InSharesAsItRuns if kind.endswith("as_it_runs") else InShares


def built(strategy, kind, base=keras_ctl.CTLModel, **options):
    keras.utils.set_random_seed(2)
    with strategy.scope():
        inputs = keras.Input((3,))
        hidden = keras.layers.Dense(4, activation="tanh")(inputs)
        hidden = keras.layers.Dropout(0.3)(hidden)
        outputs = keras.layers.Dense(2)(hidden)
        model = model_class(base, kind)(inputs, outputs)
        compiled = {"loss": "mse", "metrics": ["mae"]} if kind == "compiled" else {}
        model.compile(
            keras.optimizers.Adam(0.05), steps_per_execution=2, **compiled, **options
        )
    return model


def dataset():
    rng = np.random.default_rng(3)
    x, y = (rng.normal(size=(ROWS, n)).astype(keras.config.floatx()) for n in (3, 2))
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)


def fitted(model):
    history = model.fit(dataset(), epochs=2, verbose=0)
    return model.get_weights(), history.history


def test_a_loss_neither_mean_nor_sum_is_refused_before_training():
    with configurations.computing_in("float64"):
        model = built(devices.get("mirrored"), "coupled")
        before = model.get_weights()
        with pytest.raises(ValueError) as refused:
            fitted(model)
    message = str(refused.value)
    assert message.startswith(
        "OwnStep.train_step is read as one device's code, but the gradients it "
        f"applies on the first batch ({BATCH // 2} of its {BATCH} examples, on 2 "
        "replicas), each replica's on its part weighed by the part's share of "
        "the batch and summed (in shares, summed as they are: "
    )
    assert "its loss is neither a mean nor a sum over examples." in message
    off = refusals.relative_difference(message)
    assert 1e-3 < off < 1
    for choice in (
        "`ops.mean(loss)`",
        "`@keras_ctl.written_in_shares`",
        "`keras_ctl.all_gather`",
        '`compute_loss_over="replica_batch"`',
    ):
        assert choice in message
    # Nothing trained, and the measurement left no trace in the state.
    assert model.optimizer.iterations.numpy() == 0
    assert model.tracker.count.numpy() == 0
    for kept, now in zip(before, model.get_weights()):
        np.testing.assert_array_equal(kept, now)


# A sum over examples (keras.io's triplet siamese network) runs in shares,
# measured on the first batch, as if declared.
@pytest.mark.slow  # for the fast tier's time; the suite runs it
@pytest.mark.parametrize("kind", ["mean", "compiled", "shares", "sum"])
def test_a_step_that_is_one_devices_trains_as_one_device(kind):
    with configurations.computing_in("float64"):
        expected, expected_logs = fitted(
            built(devices.get("default"), kind, keras.Model)
        )
        got, logs = fitted(built(devices.get("mirrored"), kind))
    for e, g in zip(expected, got):
        np.testing.assert_allclose(g, e, rtol=1e-9, atol=1e-12)
    assert logs.keys() == expected_logs.keys()
    for key, values in expected_logs.items():
        np.testing.assert_allclose(logs[key], values, rtol=1e-9)


@pytest.mark.parametrize("kind", ["shares_mean", "shares_mean_as_it_runs"])
def test_a_declaration_in_shares_is_measured_not_trusted(kind):
    # A mean over the replica's examples declared in shares: each replica's
    # gradient counts as the batch's, R times one device's.
    with configurations.computing_in("float64"):
        model = built(devices.get("mirrored"), kind)
        before = model.get_weights()
        with pytest.raises(ValueError) as refused:
            fitted(model)
    message = str(refused.value)
    name = "InShares" if kind == "shares_mean" else "InSharesAsItRuns"
    assert message.startswith(
        f"{name}.train_step is declared written in shares "
        "(`keras_ctl.written_in_shares`), but the gradients it applies on the "
        f"first batch ({BATCH // 2} of its {BATCH} examples, on 2 replicas), "
        "each replica's on its part summed as it is, are "
    )
    assert "its loss is not a sum of the replicas' shares" in message
    # Each replica's mean gradient, summed: about twice one device's.
    assert 0.5 < refusals.relative_difference(message) < 1.5
    assert model.optimizer.iterations.numpy() == 0
    for kept, now in zip(before, model.get_weights()):
        np.testing.assert_array_equal(kept, now)


def test_replica_batch_runs_a_sum_as_written():
    with configurations.computing_in("float64"):
        expected, _ = fitted(built(devices.get("default"), "sum", keras.Model))
        as_written, _ = fitted(
            built(devices.get("mirrored"), "sum", compute_loss_over="replica_batch")
        )
    differences = [np.max(np.abs(w - e)) for w, e in zip(as_written, expected)]
    assert max(differences) > 1e-4


def test_tensorflows_own_draws_are_warned_of_and_not_measured():
    model = built(devices.get("mirrored"), "tf_random")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fitted(model)
    found = [str(w.message) for w in caught if "other gradients" in str(w.message)]
    assert len(found) == 1
    assert found[0].startswith(
        "OwnStep.train_step applies other gradients on each run of one device "
        "on the same batch and weights: it draws random numbers"
    )
    assert model.optimizer.iterations.numpy() == 2 * -(-ROWS // BATCH)
