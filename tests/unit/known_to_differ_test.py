"""The parity kit names the parts of a model known to differ from one
device, each with what to do."""

import inspect

import keras
import numpy as np
import pytest

import keras_ctl
from keras_ctl.testing import _explained
from keras_ctl.testing import known_to_differ


class OwnStep(keras_ctl.CTLModel):
    def train_step(self, data):
        return {}


def functional(base):
    inputs = keras.Input((4,))
    h = keras.layers.Dense(
        3, activity_regularizer="l2", kernel_regularizer="l2", name="active"
    )(inputs)
    h = keras.layers.BatchNormalization(name="bn")(h)
    h = keras.layers.BatchNormalization(synchronized=True, name="synced")(h)
    h = keras.layers.Dropout(0.5, name="drop")(h)
    h = keras.layers.Dropout(0.0, name="no_drop")(h)
    h = keras.layers.GaussianNoise(0.1, name="noise")(h)
    return base(inputs, keras.layers.Dense(2, name="out")(h))


def test_each_known_difference_is_named_with_what_to_do():
    # Random layers draw one device's numbers by default.
    found = dict(known_to_differ(functional(keras_ctl.CTLModel)))
    assert set(found) == {"active (Dense)", "bn (BatchNormalization)"}
    assert 'batch_statistics="global"' in found["bn (BatchNormalization)"]
    assert "weight regularizer" in found["active (Dense)"]


def test_random_layers_drawing_per_replica_are_named():
    model = functional(keras_ctl.CTLModel)
    model.compile(loss="mse", random_draws="per_replica")
    found = dict(known_to_differ(model))
    assert set(found) == {
        "active (Dense)",
        "bn (BatchNormalization)",
        "drop (Dropout)",
        "noise (GaussianNoise)",
    }
    assert 'random_draws="as_one_device"' in found["drop (Dropout)"]


def test_batch_norm_compiled_for_global_statistics_is_not_named():
    model = functional(keras_ctl.CTLModel)
    model.compile(loss="mse", batch_statistics="global")
    assert "bn (BatchNormalization)" not in dict(known_to_differ(model))


def test_a_plain_keras_model_and_a_step_of_ones_own_are_named():
    inputs = keras.Input((4,))
    outputs = keras.layers.Dense(2)(inputs)
    plain = known_to_differ(keras.Model(inputs, outputs))
    assert [where for where, _ in plain] == ["Functional"]
    assert "CTLModel.from_model" in plain[0][1]
    own = known_to_differ(OwnStep(inputs, outputs))
    assert [where for where, _ in own] == ["OwnStep.train_step"]
    assert "keras_ctl.global_mean" in own[0][1]
    assert _explained(own).splitlines()[2:] == [
        "Known to differ from one device:",
        f"- OwnStep.train_step: {own[0][1]}",
    ]
    assert _explained([]) == ""


class SharesStep(keras_ctl.CTLModel):
    @keras_ctl.written_in_shares
    def train_step(self, data):
        x, y = data
        return {"loss": keras_ctl.ReplicaSum(keras_ctl.global_mean(y - self(x)))}


def test_a_step_declared_in_replica_shares_is_named_so():
    inputs = keras.Input((4,))
    own = known_to_differ(SharesStep(inputs, keras.layers.Dense(2)(inputs)))
    assert [where for where, _ in own] == ["SharesStep.train_step"]
    assert "declared `written_in_shares`" in own[0][1]
    assert "Without the declaration, the step is read as one device's" in own[0][1]


class SumOfLosses(keras_ctl.CTLModel):
    def compute_loss(
        self, x=None, y=None, y_pred=None, sample_weight=None, training=True
    ):
        return keras.ops.sum(keras.ops.square(y_pred))


def test_a_compute_loss_of_ones_own_is_named_with_its_rule():
    inputs = keras.Input((4,))
    found = known_to_differ(SumOfLosses(inputs, keras.layers.Dense(2)(inputs)))
    assert [where for where, _ in found] == ["SumOfLosses.compute_loss"]
    assert "read as on one device" in found[0][1]
    assert "read in shares where the first batch measures one" in found[0][1]
    assert 'compute_loss_over="global_batch"' in found[0][1]


def test_a_compute_loss_over_the_global_batch_is_not_named():
    inputs = keras.Input((4,))
    model = SumOfLosses(inputs, keras.layers.Dense(2)(inputs))
    model.compile(loss="mse", compute_loss_over="global_batch")
    assert known_to_differ(model) == []


class InBatchNegatives(keras_ctl.CTLModel):
    def compute_loss(
        self, x=None, y=None, y_pred=None, sample_weight=None, training=True
    ):
        scores = keras.ops.matmul(y_pred, keras.ops.transpose(y))
        labels = keras.ops.eye(keras.ops.shape(scores)[0])
        return keras.ops.mean(
            keras.losses.categorical_crossentropy(labels, scores, from_logits=True)
        )


def _measured(model_class, compile_loss=None):
    inputs = keras.Input((4,))
    model = model_class(inputs, keras.layers.Dense(4)(inputs))
    model.compile(loss=compile_loss)
    x = np.arange(40, dtype="float32").reshape(10, 4) / 40
    y = np.cos(np.arange(40, dtype="float32")).reshape(10, 4)
    weights = [w.copy() for w in model.get_weights()]
    found = dict(known_to_differ(model, (x, y)))
    for before, after in zip(weights, model.get_weights()):
        np.testing.assert_array_equal(before, after)
    return found, model, (x, y)


def test_a_batch_measures_whether_compute_loss_couples_the_batch():
    found, model, (x, y) = _measured(InBatchNegatives)
    advice = found["InBatchNegatives.compute_loss"]
    assert "couples the batch's examples" in advice
    assert 'compute_loss_over="global_batch"' in advice
    # The numbers measured are in the message.
    whole = float(model.compute_loss(x, y, model(x), None, training=False))
    assert f"{whole:.6g} on the whole batch" in advice

    # A sum over examples is read in shares, as one device's: the general
    # rule, as a mean gets.
    found, _, _ = _measured(SumOfLosses)
    assert "couples" not in found["SumOfLosses.compute_loss"]
    assert "read in shares where" in found["SumOfLosses.compute_loss"]


class MeanWithPenalty(keras_ctl.CTLModel):
    def compute_loss(
        self, x=None, y=None, y_pred=None, sample_weight=None, training=True
    ):
        loss = super().compute_loss(x, y, y_pred, sample_weight, training=training)
        return loss + 0.1 * keras.ops.mean(keras.ops.square(y_pred))


def test_a_measured_mean_over_examples_gets_the_general_rule():
    found, _, _ = _measured(MeanWithPenalty, compile_loss="mse")
    assert "read as on one device" in found["MeanWithPenalty.compute_loss"]


def test_a_batch_of_one_example_is_refused_by_name():
    inputs = keras.Input((4,))
    model = InBatchNegatives(inputs, keras.layers.Dense(4)(inputs))
    with pytest.raises(ValueError, match="at least two examples.*1 example"):
        known_to_differ(model, (np.zeros((1, 4)), np.zeros((1, 4))))


def test_keras_ctls_own_gan_is_not_named_as_code_of_ones_own():
    latent = keras.Input((2,))
    generator = keras.Model(latent, keras.layers.Dense(3)(latent))
    image = keras.Input((3,))
    discriminator = keras.Model(image, keras.layers.Dense(1)(image))
    gan = keras_ctl.GAN(discriminator=discriminator, generator=generator, latent_dim=2)
    assert known_to_differ(gan) == []


class BatchStatistics(keras_ctl.CTLModel):
    def train_step(self, data):
        x, y = data
        similarities = self.similarities(self(x))
        per_example = keras.ops.sum(keras.ops.square(self(x) - y), axis=1)
        regularization = keras.ops.sum(self.losses)
        return {"loss": keras.ops.sum(per_example) + regularization + similarities}

    def similarities(self, z):
        return keras.ops.max(keras.ops.matmul(z, z.T))


def test_a_step_of_ones_own_names_the_lines_that_may_take_a_batch_statistic():
    inputs = keras.Input((2,))
    model = BatchStatistics(inputs, keras.layers.Dense(2)(inputs))
    advice = dict(known_to_differ(model))["BatchStatistics.train_step"]
    lines, first = inspect.getsourcelines(BatchStatistics)
    at = {text.strip(): first + i for i, text in enumerate(lines)}
    # A sum over the batch and, in the model's method the step calls, a
    # product across examples and a maximum over every axis; not a sum over
    # an example's axis, nor the sum of `self.losses`.
    summed = (
        'return {"loss": keras.ops.sum(per_example) + regularization + similarities}'
    )
    maximum = "return keras.ops.max(keras.ops.matmul(z, z.T))"
    here = "known_to_differ_test.py"
    expected = [
        f"{here}:{at[summed]} `keras.ops.sum(per_example)`",
        f"{here}:{at[maximum]} `keras.ops.max(keras.ops.matmul(z, z.T))`",
        f"{here}:{at[maximum]} `keras.ops.matmul(z, z.T)`",
    ]
    named = advice.split("its part only: ")[1].split(". For one device's")[0]
    assert sorted(named.split("; ")) == sorted(expected)
    assert "keras_ctl.all_gather" in advice
