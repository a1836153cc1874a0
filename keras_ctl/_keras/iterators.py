"""Distributed iterators opened on first use.

At the end of every epoch, Keras's epoch iterator opens the iterator of the
next epoch at once, after the last epoch too. A multi-device iterator takes
long to open (about 0.56 s at 8 replicas on CPU, against a step of a few
ms), so every `fit()` call paid for one iterator it never read. Deferred,
an iterator opens when the first step reads it.
"""

import warnings


class DeferredDataset:
    """A distributed dataset whose `iter()` opens nothing yet.

    `replayable`: whether its order comes from the dataset alone (arrays, a
    `tf.data` pipeline), so a resumed run can replay its epochs; not for a
    Python generator or a `PyDataset`, which order themselves.
    """

    def __init__(self, dataset, replayable=True):
        self.dataset = dataset
        self.replayable = replayable

    def __iter__(self):
        return DeferredIterator(self.dataset, self.replayable)

    def __getattr__(self, name):
        return getattr(self.dataset, name)


class DeferredIterator:
    """Opens `iter(dataset)` when first read."""

    def __init__(self, dataset, replayable=True):
        self._dataset = dataset
        self._replayable = replayable
        self._iterator = None

    def opened(self):
        """The real iterator, opened now if it was not."""
        if self._iterator is None:
            self._iterator = iter(self._dataset)
        return self._iterator

    def __iter__(self):
        return self

    def __next__(self):
        return next(self.opened())


def opened(iterator):
    """`iterator`, or the real iterator behind a deferred one."""
    return iterator.opened() if isinstance(iterator, DeferredIterator) else iterator


def replay_epochs(iterator, epochs):
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
