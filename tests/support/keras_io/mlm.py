"""nlp/masked_language_modeling.py: `MaskedLanguageModel`, whose
`compute_loss` sums a `reduction=None` loss and updates its own tracker,
and whose `compute_metrics` returns that tracker.

Changed: sizes (5 tokens of a 9-word vocabulary, one embedding and a dense
layer in place of the BERT encoder). Its `compute_loss` is a sum over the
batch's tokens, not a batch's mean: as written, keras_ctl measures it so
and reads it in shares (each replica's sum summed as it is); parity mode
compiles the `CTLModel` with `compute_loss_over="global_batch"`, where it
sums the global batch's.
"""

import keras
import numpy as np
from cases import _dense as dense
from keras import layers

import keras_io

SOURCE = "examples/nlp/masked_language_modeling.py"


def model_class(base):
    loss_fn = keras.losses.SparseCategoricalCrossentropy(reduction=None)
    loss_tracker = keras.metrics.Mean(name="loss")

    class MaskedLanguageModel(base):
        def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None):
            loss = loss_fn(y, y_pred, sample_weight)
            loss_tracker.update_state(loss, sample_weight=sample_weight)
            return keras.ops.sum(loss)

        def compute_metrics(self, x, y, y_pred, sample_weight):
            # Return a dict mapping metric names to current value
            return {"loss": loss_tracker.result()}

        @property
        def metrics(self):
            # We list our `Metric` objects here so that `reset_states()` can be
            # called automatically at the start of each epoch
            # or at the start of `evaluate()`.
            # If you don't implement this property, you have to call
            # `reset_states()` yourself at the time of your choosing.
            return [loss_tracker]

    return MaskedLanguageModel


def train(base, strategy, parity=True):
    rng = np.random.default_rng(1)
    tokens = rng.integers(1, 9, (keras_io.SIZE, 5))
    masked = rng.random((keras_io.SIZE, 5)) < 0.4
    x = np.where(masked, 0, tokens)
    sample_weight = masked.astype(keras.config.floatx())
    with strategy.scope():
        inputs = keras.Input((5,), dtype="int64")
        embedded = layers.Embedding(
            9, 4, embeddings_initializer=keras.initializers.RandomNormal(seed=4)
        )(inputs)
        outputs = dense(9, 5, activation="softmax")(embedded)
        model = model_class(base)(inputs, outputs)
        options = {}
        if parity and base is not keras.Model:  # changed: the global batch's sum
            options["compute_loss_over"] = "global_batch"
        model.compile(optimizer=keras.optimizers.Adam(0.01), **options)
    history = model.fit(
        x,
        tokens,
        sample_weight=sample_weight,
        batch_size=keras_io.BATCH,
        epochs=keras_io.EPOCHS,
        shuffle=False,
        verbose=0,
    )
    return keras_io.result(model, history)
