"""Generated losses that couple the batch's rows, and the check that their
gradient on gathered rows, summed over replicas, is one device's."""

import keras
import numpy as np
import tensorflow as tf

import keras_ctl


def coupled_terms(z, t, w):
    """Losses that couple the batch's rows, each a scalar of the whole batch."""
    scores = tf.matmul(z, t, transpose_b=True)
    eye = tf.eye(tf.shape(z)[0], dtype=z.dtype)
    normalized = (z - tf.reduce_mean(z, 0)) / (tf.math.reduce_std(z, 0) + 1e-3)
    correlation = tf.matmul(normalized, t, transpose_a=True) / tf.cast(
        tf.shape(z)[0], z.dtype
    )
    positives = tf.cast(w > 0.5, z.dtype)
    hardest = tf.reduce_max(scores - 1e3 * eye, axis=1)
    return (
        # in-batch softmax, weighted by example
        tf.reduce_sum(
            w * keras.losses.categorical_crossentropy(eye, scores, from_logits=True)
        )
        / tf.reduce_sum(w),
        # a cross-correlation of the batch (Barlow Twins)
        tf.reduce_sum(tf.square(correlation - tf.eye(3, dtype=z.dtype))),
        # a normalizer counted over the batch (positives)
        tf.math.divide_no_nan(
            tf.reduce_sum(positives * tf.reduce_sum(tf.square(z - t), 1)),
            tf.reduce_sum(positives),
        ),
        # the hardest negative of the batch
        tf.reduce_mean(tf.nn.relu(1.0 + hardest - tf.linalg.diag_part(scores))),
    )


def check(seed, strategy):
    """Seed `seed`'s random mixture of `coupled_terms`, the rows split at
    random over `strategy`'s 2 replicas (some empty): each replica's loss
    and the gradient summed over the replicas equal one device's (float64,
    1e-9)."""
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, 6, 2)
    rows[rng.integers(2)] += 1  # at least one example
    n = int(rows.sum())
    x, t = rng.normal(size=(n, 4)), rng.normal(size=(n, 3))
    w = rng.random(n) + 0.1
    kernel = tf.Variable(rng.normal(size=(4, 3)))
    mixture = rng.random(4) * (rng.random(4) < 0.7)
    mixture[rng.integers(4)] += 0.5  # at least one term

    def loss_of(x, t, w):
        z = tf.tanh(tf.matmul(x, kernel))
        z, t, w = (keras_ctl.all_gather(v) for v in (z, t, w))
        return tf.add_n([m * term for m, term in zip(mixture, coupled_terms(z, t, w))])

    with tf.GradientTape() as tape:
        expected_loss = loss_of(x, t, w)
    expected = tape.gradient(expected_loss, kernel).numpy()

    split = np.cumsum(rows)[:-1]
    parts = [np.split(v, split) for v in (x, t, w)]
    local = [
        strategy.experimental_distribute_values_from_function(
            lambda context, p=p: tf.constant(p[context.replica_id_in_sync_group])
        )
        for p in parts
    ]

    @tf.function
    def step(x, t, w):
        with tf.GradientTape() as tape:
            loss = loss_of(x, t, w)
            share = loss / keras_ctl.num_replicas()
        gradient = tape.gradient(share, kernel)
        summed = tf.distribute.get_replica_context().all_reduce("SUM", gradient)
        return loss, summed

    losses, gradients = strategy.run(step, args=local)
    for loss, gradient in zip(
        strategy.experimental_local_results(losses),
        strategy.experimental_local_results(gradients),
    ):
        np.testing.assert_allclose(loss.numpy(), expected_loss.numpy(), rtol=1e-9)
        np.testing.assert_allclose(gradient.numpy(), expected, atol=1e-9, rtol=0)
