"""Building a model from its data's shapes, pickling, registration."""

import contextlib
from collections.abc import Iterator
from typing import Any

import keras
import tensorflow as tf

from keras_ctl._keras import names
from keras_ctl._keras.iterators import DeferredDataset
from keras_ctl._keras.iterators import keras_dataset


class SymbolicBuildFromFirstReplica:
    """A `keras.Model` mixin: build from the data's shapes, reading nothing.

    `fit()`, `evaluate()` and `predict()` call the TensorFlow trainer's
    `_maybe_symbolic_build` before the first step. Keras builds from
    `strategy.reduce("MEAN", first_batch)`, which fails for uneven
    per-replica batches and under MultiWorkerMirroredStrategy
    (keras-team/keras#20585). Shapes and dtypes are all
    `Trainer._symbolic_build` needs (it makes `KerasTensor`s of them), so it
    gets the element spec of the epoch iterator's dataset
    (`EpochIterator.data_adapter.get_tf_dataset()`): no batch is read, so a
    Python generator loses none (a read batch, and the iterator's prefetch,
    would be lost) and no multi-device iterator is opened (about 0.2 s on
    CPU). Data whose spec is unknown gives the first replica's part of its
    first batch instead. There is no public hook before the first step.
    """

    # Keras's, on the model this is mixed into.
    distribute_strategy: tf.distribute.Strategy

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        dataset = None
        if iterator is not None:
            dataset = keras_dataset(iterator)
            # On one device too: a resumed run replays epochs of its data
            # before it opens the first (`iterators.replay_epochs`).
            _defer_iterators(iterator, dataset, self._with_positions)
        if strategy_created_under(self) is None or not _callable_model(self):
            # Keras builds when the step is traced (a model without `call`,
            # like the keras.io guide's GAN, can only be built so).
            return
        strategy = self.distribute_strategy
        if iterator is not None and data_batch is None:
            data_batch = None if dataset is None else dataset.element_spec
            if data_batch is None:
                iterator = _first_replica_batches(iterator, strategy)
            else:
                iterator = None
        with strategy.scope(), _left_to_its_step(self):
            try:
                symbolic_build = names.attribute(self, "_symbolic_build")
                symbolic_build(iterator=iterator, data_batch=data_batch)
            except (RuntimeError, ValueError) as error:
                if not _built_by_its_step(self, error):
                    raise
                # Its step builds it, as on one device without a strategy.
                return
            except StopIteration:
                raise ValueError(
                    "Expected the data to hold at least one batch: the model "
                    "is built from the first one. Received: data without any "
                    "batch (an empty array or dataset, or `steps` past its "
                    "end). Pass data with examples, or build the model first."
                ) from None

    def _with_positions(self, dataset, strategy):
        """`dataset` distributed by `strategy` with each example's position
        in the global batch, for the model's steps to read, or `None`: the
        batches of `fit()` and `evaluate()` carry none (the model says)."""
        return None

    def _steps_are_its_own(self) -> bool:
        """Whether the model trains or evaluates with a step of the user's
        own (the model says)."""
        return False


@contextlib.contextmanager
def _left_to_its_step(model):
    """Within it, a model whose steps are its own has no compiled loss,
    metrics or optimizer (`Trainer._compile_loss`, `_compile_metrics`,
    `optimizer`), so Keras's `_symbolic_build` (3.15) builds only its
    layers. Its optimizer is built after, with every variable
    (`CTLModel.make_train_function`), or by its first step when the step
    builds layers of its own (a head only the step calls).

    Keras builds them by calling them on the data's `(y, y_pred)`. A step
    of one's own may call them on other tensors (a Barlow Twins loss on two
    views' embeddings, which failed) or on other targets (keras.io's
    consistency training updates `"accuracy"` with integer labels while
    the data's second element holds images: Keras resolved it to another
    accuracy). One device builds them in the step's first call, and so does
    such a model here.
    """
    if not model._steps_are_its_own():
        yield
        return
    # Set past Keras's tracking, which refuses new state once built.
    hidden = {
        "_compile_loss": names.attribute(model, "_compile_loss"),
        "_compile_metrics": names.attribute(model, "_compile_metrics"),
        "optimizer": model.optimizer,
    }
    for name in hidden:
        object.__setattr__(model, name, None)
    try:
        yield
    finally:
        for name, value in hidden.items():
            object.__setattr__(model, name, value)


def _built_by_its_step(model, error):
    """Whether `model` is left to its first step to build, after Keras's
    symbolic build failed with `error`.

    Keras builds from `x` read off the data as `(x, y, sample_weight)`. A
    model whose `call()` raises (a trainer that holds an encoder and a head
    and never calls itself), or whose step of its own reads the data
    otherwise (`(anchor, positive, negative)` tuples), fails there; one
    device, where Keras does not build symbolically, builds it in the
    step."""
    if isinstance(error.__context__, NotImplementedError):
        return True
    return model._steps_are_its_own()


def _callable_model(model):
    """Whether `model` defines a forward pass (`call`, or a functional graph)."""
    functional = names.member("keras.src.models.functional", "Functional")
    return isinstance(model, functional) or type(model).call is not keras.Model.call


def _defer_iterators(epoch_iterator, source, with_positions=None):
    """Makes Keras's epoch iterator open each distributed iterator on first
    use (`TFEpochIterator._distributed_dataset`, returned by its
    `_get_iterator`, is what it calls `iter()` on, one epoch ahead); with
    `with_positions(source, strategy)`, each batch of `source`
    (`iterators.keras_dataset`) carries its examples' positions in the
    global batch, where it gives a dataset.
    """
    dataset = names.attribute(epoch_iterator, "_distributed_dataset", None)
    if dataset is not None and not isinstance(dataset, DeferredDataset):
        adapter: Any = getattr(epoch_iterator, "data_adapter", None)
        if with_positions is not None and source is not None:
            strategy = names.attribute(epoch_iterator, "_distribute_strategy")
            dataset = with_positions(source, strategy) or dataset
        # Keras 3.15's adapters whose `tf.data` dataset holds the order and
        # the batches their `num_batches` counts (None when unknown or
        # infinite): an array's batches, a dataset's finite cardinality.
        replayable = type(adapter).__name__ in ("ArrayDataAdapter", "TFDatasetAdapter")
        batches = adapter.num_batches if replayable else None
        epoch_iterator._distributed_dataset = DeferredDataset(
            dataset, replayable, batches, source
        )


def _first_replica_batches(epoch_iterator, strategy):
    """`epoch_iterator`'s steps, each batch cut to the first replica's part.

    A generator: nothing is read until Keras asks for a batch.
    """
    for begin, end, batches in epoch_iterator:
        yield begin, end, (strategy.experimental_local_results(b)[0] for b in batches)


def build_from_spec(model: keras.Model, element_spec: Any) -> None:
    """Builds `model` (under its strategy) from the shapes of a batch, as
    `fit()` does before its first step (`_maybe_symbolic_build`)."""
    names.attribute(model, "_maybe_symbolic_build")(data_batch=element_spec)


def strategy_created_under(model):
    """The strategy whose scope `model` was created in, or `None`."""
    return names.attribute(model, "_distribute_strategy")


@contextlib.contextmanager
def without_strategy(model: keras.Model) -> Iterator[None]:
    """Within it, `model.distribute_strategy` is the current (default) one:
    the strategy the model was created under (`Trainer._distribute_strategy`)
    is set aside."""
    strategy = strategy_created_under(model)
    names.set_attribute(model, "_distribute_strategy", None)
    try:
        yield
    finally:
        model._distribute_strategy = strategy


def reduce_as_saved_model(model):
    """`model.__reduce__()` for pickle, naming a loader pickle can import.

    Keras pickles a model as a saved file plus `type(model)._unpickle_model`
    (`KerasSaveable.__reduce__`), which pickle finds through the class's
    module and name; a class made at run time has none that leads back to
    it. The loader ignores its class (it loads the file), so `keras.Model`'s
    is the same function under an importable name.
    """
    saveable = names.member("keras.src.saving.keras_saveable", "KerasSaveable")
    _, arguments = saveable.__reduce__(model)
    return names.attribute(keras.Model, "_unpickle_model"), arguments


def register_under_name(cls, name):
    """Saves instances of `cls` under the registered `name` of another class.

    `object_registration.GLOBAL_CUSTOM_NAMES`: `register_keras_serializable`
    would also register `cls` as the object to load for `name`.
    """
    custom_names = names.member(
        "keras.src.saving.object_registration", "GLOBAL_CUSTOM_NAMES"
    )
    custom_names[cls] = name
