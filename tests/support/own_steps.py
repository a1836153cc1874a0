"""Steps of one's own written for one device, the way keras.io writes them:
local means (`tf.reduce_mean`, `ops.mean`, `sum / count`), a layer
singular at zero, a metric logged under another key, two tapes and two
optimizers, a `train_step` decorated with `tf.function` and an optimizer per
layer, Adam's sparse update of an embedding, `keras.remat`, a layer only
the step calls (built by its first call), a variable the step creates on
its first call, a synchronized BatchNorm (in batches of 5: uneven
replicas), a sum over examples in a step marked written in shares, a
cross-entropy of a `Softmax` layer's probabilities, Keras `Loss` objects
mixed
with raw terms, and a `test_step`.
Each builds on `base` (`keras.Model` for the one-device reference) and
trains in float64 on 13 examples in batches of 4: the last batch leaves a
replica empty on 2 replicas and two on 3.
"""

import keras
import numpy as np
import tensorflow as tf
from configurations import computing_in
from keras import ops

import keras_ctl

SIZE, BATCH, EPOCHS = 13, 4, 2


def data(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(SIZE, 4))
    y = rng.integers(0, 3, size=(SIZE,))
    return x, y


class LogSquare(keras.layers.Layer):
    """`log(x^2)`: singular at 0 (MelGAN's dB spectrogram), finite on the data."""

    def call(self, x):
        return ops.log(ops.square(x))


class Rematerialized(keras.layers.Layer):
    """Two dense layers whose activations `keras.remat` recomputes in the
    backward pass."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.first = keras.layers.Dense(
            4, activation="tanh", kernel_initializer=keras.initializers.Orthogonal(3)
        )
        self.second = keras.layers.Dense(
            4, activation="tanh", kernel_initializer=keras.initializers.Orthogonal(4)
        )

    def call(self, x):
        return keras.remat(lambda t: self.second(self.first(t)))(x)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], 4)


def _network(case):
    if case == "sparse_adam":
        inputs = keras.Input((4,), dtype="int32")
        h = keras.layers.Embedding(20, 3, name="embedding")(inputs)
        h = keras.layers.GlobalAveragePooling1D()(h)
    else:
        inputs = keras.Input((4,))
        h = LogSquare()(inputs) if case == "singular_layer" else inputs
        h = Rematerialized()(h) if case == "remat" else h
    regularizer = keras.regularizers.l2(1e-2) if case == "regularized" else None
    h = keras.layers.Dense(
        5,
        activation="tanh",
        kernel_regularizer=regularizer,
        kernel_initializer=keras.initializers.GlorotUniform(seed=1),
        name="body",
    )(h)
    if case == "synchronized_bn":
        h = keras.layers.BatchNormalization(synchronized=True)(h)
    if case == "softmax_output":
        # Large logits: probabilities clipped where Keras's cross-entropy
        # does not use the softmax's logits.
        head = keras.layers.Dense(
            3, kernel_initializer=keras.initializers.RandomNormal(0, 10, seed=2)
        )
        return inputs, keras.layers.Softmax(name="head")(head(h))
    outputs = keras.layers.Dense(
        3, kernel_initializer=keras.initializers.GlorotUniform(seed=2), name="head"
    )(h)
    return inputs, outputs


def _crossentropy(y, logits):
    return keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)


def model_class(base, case):
    """`base` with the step of `case`."""

    class OwnStep(base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.loss_tracker = keras.metrics.Mean(name="loss")
            self.probe = keras.metrics.SparseCategoricalAccuracy(name="probe")
            if case == "lazy_layer":  # a head only the step calls
                self.extra = keras.layers.Dense(
                    3, kernel_initializer=keras.initializers.GlorotUniform(seed=5)
                )

        @property
        def metrics(self):
            return [self.loss_tracker, self.probe]

        def losses_of(self, x, y, training):
            logits = self(x, training=training)
            if case == "lazy_layer":
                logits = logits + self.extra(x)
            if case == "keras_loss_objects":
                loss = self.loss_fn(y, logits) + 0.1 * ops.mean(ops.abs(logits))
            elif case == "sum_over_count":
                per_example = _crossentropy(y, logits)
                loss = ops.sum(per_example) / ops.cast(ops.shape(y)[0], "float64")
            elif case == "softmax_output":  # probabilities: Keras finds the logits
                probabilities = logits
                per_example = keras.losses.sparse_categorical_crossentropy(
                    y, probabilities
                )
                loss = tf.reduce_mean(per_example)
            else:
                loss = tf.reduce_mean(_crossentropy(y, logits))
            if self.losses:
                loss = loss + ops.sum(self.losses)
            return logits, loss

        def train_step(self, data):
            x, y = data
            if case == "two_optimizers":
                return self.two_optimizers_step(x, y)
            if case == "variable_in_step":
                return self.counting_step(x, y)
            with tf.GradientTape() as tape:
                logits, loss = self.losses_of(x, y, training=True)
            gradients = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply(gradients, self.trainable_variables)
            self.loss_tracker.update_state(loss)
            self.probe.update_state(y, logits)
            return {
                "loss": self.loss_tracker.result(),
                "p_acc": self.probe.result(),  # another key than its name
                "batch_loss": loss,
            }

        def two_optimizers_step(self, x, y):
            body = self.get_layer("body").trainable_variables
            head = self.get_layer("head").trainable_variables
            with tf.GradientTape(persistent=True) as tape:
                logits, loss = self.losses_of(x, y, training=True)
                head_loss = ops.mean(ops.square(logits))
                head_total = loss + 0.01 * head_loss
            self.optimizer.apply_gradients(zip(tape.gradient(loss, body), body))
            self.head_optimizer.apply(tape.gradient(head_total, head), head)
            self.loss_tracker.update_state(loss)
            return {"loss": self.loss_tracker.result(), "head_loss": head_loss}

        def counting_step(self, x, y):
            if not hasattr(self, "steps_taken"):  # made by the first call
                self.steps_taken = tf.Variable(0.0, dtype="float64", trainable=False)
            self.steps_taken.assign_add(1.0)
            with tf.GradientTape() as tape:
                _, loss = self.losses_of(x, y, training=True)
                loss = loss / self.steps_taken  # a schedule of its own
            gradients = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply(gradients, self.trainable_variables)
            return {"loss": loss, "steps": self.steps_taken}

        def test_step(self, data):
            x, y = data
            logits, loss = self.losses_of(x, y, training=False)
            self.probe.update_state(y, logits)
            return {"p_acc": self.probe.result(), "batch_loss": loss}

    if case == "sum_in_shares":
        return SumInShares(OwnStep)
    if case == "gathered_metrics":
        return GatheredInShares(OwnStep)
    if case != "tf_function":
        return OwnStep

    class DecoratedStep(OwnStep):
        """A `train_step` decorated with its own `tf.function`, one optimizer
        per layer applied inside it."""

        @tf.function
        def train_step(self, data):
            x, y = data
            with tf.GradientTape(persistent=True) as tape:
                logits, loss = self.losses_of(x, y, training=True)
            for name, optimizer in self.optimizer_of_layer.items():
                variables = self.get_layer(name).trainable_variables
                optimizer.apply(tape.gradient(loss, variables), variables)
            self.loss_tracker.update_state(loss)
            return {"loss": self.loss_tracker.result()}

    return DecoratedStep


def SumInShares(base):  # noqa: N802
    """A loss that is a sum over examples, in a step marked written in
    shares: each replica's sum, the replicas' gradients summed."""

    class SumInShares(base):
        @keras_ctl.written_in_shares
        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                logits = self(x, training=True)
                loss = _crossentropy(y, logits)  # one value per example
            # `tape.gradient` sums the per-example losses' gradients.
            gradients = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply(gradients, self.trainable_variables)
            self.probe.update_state(y, logits)
            total = ops.sum(loss)
            if isinstance(self, keras_ctl.CTLModel):
                total = keras_ctl.ReplicaSum(total)
            return {"loss": total, "p_acc": self.probe.result()}

    return SumInShares


def GatheredInShares(base):  # noqa: N802
    """The global-batch guide's recipe (keras.io's NNCLR in parity mode):
    the logits and labels of every replica gathered, `1 / R` of their
    loss, and metrics updated from the gathered rows, the same on every
    replica, also on a replica without examples."""

    class GatheredInShares(base):
        @keras_ctl.written_in_shares
        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                logits = keras_ctl.all_gather(self(x, training=True))
                labels = keras_ctl.all_gather(y)
                loss = tf.reduce_mean(_crossentropy(labels, logits))
                share = loss / keras_ctl.num_replicas()
            gradients = tape.gradient(share, self.trainable_variables)
            self.optimizer.apply(gradients, self.trainable_variables)
            self.loss_tracker.update_state(loss)
            self.probe.update_state(labels, logits)
            return {"loss": self.loss_tracker.result(), "p_acc": self.probe.result()}

    return GatheredInShares


CASES = (
    "raw_means",
    "sum_over_count",
    "singular_layer",
    "regularized",
    "keras_loss_objects",
    "two_optimizers",
    "tf_function",
    "sparse_adam",
    "remat",
    "lazy_layer",
    "variable_in_step",
    "synchronized_bn",
    "sum_in_shares",
    "softmax_output",
    "gathered_metrics",
)


def run(case, base, strategy):
    """Trains `case` and returns its weights, history and evaluation."""
    with computing_in("float64"):
        keras.utils.set_random_seed(0)
        x, y = data()
        if case == "sparse_adam":
            x = (np.abs(x) * 7).astype("int32") % 20  # token ids
        with strategy.scope():
            inputs, outputs = _network(case)
            model = model_class(base, case)(inputs, outputs)
            model.loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
            model.head_optimizer = keras.optimizers.Adam(0.01)
            model.optimizer_of_layer = {
                "body": keras.optimizers.SGD(0.1),
                "head": keras.optimizers.Adam(0.01),
            }
            # Adam's sparse update of embedding rows (`IndexedSlices`).
            sparse = case == "sparse_adam"
            model.compile(optimizer="adam" if sparse else keras.optimizers.SGD(0.1))
        # Batches of 5 split 3 and 2, or 2, 2 and 1: replicas of unequal
        # fractions, each of which enters the synchronized moments.
        batch = 5 if case == "synchronized_bn" else BATCH
        history = model.fit(
            x, y, batch_size=batch, epochs=EPOCHS, shuffle=False, verbose=0
        )
        evaluation = model.evaluate(x, y, batch_size=batch, verbose=0, return_dict=True)
        return {
            "weights": [w.tolist() for w in model.get_weights()],
            "history": {k: list(map(float, v)) for k, v in history.history.items()},
            "evaluation": {k: float(v) for k, v in evaluation.items()},
        }
