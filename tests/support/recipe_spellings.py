"""The global-batch guide's recipe in the spellings users write it, each a
model class of `base`; and a step of one device's code that only logs the
replica count. With `keras.Model` on one device every spelling is the same
program (`all_gather` returns the rows, `num_replicas()` is 1)."""

import functools

import keras
import recipe_helpers
import tensorflow as tf

import keras_ctl

# Spellings declared `written_in_shares`, each as users place it.
DECLARED = (
    "inline",
    "mixin_on_self",
    "helper_module",
    "alias_import",
    "users_decorator",
    "module_level_body",
    "partial",
    "instance",
    "library_base",
)
# The same recipe with no declaration: refused at the first trace.
UNDECLARED = ("inline", "helper_module", "alias_import", "module_level_body")


class _Tracked:
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.tracker = keras.metrics.Mean(name="loss")

    @property
    def metrics(self):
        return [self.tracker]


def _inline(base, declared):
    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = recipe_helpers.in_batch_softmax(
                keras_ctl.all_gather(self(x, training=True)), keras_ctl.all_gather(y)
            )
            # Every replica computes the whole loss; gradients are summed.
            share = loss / keras_ctl.num_replicas()
        self.optimizer.apply(
            tape.gradient(share, self.trainable_weights), self.trainable_weights
        )
        self.tracker.update_state(loss)
        return {"loss": self.tracker.result()}

    step = keras_ctl.written_in_shares(train_step) if declared else train_step
    return type("Inline", (_Tracked, base), {"train_step": step})


def _calling(loss_of, declared):
    def train_step(self, data):
        return recipe_helpers.recipe_step(self, data, loss_of=loss_of)

    return keras_ctl.written_in_shares(train_step) if declared else train_step


def model_class(spelling, base, declared=True):
    """The recipe written as `spelling`, on `base`."""
    if spelling == "inline":
        return _inline(base, declared)
    if spelling == "helper_module":
        step = _calling(recipe_helpers.gathered_loss, declared)
    elif spelling == "alias_import":
        step = _calling(recipe_helpers.gathered_loss_aliased, declared)
    elif spelling == "module_level_body":
        step = (
            recipe_helpers.declared_recipe_step
            if declared
            else recipe_helpers.recipe_step
        )
    elif spelling == "users_decorator":
        step = recipe_helpers.logged(_calling(recipe_helpers.gathered_loss, True))
    elif spelling == "partial":
        step = functools.partialmethod(recipe_helpers.declared_recipe_step)
    elif spelling == "mixin_on_self":
        return type("Mixed", (_Tracked, recipe_helpers.RecipeMixin, base), {})
    elif spelling == "library_base":
        library = (
            recipe_helpers.LibraryModel
            if base is not keras.Model
            else (
                type(
                    "LibraryModel",
                    (keras.Model,),
                    {"train_step": recipe_helpers.LibraryModel.train_step},
                )
            )
        )
        return type("FromLibrary", (_Tracked, library), {})
    elif spelling == "instance":
        return type("OnInstance", (_OnInstance, base), {})
    else:
        raise ValueError(f"Unknown spelling: {spelling!r}")
    return type(spelling.title(), (_Tracked, base), {"train_step": step})


class _OnInstance(_Tracked):
    """The step assigned on the instance, as a lambda."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.train_step = lambda data: recipe_helpers.declared_recipe_step(self, data)


def logs_replica_count(base, read_in_step=False):
    """One device's mean loss, whose step logs `num_replicas()`, read in
    `__init__` (a number one device's code may log) or in the step."""

    class LogsReplicas(_Tracked, base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.replicas = keras_ctl.num_replicas()

        def train_step(self, data):
            x, y = data
            replicas = keras_ctl.num_replicas() if read_in_step else self.replicas
            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                loss = keras.ops.mean(keras.ops.square(y_pred - y))
            variables = self.trainable_weights
            self.optimizer.apply(tape.gradient(loss, variables), variables)
            self.tracker.update_state(loss)
            return {"loss": self.tracker.result(), "replicas": replicas}

    return LogsReplicas


def one_devices_gather(base, spelling="inline"):
    """The recipe without its `1 / num_replicas()`, not declared: one
    device's code over the gathered (global) batch, inline or through a
    helper of another module."""

    class Gathers(_Tracked, base):
        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                if spelling == "inline":
                    loss = recipe_helpers.in_batch_softmax(
                        keras_ctl.all_gather(self(x, training=True)),
                        keras_ctl.all_gather(y),
                    )
                else:
                    loss = recipe_helpers.gathered_loss_aliased(self, x, y)
            variables = self.trainable_weights
            self.optimizer.apply(tape.gradient(loss, variables), variables)
            self.tracker.update_state(loss)
            return {"loss": self.tracker.result()}

    return Gathers


class BatchScaled(keras.layers.Layer):
    """Scales its inputs by the whole batch's largest value (MelGAN's
    spectrogram normalization), gathered in the layer's `call`."""

    def call(self, x):
        return x / keras.ops.max(keras.ops.abs(keras_ctl.all_gather(x)))


def batch_statistic_in_a_layer(base):
    """One device's step over a model whose layer gathers the batch."""

    class Statistic(_Tracked, base):
        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                y_pred = self(BatchScaled()(x), training=True)
                loss = keras.ops.mean(keras.ops.square(y_pred - y))
            variables = self.trainable_weights
            self.optimizer.apply(tape.gradient(loss, variables), variables)
            self.tracker.update_state(loss)
            return {"loss": self.tracker.result()}

    return Statistic
