"""`CTLModel`: a `keras.Model` whose steps are exact under any strategy."""

import keras
import tensorflow as tf
from keras import tree
from keras.src.models.functional import Functional
from keras.src.models.model import functional_init_arguments
from keras.src.saving import object_registration

from keras_ctl import compiled_loss
from keras_ctl import optimization
from keras_ctl import reduction
from keras_ctl import step_function
from keras_ctl import xla_step


@keras.saving.register_keras_serializable(package="keras_ctl")
class CTLModel(keras.Model):
    """A `keras.Model` whose training is exact under any `tf.distribute` strategy.

    Use it where you would use `keras.Model`, functionally
    (`CTLModel(inputs, outputs)`) or as a base class with your own `call()`,
    and keep calling `compile()`, `fit()`, `evaluate()`, `predict()` and
    `save()`. Under a strategy with R replicas, every step follows the
    custom-training-loop recipe of the TensorFlow distributed-training
    tutorial, with the global count all-reduced every step:

    - each output's loss is summed on its replica and divided by the *global*
      number of loss elements (or weight sum, per Keras's `reduction`), so
      uneven last batches and replicas without examples stay exact;
    - `model.losses` (weight regularizers, `add_loss`) count once per global
      batch: each replica adds `1 / R` of them, since gradients are summed;
    - the loss is scaled by the optimizer (`LossScaleOptimizer` under mixed
      precision), gradients are summed across replicas and applied;
    - logged values (`history`, `evaluate()`) are reduced once, exactly.

    For a model without per-replica randomness, `fit()` under any strategy
    gives the weights, `history` and `evaluate()` of one device.

    A custom `train_step` can use the same building blocks the default step
    uses: `keras_ctl.global_mean`, `keras_ctl.scaled_regularization_loss`,
    `keras_ctl.minimize` and the output types `keras_ctl.ReplicaSum`,
    `keras_ctl.ExampleMean`, `keras_ctl.Synchronized`. A step that returns
    `{m.name: m.result() for m in self.metrics}` (the keras.io way) gets the
    exact cross-replica value of each metric.

    Example:

    ```python
    strategy = tf.distribute.MirroredStrategy()
    with strategy.scope():
        inputs = keras.Input((64,))
        outputs = keras.layers.Dense(10)(inputs)
        model = keras_ctl.CTLModel(inputs, outputs)
        model.compile(
            optimizer="sgd",
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    model.fit(x, y, batch_size=64, epochs=2)
    ```
    """

    def __new__(cls, *args, **kwargs):
        # Keras 3.15 makes a `Model` subclass functional by rewriting the
        # `__bases__` of its whole hierarchy for good: after one
        # `MyStep(inputs, outputs)`, every subclassed CTLModel (GAN too)
        # would become functional. A functional variant of `cls` avoids it.
        if functional_init_arguments(args, kwargs) and not issubclass(cls, Functional):
            cls = _functional_variant(cls)
        return super().__new__(cls)

    @classmethod
    def from_model(cls, model):
        """Returns a `CTLModel` that shares `model`'s layers and weights.

        A functional or `keras.Sequential` model becomes a functional
        `CTLModel` over the same layers: training one trains the other, and
        weight files saved by one load into the other. A subclassed model is
        converted in place (its class gains `CTLModel` as a base, after the
        user's own methods) and returned.

        Args:
            model: A built `keras.Model`.

        Returns:
            A `CTLModel` sharing `model`'s variables.

        Raises:
            TypeError: if `model` is not a `keras.Model`.
            ValueError: if a functional or Sequential `model` has no inputs yet.

        Example:

        ```python
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        ctl = keras_ctl.CTLModel.from_model(model)
        ctl.compile(optimizer="sgd", loss="mse")
        ```
        """
        if isinstance(model, CTLModel):
            return model
        if not isinstance(model, keras.Model):
            raise TypeError(
                "Expected `model` to be a `keras.Model`. "
                f"Received: model={model!r} of type {type(model).__name__}."
            )
        if isinstance(model, (keras.Sequential, Functional)):
            try:
                inputs, outputs = model.inputs, model.outputs
            except (AttributeError, ValueError):
                inputs = outputs = None
            if not inputs:
                raise ValueError(
                    "Expected a built model with known inputs. Received: "
                    f"model={model.name!r} with no inputs. Start it with "
                    "`keras.Input(shape)` or call `model.build(input_shape)`."
                )
            return cls(inputs=inputs, outputs=outputs, name=model.name)
        model.__class__ = type(type(model).__name__, (type(model), cls), {})
        model.train_function = model.test_function = None
        model.predict_function = None
        return model

    def train_step(self, data):
        """One exact training step on this replica's part of the batch.

        Returns:
            A dict of logs; metric results are reduced across replicas by
            the step engine.
        """
        data, batch_size = pad_empty_batch(data)
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        compiled = xla_step.forward_backward(self, data, batch_size, training=True)
        if compiled is not None:
            loss, shares, y_pred, gradients = compiled
            self.optimizer.apply_gradients(zip(gradients, self.trainable_weights))
            return self._update_metrics(x, y, y_pred, sample_weight, loss, shares)
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss, shares = self._loss_share(x, y, y_pred, sample_weight, batch_size)
        # Order the gradient all-reduce after the count all-reduce.
        with tf.control_dependencies([shares.global_batch_size]):
            optimization.minimize(loss, self.trainable_weights, self.optimizer, tape)
        return self._update_metrics(x, y, y_pred, sample_weight, loss, shares)

    def test_step(self, data):
        """One exact evaluation step on this replica's part of the batch."""
        data, batch_size = pad_empty_batch(data)
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        compiled = xla_step.forward_backward(self, data, batch_size, training=False)
        if compiled is not None:
            loss, shares, y_pred, _ = compiled
        else:
            y_pred = self(x, training=False)
            loss, shares = self._loss_share(x, y, y_pred, sample_weight, batch_size)
        return self._update_metrics(x, y, y_pred, sample_weight, loss, shares)

    def compute_loss(
        self, x=None, y=None, y_pred=None, sample_weight=None, training=True
    ):
        """Returns this replica's share of the compiled loss plus `self.losses`.

        The shares of all replicas sum to the loss one device computes on the
        global batch. Outside `strategy.run` it is the plain loss.
        """
        del training
        batch_size = tf.shape(tree.flatten(x if x is not None else y_pred)[0])[0]
        return self._default_loss_share(y, y_pred, sample_weight, batch_size)[0]

    def make_train_function(self, force=False):
        if self.train_function is not None and not force:
            return self.train_function
        if self.built:
            optimization.build_optimizer(
                self.optimizer, self.trainable_weights, self.distribute_strategy
            )
        xla_step.prepare(self, training=True)
        self.train_function = step_function.make_step_function(self, self.train_step)
        return self.train_function

    def make_test_function(self, force=False):
        if self.test_function is not None and not force:
            return self.test_function
        xla_step.prepare(self, training=False)
        self.test_function = step_function.make_step_function(self, self.test_step)
        return self.test_function

    def make_predict_function(self, force=False):
        if self.predict_function is not None and not force:
            return self.predict_function
        self.predict_function = step_function.make_predict_function(self)
        return self.predict_function

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        # Keras 3.15 builds from `strategy.reduce("MEAN", first_batch)`,
        # which fails for uneven per-replica batches and under
        # MultiWorkerMirroredStrategy. Shapes are all it needs: Keras's own
        # `_symbolic_build` reads the first replica's part of the first batch,
        # and only when something is unbuilt (each read opens a multi-device
        # iterator, about 0.2 s on CPU).
        if self._distribute_strategy is None:
            return
        if iterator is not None:
            iterator = _first_replica_batches(iterator, self.distribute_strategy)
        with self.distribute_strategy.scope():
            self._symbolic_build(iterator=iterator, data_batch=data_batch)

    def _loss_share(self, x, y, y_pred, sample_weight, batch_size):
        """Returns `(loss share, LossShares)` for the default steps.

        A subclass's own `compute_loss` is honoured: its value is taken as
        this replica's share (build it with `keras_ctl.global_mean`).
        """
        if type(self).compute_loss is CTLModel.compute_loss:
            return self._default_loss_share(y, y_pred, sample_weight, batch_size)
        loss = self._compute_loss(x, y, y_pred, sample_weight, training=True)
        return loss, compiled_loss.count_only_shares(batch_size)

    def _default_loss_share(self, y, y_pred, sample_weight, batch_size):
        # Read layer losses right after the forward pass: replica threads
        # share the layers, and the all-reduce below is a sync point.
        regularization = reduction.scaled_regularization_loss(self.losses)
        if self._compile_loss is None:
            if not self.losses:
                raise ValueError(
                    "No loss to compute. Expected a `loss` argument in "
                    "`compile()` or losses added with `add_loss`. Received: "
                    "loss=None. Call e.g. `model.compile(optimizer, loss=...)`."
                )
            return regularization, compiled_loss.count_only_shares(batch_size)
        shares = compiled_loss.compiled_loss_shares(
            self._compile_loss, y, y_pred, sample_weight, batch_size
        )
        return shares.total + regularization, shares

    def _update_metrics(self, x, y, y_pred, sample_weight, loss, shares):
        """Updates the loss trackers and compiled metrics on this replica."""
        # The loss tracker averages over examples like one device: each
        # replica adds its share times the global batch and its own count.
        _add_share(
            self._loss_tracker, loss, shares.global_batch_size, shares.local_batch_size
        )
        if self._compile_loss is not None:
            # Keras 3.15 weighs per-output losses by the static batch size,
            # unknown in a traced step: one weight per step, 1/R per replica.
            per_replica = 1.0 / reduction.num_replicas()
            for tracker, (_, share) in zip(
                self._compile_loss.metrics, shares.per_output
            ):
                _add_share(tracker, share, 1.0, per_replica)

        def update():
            self.compute_metrics(x, y, y_pred, sample_weight)
            return tf.constant(True)

        if reduction.num_replicas() == 1:
            update()
        else:
            # A replica padded with a placeholder example skips the update.
            tf.cond(shares.local_batch_size > 0, update, lambda: tf.constant(False))
        return self.get_metrics_result()


def _first_replica_batches(epoch_iterator, strategy):
    """`epoch_iterator`'s steps, each batch cut to the first replica's part.

    A generator: nothing is read until Keras asks for a batch.
    """
    for begin, end, batches in epoch_iterator:
        yield begin, end, (strategy.experimental_local_results(b)[0] for b in batches)


_FUNCTIONAL_VARIANTS = {}


def _functional_variant(cls):
    """`cls` with `Functional` mixed in, serialized under `cls`'s name."""
    if cls not in _FUNCTIONAL_VARIANTS:
        variant = type(
            cls.__name__,
            (cls, Functional),
            {"__module__": cls.__module__, "__qualname__": cls.__qualname__},
        )
        # Saved files name the user's class, which rebuilds this variant:
        # register the variant under `cls`'s name (Keras 3.15 registry).
        object_registration.GLOBAL_CUSTOM_NAMES[variant] = (
            keras.saving.get_registered_name(cls)
        )
        _FUNCTIONAL_VARIANTS[cls] = variant
    return _FUNCTIONAL_VARIANTS[cls]


def _add_share(tracker, share, global_weight, local_weight):
    """Adds to a `keras.metrics.Mean` so that, summed over replicas, it holds
    the global value weighted by `global_weight`."""
    tracker.total.assign_add(tf.cast(share * global_weight, tracker.dtype))
    tracker.count.assign_add(tf.cast(local_weight, tracker.dtype))


def pad_empty_batch(data):
    """Gives a replica without examples one placeholder example of zeros.

    With several replicas the last global batch can leave a replica empty;
    gradients of some layers crash on an empty batch, yet the replica must
    join every collective. The placeholder's loss and counts are zeroed.

    Returns:
        `(data, batch_size)` where `batch_size` counts the real examples.
    """
    flat = [t for t in tree.flatten(data) if t is not None]
    batch_size = tf.shape(flat[0])[0]
    if reduction.num_replicas() == 1:
        return data, batch_size
    missing = tf.cast(tf.equal(batch_size, 0), tf.int32)

    def pad(t):
        if t is None:
            return None
        zeros = tf.zeros(tf.concat([[missing], tf.shape(t)[1:]], 0), t.dtype)
        return tf.concat([t, zeros], axis=0)

    return tree.map_structure(pad, data), batch_size
