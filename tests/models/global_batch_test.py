"""A loss that couples the examples of the batch (in-batch negatives)
trains as on one device when its rows are `keras_ctl.all_gather`ed (from a
`compute_loss` of one's own and from a step of one's own), or, written for
one device, under `compile(compute_loss_over="global_batch")`, with XLA
too; so does a queue of embeddings filled from the gathered rows: on 2
replicas with uneven parts and an empty one (float64)."""

import configurations
import coupled_losses
import devices
import keras
import named_errors
import numpy as np
import pytest
import tensorflow as tf

import keras_ctl

# 19 rows in batches of 8: parts of 4/4, 4/4 and 3/0 on 2 replicas.
ROWS, BATCH = 19, 8


def in_batch_softmax(queries, candidates):
    """Each query's candidate against every other candidate of the batch."""
    scores = keras.ops.matmul(queries, keras.ops.transpose(candidates))
    labels = keras.ops.eye(keras.ops.shape(scores)[0], dtype=scores.dtype)
    return keras.ops.mean(
        keras.losses.categorical_crossentropy(labels, scores, from_logits=True)
    )


class GatheredComputeLoss(keras_ctl.CTLModel):
    def compute_loss(self, x, y, y_pred, sample_weight=None, training=True):
        return in_batch_softmax(keras_ctl.all_gather(y_pred), keras_ctl.all_gather(y))


class OneDeviceComputeLoss(keras.Model):
    def compute_loss(self, x, y, y_pred, sample_weight=None, training=True):
        return in_batch_softmax(y_pred, y)


class GatheredTrainStep(keras_ctl.CTLModel):
    @keras_ctl.written_in_shares
    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = in_batch_softmax(
                keras_ctl.all_gather(self(x, training=True)), keras_ctl.all_gather(y)
            )
            # Every replica computes the whole loss; gradients are summed.
            share = loss / keras_ctl.num_replicas()
        keras_ctl.minimize(share, self.trainable_weights, self.optimizer, tape)
        return {"loss": keras_ctl.Synchronized(loss)}


class LocalQueries(keras_ctl.CTLModel):
    """Queries stay on their replica, candidates are gathered: a query's
    positive is its row of the global batch (`row_offset`)."""

    def compute_loss(self, x, y, y_pred, sample_weight=None, training=True):
        candidates = keras_ctl.all_gather(y)
        scores = keras.ops.matmul(y_pred, keras.ops.transpose(candidates))
        positives = keras_ctl.row_offset(y_pred) + keras.ops.arange(
            keras.ops.shape(y_pred)[0]
        )
        return keras.ops.mean(
            keras.losses.sparse_categorical_crossentropy(
                positives, scores, from_logits=True
            )
        )


def as_shipped(inputs, outputs):
    """The one-device model, as written, made a `CTLModel`."""
    return keras_ctl.CTLModel.from_model(OneDeviceComputeLoss(inputs, outputs))


def trained(model_class, strategy, **compile_options):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, 5))
    y = rng.normal(size=(ROWS, 3))
    keras.utils.set_random_seed(1)
    with strategy.scope():
        inputs = keras.Input((5,))
        outputs = keras.layers.Dense(3)(keras.layers.Dense(6, "tanh")(inputs))
        model = model_class(inputs, outputs)
        model.compile(optimizer=keras.optimizers.SGD(0.5), **compile_options)
    history = model.fit(
        x, y, batch_size=BATCH, epochs=3, shuffle=False, verbose=0
    ).history
    return [np.asarray(w) for w in model.get_weights()], history["loss"]


@pytest.fixture(scope="module")
def one_device():
    with configurations.computing_in("float64"):
        return trained(OneDeviceComputeLoss, tf.distribute.get_strategy())


@pytest.mark.slow  # for the fast tier's time; the suite runs it
@pytest.mark.parametrize(
    "model_class, options",
    [
        (GatheredComputeLoss, {}),
        (GatheredTrainStep, {}),
        (LocalQueries, {}),
        (as_shipped, {"compute_loss_over": "global_batch"}),
        (as_shipped, {"compute_loss_over": "global_batch", "jit_compile": True}),
    ],
)
def test_a_coupled_loss_of_gathered_rows_equals_one_device(
    one_device, model_class, options
):
    expected_weights, expected_losses = one_device
    with configurations.computing_in("float64"):
        weights, losses = trained(model_class, devices.get("mirrored"), **options)
    for found, expected in zip(weights, expected_weights, strict=True):
        np.testing.assert_allclose(found, expected, atol=1e-9, rtol=0)
    if model_class is not GatheredTrainStep:  # which logs the last step's
        np.testing.assert_allclose(losses, expected_losses, rtol=1e-9)


def test_gathering_a_scalar_names_the_argument():
    with pytest.raises(ValueError, match=r"values.*shape \(\)"):
        keras_ctl.all_gather(tf.constant(1.0))
    with pytest.raises(ValueError, match=r"values.*shape \(\)"):
        keras_ctl.row_offset(tf.constant(1.0))


@pytest.mark.parametrize("rows", [(3, 2), (1, 0), (0, 2)])
def test_each_replicas_row_offset_is_where_its_rows_start(rows):
    strategy = devices.get("mirrored")

    def step(ids):
        return keras_ctl.row_offset(ids), keras_ctl.all_gather(ids)

    def parts(context):
        start = sum(rows[: context.replica_id_in_sync_group])
        return tf.range(start, start + rows[context.replica_id_in_sync_group])

    ids = strategy.experimental_distribute_values_from_function(parts)
    offsets, gathered = strategy.run(tf.function(step), args=(ids,))
    assert [int(o) for o in strategy.experimental_local_results(offsets)] == [
        0,
        rows[0],
    ]
    for replica in strategy.experimental_local_results(gathered):
        assert replica.numpy().tolist() == list(range(sum(rows)))
    assert int(keras_ctl.row_offset(tf.zeros((4, 2)))) == 0  # outside a step


def normalized_by_positives(base):
    """keras-hub RetinaNet's way: per-example weights divided by the
    batch's count of positives, then `super().compute_loss` with a compiled
    loss of `reduction="sum"`."""

    class NormalizedByPositives(base):
        def compute_loss(self, x, y, y_pred, sample_weight=None, training=True):
            positive = keras.ops.cast(y[:, 0] > 0, y.dtype)
            weights = positive / keras.ops.maximum(keras.ops.sum(positive), 1.0)
            return super().compute_loss(x, y, y_pred, weights, training=training)

    return NormalizedByPositives


def detection_run(base, strategy, **compile_options):
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(ROWS, 5)), rng.normal(size=(ROWS, 3))
    keras.utils.set_random_seed(1)
    with strategy.scope():
        inputs = keras.Input((5,))
        outputs = keras.layers.Dense(3, kernel_regularizer="l2")(inputs)
        model = normalized_by_positives(base)(inputs, outputs)
        model.compile(
            optimizer=keras.optimizers.SGD(0.1),
            loss=keras.losses.MeanSquaredError(reduction="sum"),
            metrics=["mae"],
            **compile_options,
        )
    history = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    return [np.asarray(w) for w in model.get_weights()], history.history


def test_a_normalizer_counted_over_the_batch_and_a_sum_equal_one_device():
    with configurations.computing_in("float64"):
        expected = detection_run(keras.Model, tf.distribute.get_strategy())
        found = detection_run(
            keras_ctl.CTLModel,
            devices.get("mirrored"),
            compute_loss_over="global_batch",
        )
    for got, want in zip(found[0], expected[0], strict=True):
        np.testing.assert_allclose(got, want, atol=1e-9, rtol=0)
    assert found[1].keys() == expected[1].keys()
    for key, values in expected[1].items():
        np.testing.assert_allclose(found[1][key], values, rtol=1e-9, err_msg=key)


def test_compute_loss_over_is_saved_and_checked():
    inputs = keras.Input((2,))
    model = keras_ctl.CTLModel(inputs, keras.layers.Dense(1)(inputs))
    with pytest.raises(ValueError, match=r"compute_loss_over.*'global'"):
        model.compile(loss="mse", compute_loss_over="global")
    model.compile(loss="mse", compute_loss_over="global_batch")
    assert model.get_compile_config()["compute_loss_over"] == "global_batch"


@pytest.mark.parametrize("rows", [(3, 2), (4, 0)])
def test_the_gather_and_its_gradient_are_one_devices(rows):
    """Each replica's gradient of the gathered batch's loss, with respect
    to its own rows, is one device's; the rows come in replica order."""
    strategy = devices.get("mirrored")
    data = np.arange(sum(rows) * 2, dtype="float64").reshape(-1, 2) / 10
    parts = np.split(data, np.cumsum(rows)[:-1])
    coupling = np.linspace(-1, 1, sum(rows))[:, None]

    def replica_rows(context):
        return tf.constant(parts[context.replica_id_in_sync_group])

    local = strategy.experimental_distribute_values_from_function(replica_rows)

    @tf.function
    def step(local):
        with tf.GradientTape() as tape:
            tape.watch(local)
            gathered = keras_ctl.all_gather(local)
            # A coupled loss: each row against the batch's mean.
            mean = tf.reduce_mean(gathered, axis=0)
            loss = tf.reduce_sum(coupling * (gathered - mean) ** 2)
            share = loss / keras_ctl.num_replicas()
        return gathered, tape.gradient(share, local)

    gathered, gradients = strategy.run(step, args=(local,))
    centered = data - data.mean(axis=0)
    one_device = 2 * (coupling * centered - (coupling * centered).mean(axis=0))
    expected = np.split(one_device, np.cumsum(rows)[:-1])
    for replica in range(2):
        np.testing.assert_array_equal(
            strategy.experimental_local_results(gathered)[replica], data
        )
        found = strategy.experimental_local_results(gradients)[replica]
        np.testing.assert_allclose(found, expected[replica], atol=1e-12, rtol=0)


QUEUE = 6


def queued(base):
    class Queued(base):
        """NNCLR's and MoCo's pattern: a queue of the latest embeddings, the
        batch's negatives with the queue's, filled from the global batch."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.queue = self.add_weight(
                shape=(QUEUE, 3), initializer="zeros", trainable=False, name="queue"
            )

        @keras_ctl.written_in_shares
        def train_step(self, data):
            x, _ = data
            with tf.GradientTape() as tape:
                z = keras_ctl.all_gather(self(x, training=True))
                support = tf.concat([z, tf.cast(self.queue, z.dtype)], 0)
                scores = tf.matmul(z, support, transpose_b=True)
                positives = tf.linalg.diag_part(scores[:, : tf.shape(z)[0]])
                loss = tf.reduce_mean(tf.reduce_logsumexp(scores, 1) - positives)
                share = loss / keras_ctl.num_replicas()
            gradients = tape.gradient(share, self.trainable_variables)
            self.optimizer.apply_gradients(zip(gradients, self.trainable_variables))
            self.queue.assign(tf.concat([tf.stop_gradient(z), self.queue], 0)[:QUEUE])
            return {"loss": loss}

    return Queued


def queue_run(base, strategy):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(17, 5))  # 8, 8, 1: one replica of 2 gets none
    keras.utils.set_random_seed(0)
    with strategy.scope():
        inputs = keras.Input((5,))
        model = queued(base)(inputs, keras.layers.Dense(3)(inputs))
        model.compile(optimizer=keras.optimizers.SGD(0.1))
    model.fit(x, np.zeros(17), batch_size=8, epochs=2, shuffle=False, verbose=0)
    return [np.asarray(w) for w in model.get_weights()]


def test_a_queue_filled_from_the_global_batch_equals_one_devices():
    with configurations.computing_in("float64"):
        expected = queue_run(keras.Model, tf.distribute.get_strategy())
        found = queue_run(keras_ctl.CTLModel, devices.get("mirrored"))
    assert np.abs(expected[-1]).min() > 0  # the queue holds embeddings
    for got, want in zip(found, expected, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-12, rtol=0)


def test_a_queue_given_other_rows_on_one_device_is_named_not_a_raw_error():
    """The last batch, 1 example, gives the queue 2 rows, not 6 (on 2
    replicas: tests/end_to_end/named_errors_test.py)."""
    message = named_errors.message("queue", devices.get("default"))
    said = "The step assigned a value of shape [2, 3] to a variable of shape [6, 3]"
    assert message.startswith(f"{said} ({named_errors.__file__}, line ")
    assert "in train_step)" in message and "replica" not in message
    assert "Give the value the variable's shape" in message


# The fast tier's seeds; tests/end_to_end/global_batch_sweep_test.py runs more.
FAST_SEEDS = range(4)


@pytest.mark.parametrize("seed", FAST_SEEDS)
def test_generated_coupled_losses_have_one_devices_gradients(seed):
    """A random mixture of coupled losses of gathered rows, the rows split
    at random over 2 replicas (some empty): the gradient summed over the
    replicas equals one device's, float64."""
    coupled_losses.check(seed, devices.get("mirrored"))


def label_embeddings(base):
    """keras-rs's sequential retrieval: the candidates are an embedding
    looked up for the batch's labels inside `compute_loss` (sparse
    gradients), scored against every query of the batch."""

    class LabelEmbeddings(base):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            init = keras.initializers.RandomNormal(seed=3)
            self.query = keras.layers.Dense(4, kernel_initializer=init)
            self.candidates = keras.layers.Embedding(7, 4, embeddings_initializer=init)
            self.candidates.build((None,))

        def call(self, x):
            return self.query(x)

        def compute_loss(self, x, y, y_pred, sample_weight=None, training=True):
            candidates = self.candidates(y)
            scores = keras.ops.matmul(y_pred, keras.ops.transpose(candidates))
            labels = keras.ops.eye(keras.ops.shape(scores)[0], dtype=scores.dtype)
            return keras.ops.mean(
                keras.losses.categorical_crossentropy(labels, scores, from_logits=True)
            )

    return LabelEmbeddings


def label_embeddings_run(base, strategy, **compile_options):
    rng = np.random.default_rng(4)
    x, y = rng.normal(size=(ROWS, 5)), rng.integers(0, 7, ROWS)
    with strategy.scope():
        model = label_embeddings(base)()
        model.compile(optimizer=keras.optimizers.Adam(0.05), **compile_options)
    history = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    return [np.asarray(w) for w in model.get_weights()], history.history["loss"]


def test_an_embedding_looked_up_for_gathered_labels_trains_with_adam_as_on_one_device():
    # Adam squares each slice of a sparse gradient: every replica weighing
    # its copy of the gathered lookups gave R slices per lookup.
    with configurations.computing_in("float64"):
        expected = label_embeddings_run(keras.Model, tf.distribute.get_strategy())
        got = label_embeddings_run(
            keras_ctl.CTLModel,
            devices.get("mirrored"),
            compute_loss_over="global_batch",
        )
    pairs = zip([*got[0], got[1]], [*expected[0], expected[1]], strict=True)
    for found, wanted in pairs:
        np.testing.assert_allclose(found, wanted, rtol=1e-9, atol=1e-12)
