"""The exact division, one rule at a time: replicas' shares sum to one device.

Each test splits one batch across the 2 in-process replicas, unevenly or
with an empty replica, and checks that the shares add up to what Keras
computes for the whole batch on one device.
"""

import devices
import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_ctl
from keras_ctl import _keras
from keras_ctl._engine import loss as loss_module
from keras_ctl._engine.padding import pad_empty_batch
from keras_ctl._replicas import global_shares

ATOL = 1e-6
SPLITS = {"uneven": 5, "empty_replica": 7}  # examples on replica 0 of 7


def batch(n=7, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, (n,)).astype("int32")
    y_pred = rng.normal(size=(n, 3)).astype("float32")
    weight = rng.uniform(0.2, 2.0, (n,)).astype("float32")
    return y, y_pred, weight


def on_replicas(fn, *arrays, split):
    """Sums `fn(*replica_parts, batch_size)` over the 2 replicas."""
    strategy = devices.get("mirrored")
    parts = [[a[:split] for a in arrays], [a[split:] for a in arrays]]
    values = strategy.experimental_distribute_values_from_function(
        lambda context: tuple(
            tf.constant(p) for p in parts[context.replica_id_in_sync_group]
        )
    )

    @tf.function
    def run(values):
        def replica(data):
            data, batch_size = pad_empty_batch(data)
            return fn(*data, batch_size)

        return strategy.reduce("SUM", strategy.run(replica, args=(values,)), None)

    return float(run(values))


def compiled(loss):
    inputs = keras.Input((3,))
    with devices.get("mirrored").scope():
        model = keras_ctl.CTLModel(inputs, keras.layers.Identity()(inputs))
        model.compile(optimizer="sgd", loss=loss)
    return _keras.compile_loss(model)


@pytest.mark.parametrize("split", SPLITS.values(), ids=SPLITS.keys())
@pytest.mark.parametrize(
    "reduction, weighted",
    [
        ("sum_over_batch_size", False),
        ("sum_over_batch_size", True),
        ("sum", False),
        ("sum", True),
        ("mean_with_sample_weight", True),
    ],
)
def test_compiled_loss_shares_sum_to_one_device(reduction, weighted, split):
    loss = keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction=reduction
    )
    y, y_pred, weight = batch()
    compile_loss = compiled(loss)

    def share(y, y_pred, weight, batch_size):
        w = weight if weighted else None
        terms = loss_module.loss_terms(compile_loss, y, y_pred, w, batch_size)
        shares = loss_module.compiled_loss_shares(terms, batch_size)
        return shares.total

    got = on_replicas(share, y, y_pred, weight, split=split)
    expected = float(loss(y, y_pred, sample_weight=weight if weighted else None))
    assert got == pytest.approx(expected, abs=ATOL)


@pytest.mark.parametrize("split", SPLITS.values(), ids=SPLITS.keys())
def test_global_batch_size_counts_real_examples_only(split):
    y, y_pred, weight = batch()
    compile_loss = compiled("mse")

    def global_batch(y, y_pred, weight, batch_size):
        y_true = tf.one_hot(y, 3)
        terms = loss_module.loss_terms(compile_loss, y_true, y_pred, None, batch_size)
        shares = loss_module.compiled_loss_shares(terms, batch_size)
        return shares.global_batch_size / 2.0  # summed over 2 replicas

    assert on_replicas(global_batch, y, y_pred, weight, split=split) == 7.0


@pytest.mark.parametrize("split", SPLITS.values(), ids=SPLITS.keys())
@pytest.mark.parametrize("weighted", [False, True])
def test_global_mean_shares_sum_to_the_global_mean(weighted, split):
    _, values, weight = batch()

    def share(values, weight, batch_size):
        has_examples = tf.cast(batch_size > 0, "float32")
        w = (weight if weighted else tf.ones_like(weight)) * has_examples
        return keras_ctl.global_mean(values, w[:, None])

    got = on_replicas(share, values, weight, split=split)
    w = weight if weighted else np.ones_like(weight)
    expected = (values * w[:, None]).sum() / (w.sum() * 3)
    assert got == pytest.approx(float(expected), abs=ATOL)


def test_global_mean_rejects_a_scalar():
    with pytest.raises(ValueError, match=r"Received: values with shape \(\)"):
        keras_ctl.global_mean(tf.constant(1.0))


def test_scaled_regularization_loss_counts_once_per_global_batch():
    def share(values, batch_size):
        return keras_ctl.scaled_regularization_loss([tf.constant(3.0), tf.ones(2)])

    assert on_replicas(share, np.zeros((4, 1), "float32"), split=2) == 5.0


def test_scaled_regularization_loss_of_nothing_is_zero():
    assert float(keras_ctl.scaled_regularization_loss([])) == 0.0


def test_one_collective_divides_every_sum_by_its_own_count():
    def shares(values, batch_size):
        sums = [tf.reduce_sum(values), 2.0 * tf.reduce_sum(values), tf.constant(1.0)]
        counts = [tf.cast(batch_size, "float32"), tf.constant(4.0), None]
        divided, _ = global_shares(sums, counts)
        return tf.stack(divided)

    values = np.arange(6, dtype="float32")[:, None]
    total = on_replicas(lambda v, n: shares(v, n)[0], values, split=4)
    assert total == pytest.approx(values.sum() / 6)
    total = on_replicas(lambda v, n: shares(v, n)[1], values, split=4)
    assert total == pytest.approx(2.0 * values.sum() / 8)
    total = on_replicas(lambda v, n: shares(v, n)[2], values, split=4)
    assert total == 2.0  # a sum without a count is added as it is


@pytest.mark.parametrize("split", SPLITS.values(), ids=SPLITS.keys())
def test_the_core_leaves_out_an_empty_replica_and_values_shares_as_the_mean(split):
    values = np.arange(1.0, 8.0, dtype="float32")[:, None]

    def share(values, batch_size):
        # The placeholder row is 0: its log is -inf, its sum NaN-prone.
        log_sum = tf.reduce_sum(tf.math.log(values))
        (mean,), (count,) = global_shares(
            [log_sum],
            [tf.cast(batch_size, "float32")],
            examples=batch_size,
            valued_as_global=True,
        )
        return mean + 0.0 * count

    # Each replica's share is valued as the global mean: 2 of them.
    expected = 2 * np.log(values).mean()
    assert on_replicas(share, values, split=split) == pytest.approx(expected)


def test_the_core_divides_by_given_global_counts_without_a_collective():
    def share(values, batch_size):
        (mean,), counts = global_shares(
            [tf.reduce_sum(values)], [tf.ones(())], global_counts=[10.0]
        )
        return mean

    values = np.arange(6, dtype="float32")[:, None]
    assert on_replicas(share, values, split=4) == pytest.approx(15.0 / 10.0)


def test_padding_gives_an_empty_replica_one_zero_example():
    def padded_size(values, batch_size):
        return tf.cast(batch_size, "float32") * 100.0 + tf.cast(
            tf.shape(values)[0], "float32"
        )

    values = np.ones((3, 2), "float32")
    # Replica 0 holds 3 real examples; replica 1 holds 0 plus a placeholder.
    assert on_replicas(padded_size, values, split=3) == 300.0 + 3.0 + 1.0
