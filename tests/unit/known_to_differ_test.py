"""The parity kit names the parts of a model known to differ from one
device, each with what to do."""

import keras

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
    found = dict(known_to_differ(functional(keras_ctl.CTLModel)))
    assert set(found) == {
        "active (Dense)",
        "bn (BatchNormalization)",
        "drop (Dropout)",
        "noise (GaussianNoise)",
    }
    assert "synchronized=True" in found["bn (BatchNormalization)"]
    assert "rate=0" in found["drop (Dropout)"]
    assert "weight regularizer" in found["active (Dense)"]


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


class SumOfLosses(keras_ctl.CTLModel):
    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None,
                     training=True):
        return keras.ops.sum(keras.ops.square(y_pred))


def test_a_compute_loss_of_ones_own_is_named_with_its_rule():
    inputs = keras.Input((4,))
    found = known_to_differ(SumOfLosses(inputs, keras.layers.Dense(2)(inputs)))
    assert [where for where, _ in found] == ["SumOfLosses.compute_loss"]
    assert "read as on one device" in found[0][1]
    assert 'reduction="sum"' in found[0][1]
    assert 'compute_loss_over="global_batch"' in found[0][1]


def test_a_compute_loss_over_the_global_batch_is_not_named():
    inputs = keras.Input((4,))
    model = SumOfLosses(inputs, keras.layers.Dense(2)(inputs))
    model.compile(loss="mse", compute_loss_over="global_batch")
    assert known_to_differ(model) == []
