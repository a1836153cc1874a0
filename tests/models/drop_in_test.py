"""CTLModel where code written for `keras.Model` expects Keras's semantics:
construction, pickling and copies, loss denominators, dtypes, and the
layers that meet a replica without examples."""

import copy
import pickle
import warnings

import configurations
import devices
import keras
import numpy as np
import pytest
import reported
import tensorflow as tf

import keras_ctl
from keras_ctl import CTLModel

CTL_BASES = CTLModel.__bases__


class Pair(CTLModel):
    """Two positional arguments of its own (keras.io's `VAE(encoder,
    decoder)`, `Distiller(student, teacher)`)."""

    def __init__(self, first, second, **kwargs):
        super().__init__(**kwargs)
        self.first, self.second = first, second

    def call(self, x):
        return self.second(self.first(x))


class FunctionalInside(CTLModel):
    """Its own constructor builds a functional model (`super().__init__(
    inputs, outputs)` with arguments the subclass was not given)."""

    def __init__(self, units):
        inputs = keras.Input((3,))
        super().__init__(inputs, keras.layers.Dense(units)(inputs))


def dense(units, seed):
    return keras.layers.Dense(
        units, kernel_initializer=keras.initializers.GlorotUniform(seed=seed)
    )


def test_a_subclass_keeps_its_own_positional_arguments():
    first, second = dense(2, 1), dense(1, 2)
    model = Pair(first, second)
    x = np.arange(6, dtype="float32").reshape(2, 3)
    np.testing.assert_allclose(model(x), second(first(x)), atol=1e-6)
    assert "Functional" not in [c.__name__ for c in type(model).__mro__]


def test_a_functional_construction_changes_no_later_one():
    functional = FunctionalInside(2)
    assert functional(np.ones((1, 3), "float32")).shape == (1, 2)
    assert CTLModel.__bases__ == CTL_BASES
    assert FunctionalInside.__bases__ == (CTLModel,)
    # A subclassed model after it is still subclassed (Keras's own tests
    # found this: every later `super().__init__()` raised a TypeError).
    model = Pair(dense(2, 1), dense(1, 2))
    assert model(np.ones((4, 3), "float32")).shape == (4, 1)


def functional(seed=3):
    inputs = keras.Input((3,))
    return CTLModel(inputs, dense(2, seed)(inputs))


@pytest.mark.parametrize("how", ["pickle", "deepcopy", "clone_model"])
def test_copies_of_a_functional_model(how):
    model = functional()
    model.compile(optimizer="sgd", loss="mse")
    x = np.random.default_rng(0).random((5, 3)).astype("float32")
    if how == "pickle":
        copied = pickle.loads(pickle.dumps(model))
    elif how == "deepcopy":
        copied = copy.deepcopy(model)
    else:
        copied = keras.models.clone_model(model)
        copied.set_weights(model.get_weights())
    assert isinstance(copied, CTLModel)
    np.testing.assert_array_equal(copied.predict(x, verbose=0), model(x))


def test_a_subclass_overriding_compile_loads_as_keras_says(tmp_path):
    class OwnCompile(CTLModel):
        def compile(self, *args, **kwargs):
            super().compile(*args, **kwargs)

    inputs = keras.Input((3,))
    model = OwnCompile(inputs, dense(1, 1)(inputs))
    model.compile(optimizer="sgd", loss="mse")
    config = model.get_compile_config()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.compile_from_config(config)
    assert any("compile()` was not called" in str(w.message) for w in caught)


@pytest.mark.slow  # for the fast tier's time; the suite runs it
@pytest.mark.parametrize("strategy", ["default", "mirrored"])
@pytest.mark.parametrize("case", sorted(set(reported.REPORTED) - reported.SLOW))
def test_reported_configurations_equal_keras(case, strategy):
    largest, tolerance = reported.difference(case, strategy)
    assert largest <= tolerance


def test_a_weighted_scalar_loss_is_refused_under_replicas():
    config = {**reported.BASE, "loss": "scalar_loss", "weights": "sample"}
    # One device: Keras's semantics (the value times the mean weight).
    found = configurations.differences(
        configurations.run(config, keras.Model), configurations.run(config, CTLModel)
    )
    assert max(found.values()) <= 1e-12
    with pytest.raises(ValueError, match="one value for the whole batch, weighted"):
        configurations.run(config, CTLModel, devices.get("mirrored"))


@pytest.mark.slow  # for the fast tier's time; the suite runs it
@pytest.mark.parametrize("strategy", ["default", "mirrored"])
def test_a_loss_with_its_own_call_trains_as_on_one_device(strategy):
    # Its `__call__` skips Keras's reduction: its value is the batch's loss.
    config = {**reported.BASE, "loss": "own_call_loss"}
    expected = configurations.run(config, keras.Model)
    actual = configurations.run(config, CTLModel, devices.get(strategy))
    assert max(configurations.differences(expected, actual).values()) <= 1e-5


def test_predict_after_jit_compile_under_replicas():
    x = np.random.default_rng(0).random((17, 3)).astype("float32")
    with devices.get("mirrored").scope():
        model = functional()
        model.compile(optimizer="sgd", loss="mse", jit_compile=True)
    predictions = model.predict(x, batch_size=8, verbose=0)
    np.testing.assert_allclose(predictions, model(x), atol=1e-6)


def test_float64_default_step_equals_keras_to_round_off():
    config = {**reported.BASE, "options": {"clipnorm": 0.05}, "weights": "class"}
    previous = keras.config.floatx()
    expected = configurations.run(config, keras.Model, floatx="float64")
    actual = configurations.run(config, CTLModel, floatx="float64")
    assert keras.config.floatx() == previous
    assert all(w.dtype == np.float64 for w in actual["weights"])
    assert max(configurations.differences(expected, actual).values()) <= 1e-12


def _two_view_model(base):
    """A step of one's own calling its compiled loss on two views'
    embeddings, not on the data's `(y, y_pred)` (keras.io's Barlow Twins)."""

    class TwoViews(base):
        def __init__(self):
            super().__init__()
            self.embed = dense(2, 3)

        def call(self, x):
            return self.embed(x)

        def train_step(self, data):
            view_a, view_b = data
            with tf.GradientTape() as tape:
                loss = self.loss(self(view_a), self(view_b))
            gradients = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply_gradients(zip(gradients, self.trainable_variables))
            return {"loss": loss}

    return TwoViews


@pytest.mark.parametrize("strategy", ["default", "mirrored"])
def test_a_step_calling_its_loss_on_other_tensors_than_the_data(strategy):
    # The data's second element (4 features) is no target of the model's
    # 2 outputs: Keras's build under a strategy, which calls the compiled
    # loss on them, failed; one device never calls it before the step.
    rng = np.random.default_rng(5)
    views = tuple(rng.random((17, 4)) for _ in range(2))

    def train(base, strategy):
        keras.utils.set_random_seed(0)
        with strategy.scope():
            model = _two_view_model(base)()
            model.compile(optimizer="sgd", loss=keras.losses.MeanSquaredError())
        data = tf.data.Dataset.from_tensor_slices(views).batch(8)
        history = model.fit(data, epochs=2, verbose=0)
        return model.get_weights(), history.history["loss"]

    with configurations.computing_in("float64"):
        expected = train(keras.Model, tf.distribute.get_strategy())
        got = train(CTLModel, devices.get(strategy))
    tolerance = 1e-12 if strategy == "default" else 1e-9
    for g, e in zip([*got[0], got[1]], [*expected[0], expected[1]], strict=True):
        np.testing.assert_allclose(g, e, rtol=tolerance)


def _triplet_model(base):
    """A step of its own over `(anchor, positive, negative)` batches, which
    its `call()` takes together (a triplet-loss embedding)."""

    class Triplets(base):
        def __init__(self):
            super().__init__()
            init = keras.initializers.GlorotUniform(seed=1)
            self.embed = keras.layers.Dense(4, kernel_initializer=init)

        def call(self, triplet):
            return [self.embed(part) for part in triplet]

        @keras_ctl.written_in_shares
        def train_step(self, data):
            with tf.GradientTape() as tape:
                anchor, positive, negative = self(data)
                margins = tf.maximum(
                    tf.reduce_sum(tf.square(anchor - positive), -1)
                    - tf.reduce_sum(tf.square(anchor - negative), -1)
                    + 0.5,
                    0.0,
                )
                if isinstance(self, CTLModel):
                    loss = keras_ctl.global_mean(margins)
                else:
                    loss = tf.reduce_mean(margins)
            gradients = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply(gradients, self.trainable_variables)
            if isinstance(self, CTLModel):
                return {"loss": keras_ctl.ReplicaSum(loss)}
            return {"loss": loss}

    return Triplets


@pytest.mark.parametrize("strategy", ["default", "mirrored"])
def test_batches_of_another_structure_reach_the_step_as_written(strategy):
    # Keras's build under a strategy reads a batch as `(x, y, sample_weight)`
    # and calls the model on the anchors alone; one device builds in the
    # step, and so does CTLModel under a strategy.
    rng = np.random.default_rng(6)
    triplets = tuple(rng.random((17, 3)) for _ in range(3))

    def train(base, strategy):
        with strategy.scope():
            model = _triplet_model(base)()
            model.compile(optimizer=keras.optimizers.SGD(0.1))
        data = tf.data.Dataset.from_tensor_slices(triplets).batch(8)
        history = model.fit(data, epochs=2, verbose=0)
        return model.get_weights(), history.history["loss"]

    with configurations.computing_in("float64"):
        expected = train(keras.Model, tf.distribute.get_strategy())
        got = train(CTLModel, devices.get(strategy))
    for g, e in zip([*got[0], got[1]], [*expected[0], expected[1]], strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-9, atol=1e-12)


def test_in_batch_classes_of_a_replica_without_examples():
    # An in-batch contrastive loss has as many classes as examples; a
    # replica without examples has scores of shape (0, 0), which
    # TensorFlow's crossentropy and argmax kernels refuse.
    strategy = devices.get("mirrored")
    scores = np.arange(9.0).reshape(3, 3) / 4
    per_replica = [scores, np.zeros((0, 0))]

    @tf.function
    def step(scores):
        # The seam's patches hold in a thread that runs a replica step.
        with keras_ctl._keras.replica_step():
            labels = tf.range(tf.shape(scores)[0])
            loss = keras.losses.sparse_categorical_crossentropy(
                labels, scores, from_logits=True
            )
            return loss, keras.ops.argmax(scores, axis=-1)

    def replica_scores(context):
        return tf.constant(per_replica[context.replica_id_in_sync_group])

    distributed = strategy.experimental_distribute_values_from_function(replica_scores)
    loss, argmax = strategy.run(step, args=(distributed,))
    losses = [t.numpy() for t in strategy.experimental_local_results(loss)]
    argmaxes = [t.numpy() for t in strategy.experimental_local_results(argmax)]
    expected = keras.losses.sparse_categorical_crossentropy(
        np.arange(3), scores, from_logits=True
    )
    np.testing.assert_allclose(losses[0], expected, rtol=1e-6)
    np.testing.assert_array_equal(argmaxes[0], [2, 2, 2])
    assert losses[1].shape == (0,) and argmaxes[1].shape == (0,)


def _raw_loss_model(base):
    """A step of one's own returning its loss as it is, under the name of
    Keras's loss tracker, which it never updates."""

    class RawLoss(base):
        def __init__(self):
            super().__init__()
            self.dense = dense(1, 4)

        def call(self, x):
            return self.dense(x)

        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                loss = keras.losses.MeanSquaredError()(y, self(x))
            gradients = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply_gradients(zip(gradients, self.trainable_variables))
            # Not only metric names: Keras logs these values as they are.
            return {"loss": loss, "kernel_norm": tf.norm(self.dense.kernel)}

    return RawLoss


def test_a_step_returning_its_own_loss_logs_it():
    # The logs re-read a metric named like an output only when the step
    # updated it: `loss` here is the step's value (was Keras's untouched
    # loss tracker, 0), as Keras logs it: the epoch's last step's. (When a
    # step's logs name exactly the metrics, Keras logs the metrics' results.)
    rng = np.random.default_rng(6)
    x, y = rng.random((17, 3)), rng.random((17, 1))

    def train(base, strategy):
        keras.utils.set_random_seed(0)
        with strategy.scope():
            model = _raw_loss_model(base)()
            model.compile(optimizer="sgd")
        history = model.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0)
        return history.history["loss"] + history.history["kernel_norm"]

    with configurations.computing_in("float64"):
        expected = train(keras.Model, tf.distribute.get_strategy())
        got = train(CTLModel, devices.get("mirrored"))
    assert min(expected) > 0.01
    np.testing.assert_allclose(got, expected, rtol=1e-9)


def _popping_model(base):
    """keras-rs's multi-task example: `compute_metrics` logs only the
    metrics that mean something in training."""

    class Popping(base):
        def compute_metrics(self, x, y, y_pred, sample_weight=None):
            logs = super().compute_metrics(x, y, y_pred, sample_weight)
            logs.pop("mae")
            return logs

    return Popping


@pytest.mark.parametrize("strategy", ["default", "mirrored"])
def test_the_logs_are_what_compute_metrics_returns(strategy):
    rng = np.random.default_rng(7)
    x, y = rng.random((17, 3)), rng.random((17, 2))

    def train(base, strategy):
        with strategy.scope():
            inputs = keras.Input((3,))
            init = keras.initializers.GlorotUniform(seed=2)
            outputs = keras.layers.Dense(2, kernel_initializer=init)(inputs)
            model = _popping_model(base)(inputs, outputs)
            model.compile(optimizer="sgd", loss="mse", metrics=["mae", "mse"])
        history = model.fit(
            x, y, batch_size=8, epochs=2, shuffle=False, verbose=0
        ).history
        return history, model.evaluate(x, y, batch_size=8, verbose=0, return_dict=True)

    with configurations.computing_in("float64"):
        expected = train(keras.Model, tf.distribute.get_strategy())
        got = train(CTLModel, devices.get(strategy))
    for found, wanted in zip(got, expected, strict=True):
        assert sorted(found) == sorted(wanted) == ["loss", "mse"]
        for key in wanted:
            np.testing.assert_allclose(found[key], wanted[key], rtol=1e-9)
