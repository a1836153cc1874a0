"""A step of one's own means one thing however it is spelled: the
global-batch guide's recipe declared `written_in_shares` equals one device
whether the declaration sits on the step, a mixin, a library's base class,
a module-level function, a user's decorator, a `functools.partialmethod`
or a lambda set on the instance, and whether the rows are gathered inline,
in a helper of another module or through an alias import; the same recipe
undeclared is refused at its first trace, naming the call; one device's
code that gathers rows (a loss of the global batch without `1 / R`, a
batch statistic in a layer) equals one device; a replica count read in
the step is refused, one read outside it is logged (float64, 2 replicas,
the last batch leaving a replica empty)."""

import configurations
import devices
import keras
import numpy as np
import pytest
import recipe_spellings
import tensorflow as tf

import keras_ctl

# 17 rows in batches of 8: parts of 4/4, 4/4 and 1/0 on 2 replicas.
ROWS, BATCH = 17, 8


def trained(model_class, strategy):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, 5))
    y = rng.normal(size=(ROWS, 3))
    with configurations.computing_in("float64"):
        keras.utils.set_random_seed(1)
        with strategy.scope():
            inputs = keras.Input((5,))
            outputs = keras.layers.Dense(3)(keras.layers.Dense(6, "tanh")(inputs))
            model = model_class(inputs, outputs)
            model.compile(optimizer=keras.optimizers.Adam(0.05))
        history = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    return model.get_weights(), history.history


def assert_one_devices(model_of, skip=()):
    expected_weights, expected_logs = trained(
        model_of(keras.Model), tf.distribute.get_strategy()
    )
    weights, logs = trained(model_of(keras_ctl.CTLModel), devices.get("mirrored"))
    for found, expected in zip(weights, expected_weights, strict=True):
        np.testing.assert_allclose(found, expected, atol=1e-12, rtol=0)
    for key in expected_logs.keys() - set(skip):
        np.testing.assert_allclose(logs[key], expected_logs[key], atol=1e-12, rtol=0)
    return logs


@pytest.mark.slow
@pytest.mark.parametrize("spelling", recipe_spellings.DECLARED)
def test_the_declared_recipe_equals_one_device_in_every_spelling(spelling):
    assert_one_devices(lambda base: recipe_spellings.model_class(spelling, base))


@pytest.mark.slow  # for the fast tier's time; the suite runs it
@pytest.mark.parametrize("spelling", recipe_spellings.UNDECLARED)
def test_the_undeclared_recipe_is_refused_by_name_in_every_spelling(spelling):
    model_class = recipe_spellings.model_class(spelling, keras_ctl.CTLModel, False)
    with pytest.raises(ValueError, match="read as one device's code") as raised:
        trained(model_class, devices.get("mirrored"))
    message = str(raised.value)
    assert ".train_step is read as one device's code" in message
    assert "`keras_ctl.num_replicas`" in message
    assert "recipe_" in message  # the file of the call
    assert "@keras_ctl.written_in_shares" in message
    assert "keras_ctl.all_gather" in message


@pytest.mark.slow  # for the fast tier's time; the suite runs it
def test_a_replica_count_read_in_the_step_is_refused_and_one_read_outside_logs():
    with pytest.raises(ValueError, match="`keras_ctl.num_replicas`") as raised:
        trained(
            recipe_spellings.logs_replica_count(keras_ctl.CTLModel, read_in_step=True),
            devices.get("mirrored"),
        )
    assert "self.replicas = keras_ctl.num_replicas()" in str(raised.value)
    logs = assert_one_devices(recipe_spellings.logs_replica_count, skip=("replicas",))
    assert logs["replicas"] == [2, 2]


@pytest.mark.slow  # for the fast tier's time; the suite runs it
@pytest.mark.parametrize("spelling", ["inline", "alias_import"])
def test_gathered_rows_in_one_devices_code_equal_one_device(spelling):
    # No `1 / num_replicas()`, no declaration: the loss of the global batch
    # as one device computes it, its gradient weighed as one device's.
    assert_one_devices(lambda base: recipe_spellings.one_devices_gather(base, spelling))


@pytest.mark.slow  # for the fast tier's time; the suite runs it
def test_a_batch_statistic_gathered_in_a_layer_equals_one_device():
    assert_one_devices(recipe_spellings.batch_statistic_in_a_layer)


class HalfAndHalf(keras_ctl.CTLModel):
    """Declares shares after its loss was read as one device's."""

    def train_step(self, data):
        x, y = data
        loss = keras.losses.MeanSquaredError()(y, self(x, training=True))
        return keras_ctl.written_in_shares(lambda: {"loss": loss})()


def test_a_declaration_after_a_loss_is_refused():
    with pytest.raises(ValueError, match="after the step already computed a loss"):
        trained(HalfAndHalf, devices.get("mirrored"))


class TutorialLoss(keras_ctl.CTLModel):
    """The TensorFlow tutorial's loss scaling, through an alias."""

    def train_step(self, data):
        x, y = data
        average = tf.nn.compute_average_loss
        with tf.GradientTape() as tape:
            per_example = keras.ops.mean(
                keras.ops.square(self(x, training=True) - y), -1
            )
            loss = average(per_example, global_batch_size=BATCH)
        self.optimizer.apply(
            tape.gradient(loss, self.trainable_weights), self.trainable_weights
        )
        return {"loss": loss}


def test_tensorflows_replica_arithmetic_is_seen_under_any_name():
    with pytest.raises(ValueError, match="`tf.nn.compute_average_loss`"):
        trained(TutorialLoss, devices.get("mirrored"))
    declared = type(
        "Declared",
        (TutorialLoss,),
        {"train_step": keras_ctl.written_in_shares(TutorialLoss.train_step)},
    )
    weights, _ = trained(declared, devices.get("mirrored"))
    assert np.all(np.isfinite(weights[0]))


class ScaledComputeLoss(keras_ctl.CTLModel):
    """A `compute_loss` of one's own dividing by the replica count."""

    def compute_loss(self, x, y, y_pred, sample_weight=None, training=True):
        loss = keras.ops.mean(keras.ops.square(y_pred - y))
        return loss / keras_ctl.num_replicas()


def test_a_replica_count_in_a_compute_loss_of_ones_own_is_refused():
    with pytest.raises(ValueError, match="ScaledComputeLoss.compute_loss is read"):
        trained(ScaledComputeLoss, devices.get("mirrored"))


def test_the_watch_is_gone_after_a_refused_step():
    import sys

    before = sys.getprofile()
    with pytest.raises(ValueError, match="read as one device's code"):
        trained(
            recipe_spellings.model_class("alias_import", keras_ctl.CTLModel, False),
            devices.get("mirrored"),
        )
    assert sys.getprofile() is before
