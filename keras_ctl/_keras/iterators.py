"""Distributed iterators opened on first use, counting the batches they
have left.

At the end of every epoch, Keras's epoch iterator opens the iterator of the
next epoch at once, after the last epoch too. A multi-device iterator takes
long to open (about 0.56 s at 8 replicas on CPU, against a step of a few
ms), so every `fit()` call paid for one iterator it never read. Deferred,
an iterator opens when the first step reads it.

An iterator over data of known length also knows how many batches it has
left, so a step function can read exactly that many without asking the
workers whether any replica still has data (`next_batch`).
"""

import warnings
from typing import Any

import tensorflow as tf

from keras_ctl._keras import names


class DeferredDataset:
    """A distributed dataset whose `iter()` opens nothing yet.

    `replayable`: whether its order comes from the dataset alone (arrays, a
    `tf.data` pipeline), so a resumed run can replay its epochs; not for a
    Python generator or a `PyDataset`, which order themselves. `batches`:
    the global batches an iterator of it yields, or `None` when unknown.
    `source`: the `tf.data` dataset Keras distributed, or `None`
    (`keras_dataset`).
    """

    def __init__(self, dataset, replayable=True, batches=None, source=None):
        self.dataset = dataset
        self.replayable = replayable
        self.batches = batches
        self.source = source

    def __iter__(self):
        return DeferredIterator(self.dataset, self.replayable, self.batches)

    def __getattr__(self, name):
        return getattr(self.dataset, name)


def keras_dataset(epoch_iterator: Any) -> tf.data.Dataset | None:
    """The `tf.data` dataset Keras's `TFEpochIterator` distributed (the one
    its adapter made), or `None`: data the user distributed
    (`DistributedDataset`, `distribute_datasets_from_function`). Read off
    the distributed dataset (`DistributedDataset._original_dataset`):
    asking the adapter again would build an array's pipeline again, which
    embeds the arrays (tens of milliseconds a `fit()` call)."""
    adapter: Any = getattr(epoch_iterator, "data_adapter", None)
    if type(adapter).__name__ == "TFDatasetAdapter":
        if not isinstance(adapter.get_tf_dataset(), tf.data.Dataset):
            return None  # distributed by the user
    distributed = names.attribute(epoch_iterator, "_distributed_dataset", None)
    if isinstance(distributed, DeferredDataset):
        return distributed.source
    if isinstance(distributed, tf.data.Dataset):
        return distributed  # the default strategy distributes nothing
    dataset = names.attribute(distributed, "_original_dataset", None)
    return dataset if isinstance(dataset, tf.data.Dataset) else None


class DeferredIterator:
    """Opens `iter(dataset)` when first read; counts the batches read.

    `batches_left`: the global batches not read yet, or `None` when
    unknown. A step function that reads batches itself reports them with
    `took`.
    """

    def __init__(self, dataset, replayable=True, batches=None):
        self._dataset = dataset
        self._replayable = replayable
        self._iterator = None
        self.batches_left = batches

    def batches_for_call(self, steps_per_execution: int) -> int | None:
        """How many steps a call of up to `steps_per_execution` steps runs,
        or `None` when that depends on whether the data lasts."""
        if self.batches_left is None or self.batches_left <= 0:
            return None
        return min(steps_per_execution, self.batches_left)

    def took(self, batches: int) -> None:
        if self.batches_left is not None:
            self.batches_left -= batches

    def opened(self):
        """The real iterator, opened now if it was not."""
        if self._iterator is None:
            self._iterator = iter(self._dataset)
        return self._iterator

    def __iter__(self):
        return self

    def __next__(self):
        batch = next(self.opened())
        self.took(1)
        return batch


def next_batch(iterator: Any) -> Any:
    """The next batch of every replica, read without agreeing on whether
    there is one: for an iterator known to hold another batch.

    TensorFlow's `DistributedIterator.get_next()` (2.21) first all-reduces
    how many replicas have a value (`_calculate_replicas_with_values`) for
    every finite dataset under `MultiWorkerMirroredStrategy`: one round
    trip between workers per batch, and a `tf.cond` per batch on one
    machine. With the count known, no replica lacks a batch: rebatching
    gives every replica one per global batch, empty where the last global
    batch has too few examples, and every worker as many. Only its private
    `_get_next_no_partial_batch_handling` reads without the agreement
    (TensorFlow itself calls it for infinite datasets); a plain
    `tf.data.Iterator` (one device) has no agreement to skip.
    """
    read = names.attribute(iterator, "_get_next_no_partial_batch_handling", None)
    if read is None:
        return iterator.get_next()
    return read()


def opened(iterator: Any) -> Any:
    """`iterator`, or the real iterator behind a deferred one."""
    return iterator.opened() if isinstance(iterator, DeferredIterator) else iterator


def replay_epochs(iterator: Any, epochs: int) -> None:
    """Opens and drops `epochs` iterators of the data behind `iterator`, a
    deferred iterator not opened yet, as that many epochs of an
    uninterrupted run did: a pipeline that reshuffles each epoch (a
    `shuffle()` without a seed of its own, under a global seed) then gives
    the next epoch the order it had in that run. Its shuffle's seeds come
    from a generator that each new iterator draws from, on every copy of
    the dataset the strategy distributes."""
    if not isinstance(iterator, DeferredIterator) or iterator._iterator is not None:
        return
    if not iterator._replayable:
        warnings.warn(
            "Resumed from a backup with data from a Python generator or a "
            "`keras.utils.PyDataset`, whose order keras_ctl cannot replay: the "
            "resumed run equals the uninterrupted one only if the data yields "
            "the same batches in the same order after a restart. Arrays and "
            "`tf.data` pipelines (shuffled too) resume in the uninterrupted "
            "order.",
            stacklevel=2,
        )
        return
    for _ in range(epochs):
        iter(iterator._dataset)
