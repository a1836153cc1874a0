"""Steps that cannot run as one device's under replicas, and the message
each stops with: a queue filled from the replica's own rows (keras.io's
NNCLR as written), a log with a value per example, a shuffle of the
replica's rows under `random_draws="as_one_device"`.

A step that fails while its collectives run aborts every later collective
of the process ("Restart your program to reset"), so under several
replicas each case runs in a child process of its own (`in_child`).
"""

import json

import children
import keras
import numpy as np
import tensorflow as tf

import keras_ctl

QUEUE = 6
# The start of the refusal of a shuffle of the replica's rows.
SHUFFLE_REFUSED = (
    'compile(random_draws="as_one_device") cannot shuffle the replica\'s '
    "rows as one device does. Received: `keras.random.shuffle` of a tensor "
    "with a row per example"
)


class QueuedFromItsOwnRows(keras_ctl.CTLModel):
    """keras.io's NNCLR as written: the queue is filled from the replica's
    own embeddings, a row per example of its share of the batch."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.queue = self.add_weight(
            shape=(QUEUE, 3), initializer="zeros", trainable=False, name="queue"
        )

    def train_step(self, data):
        x, _ = data
        z = self(x, training=True)
        self.queue.assign(tf.concat([z, z], 0)[:QUEUE])
        return {}


class LogsPerExample(keras_ctl.CTLModel):
    def train_step(self, data):
        x, y = data
        return {"per_example": keras.ops.sum(self(x) - y[:, None], axis=1)}


class ShuffledRows(keras_ctl.CTLModel):
    """Shuffles the batch's rows (its own draw) from the second step on, so
    in a traced step, or (`shuffled = "other"`) a tensor of 5 values."""

    shuffled = "rows"

    def train_step(self, data):
        x, y = data
        seed = 4
        if self.shuffled == "rows":
            x = keras.ops.cond(
                self.optimizer.iterations > 0,
                lambda: keras.random.shuffle(x, seed=seed),
                lambda: x,
            )
        else:
            order = keras.random.shuffle(keras.ops.arange(5), seed=seed)
            x = x * keras.ops.cast(order[0] + 1, x.dtype)
        with tf.GradientTape() as tape:
            loss = keras.ops.mean(keras.ops.square(self(x, training=True) - y))
        self.optimizer.apply(
            tape.gradient(loss, self.trainable_weights), self.trainable_weights
        )
        return {"loss": loss}


def fitted(case, strategy, examples=17, data="arrays"):
    """The model of `case` (`"queue"`, `"logs"`, `"shuffled_rows"` or
    `"shuffled_other"`) fitted on `examples` examples in batches of 8, as
    arrays or as a dataset."""
    rng = np.random.default_rng(0)
    features = 4 if case.startswith("shuffled") else 5
    x = rng.normal(size=(examples, features)).astype("float32")
    with strategy.scope():
        inputs = keras.Input((features,))
        if case.startswith("queue"):
            model = QueuedFromItsOwnRows(inputs, keras.layers.Dense(3)(inputs))
        elif case == "logs":
            model = LogsPerExample(inputs, keras.layers.Dense(3)(inputs))
        else:
            shuffled = {"shuffled": case.split("_")[1]}
            model_class = type("Shuffled", (ShuffledRows,), shuffled)
            model = model_class(inputs, keras.layers.Dense(2)(inputs))
        options = {"random_draws": "as_one_device"} if "shuffled" in case else {}
        if case == "queue_unmeasured":
            options = {"compute_loss_over": "replica_batch"}
        model.compile(optimizer="sgd", loss="mse", **options)
    y = np.zeros((examples, 2 if case.startswith("shuffled") else 1), "float32")
    if data == "arrays":
        model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    else:
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
        model.fit(dataset, epochs=1, shuffle=False, verbose=0)
    return model


def message(case, strategy, examples=17, data="arrays"):
    """The message of the `ValueError` that fitting `case` stops with, its
    notes after it, or `None` when it ends."""
    try:
        fitted(case, strategy, examples, data)
    except ValueError as error:
        return "\n".join([str(error), *getattr(error, "__notes__", [])])
    return None


def in_child(case, examples=17, data="arrays"):
    """`message(case, ...)` on 2 replicas, in a child process."""
    command = [children.PYTHON, "named_errors_child.py", case, examples, data]
    result = children.run(command, timeout=300)
    assert result.returncode == 0, children.output(result)
    return json.loads(result.stdout.splitlines()[-1])
