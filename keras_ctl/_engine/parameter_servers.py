"""`fit()`, `evaluate()` and `predict()` under `ParameterServerStrategy`.

Keras 3 has no parameter-server training (keras-team/keras#18624): its data
adapters hand datasets to `experimental_distribute_dataset`, which this
strategy refuses. Here, as tf.keras did, `fit()` runs its own epoch loop on
the chief (the coordinator), scheduling the train function on the workers:

    coordinator = ClusterCoordinator(strategy)    # one per strategy
    iterator = a per-worker dataset of the data   # built on each worker
    for each epoch:
        reset the metrics, on_epoch_begin
        for each execution: schedule train_function(iterator) on a free
            worker (it runs steps_per_execution steps); on_train_batch_end
            without logs (no waiting for the step)
        join: wait for the epoch's steps
        logs = the metrics (their state lives on the parameter servers,
               summed over every step of the epoch) and the last step's
               other outputs; validation on the chief; on_epoch_end

Each step runs on one worker with the whole global batch: the loss divides
by that batch, as on one device. Workers apply their updates
asynchronously; with one worker the run is one device's. `evaluate()` and
`predict()` run on the chief, reading the variables where they live.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Iterator
from typing import Any

import keras
import numpy as np
import numpy.typing as npt
import tensorflow as tf

from keras_ctl import _keras
from keras_ctl._engine import state as engine_state

# id(strategy) -> (strategy, its coordinator).
_coordinators: dict[
    int, tuple[tf.distribute.Strategy, tf.distribute.coordinator.ClusterCoordinator]
] = {}
_lock = threading.Lock()


def coordinator(
    strategy: tf.distribute.Strategy,
) -> tf.distribute.coordinator.ClusterCoordinator:
    """The strategy's `ClusterCoordinator` (one per strategy: a second one
    would connect to the cluster again)."""
    with _lock:
        if id(strategy) not in _coordinators:
            _coordinators[id(strategy)] = (
                strategy,
                tf.distribute.coordinator.ClusterCoordinator(strategy),
            )
        return _coordinators[id(strategy)][1]


def fit(
    model: keras.Model,
    x: Any = None,
    y: Any = None,
    batch_size: int | None = None,
    epochs: int = 1,
    verbose: str | int = "auto",
    callbacks: list[keras.callbacks.Callback]
    | keras.callbacks.CallbackList
    | None = None,
    validation_data: Any = None,
    shuffle: bool = True,
    sample_weight: Any = None,
    initial_epoch: int = 0,
    steps_per_epoch: int | None = None,
    validation_batch_size: int | None = None,
    validation_freq: int = 1,
    **unsupported: Any,
) -> keras.callbacks.History:
    """`keras.Model.fit` with the steps scheduled on the workers."""
    _refuse(unsupported)
    strategy = model.distribute_strategy
    data = _Data(strategy, x, y, sample_weight, batch_size, shuffle, steps_per_epoch)
    _keras.build_from_spec(model, data.element_spec)
    model.make_train_function()
    cluster = coordinator(strategy)
    iterator = iter(cluster.create_per_worker_dataset(data.per_worker))
    callback_list: keras.callbacks.CallbackList = callbacks
    if not isinstance(callbacks, keras.callbacks.CallbackList):
        callback_list = keras.callbacks.CallbackList(
            callbacks,
            add_history=True,
            add_progbar=verbose != 0,
            verbose=verbose,
            epochs=epochs,
            steps=data.steps_per_epoch,
            model=model,
        )
    model.stop_training = False
    callback_list.on_train_begin()
    logs: dict[str, Any] = {}
    first = _keras.initial_epoch(model) or initial_epoch
    for epoch in range(first, epochs):
        model.reset_metrics()
        callback_list.on_epoch_begin(epoch)
        logs = _train_epoch(
            model, cluster, iterator, callback_list, data.steps_per_epoch
        )
        if validation_data is not None and (epoch + 1) % validation_freq == 0:
            val_batch_size = validation_batch_size or batch_size
            logs.update(_validation_logs(model, validation_data, val_batch_size))
        callback_list.on_epoch_end(epoch, logs)
        if model.stop_training:
            break
    if epochs > first and isinstance(model.optimizer, keras.optimizers.Optimizer):
        model.optimizer.finalize_variable_values(model.trainable_weights)
    callback_list.on_train_end(logs)
    return model.history


def _train_epoch(
    model: keras.Model,
    cluster: tf.distribute.coordinator.ClusterCoordinator,
    iterator: Any,
    callbacks: keras.callbacks.CallbackList,
    steps: int,
) -> dict[str, Any]:
    """Schedules an epoch's steps, waits for them; returns the epoch's logs."""
    # Batches are numbered from 0 in a resumed epoch too, as in Keras.
    last, batch, left = None, 0, steps - _skipped_steps(model)
    per_call = int(model.steps_per_execution)
    while batch < left:
        count = min(per_call, left - batch)
        callbacks.on_train_batch_begin(batch)
        with _lost_servers_explained():
            last = cluster.schedule(model.train_function.steps(count), args=(iterator,))
        batch += count
        callbacks.on_train_batch_end(batch - 1, None)
        if model.stop_training:
            break
    with _lost_servers_explained():
        cluster.join()
        return _epoch_logs(model, last)


def _validation_logs(
    model: keras.Model, validation_data: Any, batch_size: int | None
) -> dict[str, Any]:
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(validation_data)
    logs = evaluate(
        model,
        x,
        y,
        batch_size=batch_size,
        sample_weight=sample_weight,
        verbose=0,
        return_dict=True,
    )
    return {f"val_{name}": value for name, value in logs.items()}


def evaluate(model: keras.Model, *args: Any, **kwargs: Any) -> Any:
    """`keras.Model.evaluate` on the chief, reading the variables where they
    live."""
    with _on_the_chief(model):
        return keras.Model.evaluate(model, *args, **kwargs)


def predict(model: keras.Model, *args: Any, **kwargs: Any) -> Any:
    """`keras.Model.predict` on the chief."""
    with _on_the_chief(model):
        return keras.Model.predict(model, *args, **kwargs)


@contextlib.contextmanager
def _on_the_chief(model: keras.Model) -> Iterator[None]:
    """Keras's own evaluate/predict loop under the default strategy: the
    variables stay on the parameter servers, read from here."""
    model.test_function = model.predict_function = None
    try:
        with _keras.without_strategy(model):
            yield
    finally:
        model.test_function = model.predict_function = None


class _Data:
    """The training data as a per-worker dataset (`per_worker`).

    Arrays are cut into batches as one device does (the last one smaller),
    shuffled each epoch when `shuffle`, split across the workers, and
    repeated: an epoch is `ceil(examples / batch_size)` steps. A
    `tf.data.Dataset` or a function `dataset_fn(input_context)` is used as
    given, repeated when it is finite; its epoch is `steps_per_epoch`
    steps, or the dataset's length.
    """

    def __init__(
        self,
        strategy: tf.distribute.Strategy,
        x: Any,
        y: Any,
        sample_weight: Any,
        batch_size: int | None,
        shuffle: bool,
        steps: int | None,
    ) -> None:
        self.strategy = strategy
        # What `create_per_worker_dataset` takes: a function, or a dataset.
        self.per_worker = self._per_worker
        if callable(x) and not isinstance(x, tf.data.Dataset):
            self.dataset_fn = x
            sample = x(tf.distribute.InputContext())
        elif isinstance(x, tf.data.Dataset):
            # Serialized to every worker (a dataset made here cannot be
            # captured by a function that runs there).
            sample = x
            self.per_worker = strategy.experimental_distribute_dataset(_repeated(x))
        else:
            sample, steps = self._from_arrays(
                x, y, sample_weight, batch_size, shuffle, steps
            )
        self.element_spec = sample.element_spec
        if steps is None:
            steps = int(sample.cardinality())
            if steps < 0:
                raise ValueError(
                    "Under ParameterServerStrategy, `fit()` needs the length of "
                    "an epoch. Received: steps_per_epoch=None with data of "
                    "unknown or infinite length. Pass `steps_per_epoch`."
                )
        self.steps_per_epoch = steps

    def _from_arrays(
        self,
        x: Any,
        y: Any,
        sample_weight: Any,
        batch_size: int | None,
        shuffle: bool,
        steps: int | None,
    ) -> tuple[tf.data.Dataset, int]:
        data = keras.utils.pack_x_y_sample_weight(x, y, sample_weight)
        examples = len(keras.tree.flatten(data)[0])
        batch_size = batch_size or 32

        def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
            dataset = tf.data.Dataset.from_tensor_slices(data)
            if context.num_input_pipelines > 1:
                dataset = dataset.shard(
                    context.num_input_pipelines, context.input_pipeline_id
                )
            if shuffle:
                dataset = dataset.shuffle(examples, reshuffle_each_iteration=True)
            return dataset.batch(batch_size).repeat()

        self.dataset_fn = dataset_fn
        steps = steps or math.ceil(examples / batch_size)
        return dataset_fn(tf.distribute.InputContext()), steps

    def _per_worker(self) -> tf.distribute.DistributedDataset:
        return self.strategy.distribute_datasets_from_function(self.dataset_fn)


def _repeated(dataset: tf.data.Dataset) -> tf.data.Dataset:
    if dataset.cardinality() == tf.data.INFINITE_CARDINALITY:
        return dataset
    return dataset.repeat()


def _skipped_steps(model: keras.Model) -> int:
    """Steps a resumed epoch already trained (`BackupAndRestore`)."""
    engine = engine_state.of(model)
    plan = engine.resume_plan
    if plan is None:
        return 0
    engine.resume_plan = None
    return plan.batches_done


@contextlib.contextmanager
def _lost_servers_explained() -> Iterator[None]:
    """A parameter server lost (the coordinator's `UnavailableError`), said
    with what to do; a lost worker is no error (its steps go to others)."""
    try:
        yield
    except tf.errors.UnavailableError as error:
        raise RuntimeError(
            "A parameter server (or every worker) became unavailable during "
            "`fit()`: the variables on it are lost. Received: "
            f"{type(error).__name__}: {error.message[:300]}. Start the job "
            "again; with `keras_ctl.callbacks.BackupAndRestore` it resumes "
            "from the last backup."
        ) from error


def _epoch_logs(model: keras.Model, last: Any) -> dict[str, Any]:
    """The metrics' results (their state summed over the epoch's steps on
    the parameter servers) and the last step's other outputs."""
    logs: dict[str, Any] = {}
    if last is not None:
        logs = {k: _number(v) for k, v in last.fetch().items()}
    metrics = {k: _number(v) for k, v in model.get_metrics_result().items()}
    return {**logs, **metrics}


def _number(value: Any) -> float | npt.NDArray[Any]:
    array: npt.NDArray[Any] = np.asarray(value)
    return array.item() if array.size == 1 else array


def _refuse(unsupported: dict[str, Any]) -> None:
    for name, value in unsupported.items():
        if value not in (None, 0, 0.0, 1, False):
            raise ValueError(
                f"`fit()` under ParameterServerStrategy does not take `{name}`. "
                f"Received: {name}={value!r}. Shape the data in the dataset "
                "(e.g. class weights as sample weights in a `tf.data` map)."
            )
