"""The user's other module: the global-batch guide's recipe (rows gathered
with `keras_ctl.all_gather`, `1 / keras_ctl.num_replicas()` of their loss)
split into the helpers, aliases, decorators, mixins and base classes that
users move code into (`recipe_spellings` builds models from them)."""

import functools

import keras
import tensorflow as tf

import keras_ctl
from keras_ctl import all_gather as gather_rows
from keras_ctl import num_replicas as replica_count


def in_batch_softmax(queries, candidates):
    """Each query's candidate against every other candidate of the batch."""
    scores = keras.ops.matmul(queries, keras.ops.transpose(candidates))
    labels = keras.ops.eye(keras.ops.shape(scores)[0], dtype=scores.dtype)
    return keras.ops.mean(
        keras.losses.categorical_crossentropy(labels, scores, from_logits=True)
    )


def gathered_loss(model, x, y):
    """The whole batch's loss, from gathered rows (a helper)."""
    return in_batch_softmax(
        keras_ctl.all_gather(model(x, training=True)), keras_ctl.all_gather(y)
    )


def gathered_loss_aliased(model, x, y):
    """The same, through `from keras_ctl import all_gather as gather_rows`."""
    return in_batch_softmax(gather_rows(model(x, training=True)), gather_rows(y))


def share_of(loss):
    """Every replica computes the whole loss; gradients are summed."""
    return loss / replica_count()


def recipe_step(model, data, loss_of=gathered_loss):
    """The guide's step as a module-level function of `(model, data)`."""
    x, y = data
    with tf.GradientTape() as tape:
        loss = loss_of(model, x, y)
        share = share_of(loss)
    variables = model.trainable_weights
    model.optimizer.apply(tape.gradient(share, variables), variables)
    model.tracker.update_state(loss)
    return {"loss": model.tracker.result()}


declared_recipe_step = keras_ctl.written_in_shares(recipe_step)


def logged(step):
    """A user's own decorator around a step (`functools.wraps`)."""

    @functools.wraps(step)
    def run(self, data):
        logs = step(self, data)
        return {**logs, "steps_seen": keras.ops.convert_to_tensor(1.0)}

    return run


class RecipeMixin:
    """The step as a mixin from another module."""

    @keras_ctl.written_in_shares
    def train_step(self, data):
        return recipe_step(self, data)


class LibraryModel(keras_ctl.CTLModel):
    """A library's base class whose step a user's model inherits."""

    @keras_ctl.written_in_shares
    def train_step(self, data):
        return recipe_step(self, data, loss_of=gathered_loss_aliased)
