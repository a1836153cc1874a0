"""The forward pass and loss share of the default steps, eager or with XLA.

One function, `forward_and_loss`, computes the predictions and this
replica's loss share; the eager step records it on a tape, and
`CompiledPass` compiles it (with the backward pass) for each replica.

XLA cannot compile a `strategy.run` that spans devices (Keras 3.15 fails
with "Trying to access resource ... located in device CPU:1 from device
CPU:0"), and a compiled function cannot hold the collectives of a step. So
under several replicas each replica compiles its own forward and backward
pass, and the two collectives stay outside it: the global batch size is
all-reduced before the compiled pass, the gradients are summed when the
optimizer applies them. Without an all-reduce inside, every loss
denominator must be a fixed count per example (no masks, no sample-weight
sums); a loss that needs more runs the eager exact step instead, with a
warning.
"""

import threading
import warnings

import keras
import tensorflow as tf

from keras_ctl import _keras
from keras_ctl import blocks
from keras_ctl._engine import loss as loss_module
from keras_ctl._engine.replicas import all_reduce_sum


def forward_and_loss(
    model,
    x,
    y,
    sample_weight,
    batch_size,
    training,
    uses_default_loss,
    global_batch=None,
    y_pred=None,
):
    """Returns `(y_pred, loss share, LossShares)` for one replica's batch.

    Args:
        model: The `CTLModel`.
        x, y, sample_weight: This replica's part of the batch.
        batch_size: Number of real examples (0 on a padded replica).
        training: Whether the model runs in training mode.
        uses_default_loss: False when a subclass overrides `compute_loss`:
            its value is then taken as this replica's share (build it with
            `keras_ctl.global_mean`).
        global_batch: The all-reduced batch size, when known already (XLA).
        y_pred: The predictions, when the caller ran the forward pass.
    """
    if y_pred is None:
        y_pred = model(x, training=training)
    if not uses_default_loss:
        loss = _keras.user_compute_loss(model, x, y, y_pred, sample_weight, training)
        return y_pred, loss, loss_module.count_only_shares(batch_size)
    loss, shares = default_loss_share(
        model, y, y_pred, sample_weight, batch_size, global_batch
    )
    return y_pred, loss, shares


def evaluation_loss(model, y, y_pred, sample_weight, batch_size):
    """`(loss, LossShares)` for the loss tracker of `evaluate()`, without a
    collective, or `None` when the loss needs the global count.

    The loss tracker then gets `loss x global_batch_size` with
    `global_batch_size` 1 (see `loss.loss_times_examples`). Needs the
    compiled loss alone (a user's `compute_loss` returns a share), and one
    output: per-output losses are logged as means over steps, which need
    each step's global count.
    """
    compile_loss = _keras.compile_loss(model)
    if compile_loss is None or _keras.per_output_loss_trackers(compile_loss):
        return None
    try:
        total = loss_module.loss_times_examples(
            compile_loss, y, y_pred, sample_weight, batch_size
        )
    except loss_module.NeedsCountAllReduce:
        return None
    local_batch = tf.cast(batch_size, tf.float32)
    # Regularization counts once per example of the batch, as on one device.
    total += blocks.regularization_total(model.losses) * local_batch
    return total, loss_module.LossShares(total, [], tf.ones(()), local_batch)


def default_loss_share(model, y, y_pred, sample_weight, batch_size, global_batch=None):
    """Returns `(share of compiled loss + model.losses, LossShares)`."""
    # Read layer losses right after the forward pass: replica threads share
    # the layers, and the all-reduce below is a sync point.
    regularization = blocks.scaled_regularization_loss(model.losses)
    compile_loss = _keras.compile_loss(model)
    if compile_loss is None:
        if not model.losses:
            raise ValueError(
                "No loss to compute. Expected a `loss` argument in "
                "`compile()` or losses added with `add_loss`. Received: "
                "loss=None. Call e.g. `model.compile(optimizer, loss=...)`."
            )
        return regularization, loss_module.count_only_shares(batch_size)
    shares = loss_module.compiled_loss_shares(
        compile_loss, y, y_pred, sample_weight, batch_size, global_batch
    )
    return shares.total + regularization, shares


class CompiledPass:
    """Each replica's forward (and, when training, backward) pass under XLA.

    Called from every replica's thread; if the loss turns out to need a
    count all-reduce, the first replica to find out turns the pass off for
    all of them and warns once.
    """

    def __init__(self, model, training):
        self._model = model
        self._training = training
        self._function = tf.function(self._run, jit_compile=True, reduce_retracing=True)
        self._lock = threading.Lock()
        self.usable = True

    def __call__(self, data, batch_size):
        """Returns `(y_pred, loss, shares, gradients)`, or `None` when the
        caller must run the eager step."""
        if not self.usable:
            return None
        global_batch = all_reduce_sum(tf.cast(batch_size, tf.float32))
        try:
            with tf.control_dependencies([global_batch]):
                y_pred, loss, shares, gradients = self._function(
                    data, batch_size, global_batch
                )
        except loss_module.NeedsCountAllReduce:
            self._turn_off()
            return None
        # Output names are strings, which a compiled function cannot return.
        names = [
            term[3]
            for term in _keras.compile_loss_terms(_keras.compile_loss(self._model))
        ]
        shares = shares._replace(per_output=list(zip(names, shares.per_output)))
        return y_pred, loss, shares, gradients

    def tracing_count(self):
        """How many times XLA traced the pass (0 until a step ran it)."""
        return self._function.experimental_get_tracing_count()

    def _turn_off(self):
        with self._lock:
            if not self.usable:
                return
            self.usable = False
        warnings.warn(
            "`jit_compile=True` under a multi-replica strategy compiles each "
            "replica's pass only when every loss divides by a fixed count per "
            "example. This model's loss uses masks or sample-weight sums, so "
            "its steps run without XLA (still exact).",
            stacklevel=3,
        )

    def _run(self, data, batch_size, global_batch):
        model = self._model
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        with tf.GradientTape() as tape:
            y_pred, loss, shares = forward_and_loss(
                model,
                x,
                y,
                sample_weight,
                batch_size,
                self._training,
                True,
                global_batch,
            )
            scaled_loss = model.optimizer.scale_loss(loss) if self._training else loss
        gradients = []
        if self._training:
            gradients = tape.gradient(scaled_loss, model.trainable_weights)
        shares = shares._replace(per_output=[share for _, share in shares.per_output])
        return y_pred, loss, shares, gradients
