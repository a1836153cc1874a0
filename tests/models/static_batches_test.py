"""The part of `TPUStrategy`'s regime a CPU can check (docs/guides/tpu.md).

TPUs compile the whole replica step with XLA, on static shapes. The recipe
the guide gives: pad the data to full global batches with examples of
sample weight 0, and divide the loss by the weight sum
(`reduction="mean_with_sample_weight"`). Then every batch has one shape, no
replica is ever empty, and the run equals one device on the data unpadded.
"""

import devices
import keras
import numpy as np
import pytest
from small_classifier import assert_weights_equal
from small_classifier import functional
from small_classifier import small_data

import keras_ctl

GLOBAL_BATCH = 16


def padded(x, y, global_batch):
    """`(x, y, sample_weight)` padded to whole batches with weight-0 rows."""
    missing = -len(x) % global_batch
    weights = np.concatenate([np.ones(len(x)), np.zeros(missing)]).astype("float32")
    x = np.concatenate([x, np.zeros((missing, *x.shape[1:]), x.dtype)])
    y = np.concatenate([y, np.zeros((missing, *y.shape[1:]), y.dtype)])
    return x, y, weights


def train(model, x, y, sample_weight=None, **compile_options):
    # Padded data divides by the weight sum; the reference, Keras's default.
    reduction = "mean_with_sample_weight" if sample_weight is not None else None
    with model.distribute_strategy.scope():
        model.compile(
            optimizer=keras.optimizers.SGD(0.1),
            loss=keras.losses.SparseCategoricalCrossentropy(
                from_logits=True, reduction=reduction or "sum_over_batch_size"
            ),
            **compile_options,
        )
    model.fit(
        x,
        y,
        sample_weight=sample_weight,
        batch_size=GLOBAL_BATCH,
        epochs=2,
        shuffle=False,
        verbose=0,
    )
    return model


@pytest.mark.parametrize("kind", ["default", "mirrored"])
def test_padded_static_batches_equal_one_device_unpadded(kind):
    x, y = small_data(101)  # the last batch: 5 examples
    reference = train(functional(keras.Model), x, y)
    x_padded, y_padded, weights = padded(x, y, GLOBAL_BATCH)
    assert len(x_padded) == 112 and weights.sum() == 101
    strategy = devices.get(kind)
    with strategy.scope():
        model = functional(keras_ctl.CTLModel)
    # One device: the whole replica step compiled by XLA, as a TPU compiles
    # it. Two replicas: the last batch gives replica 1 only weight-0 rows.
    jit_compile = strategy.num_replicas_in_sync == 1
    train(model, x_padded, y_padded, weights, jit_compile=jit_compile)
    assert model.jit_compile == jit_compile
    assert_weights_equal(model, reference)
    np.testing.assert_allclose(
        model.evaluate(x, y, verbose=0),
        reference.evaluate(x, y, verbose=0),
        atol=1e-5,
    )
