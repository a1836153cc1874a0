"""Replica arithmetic: the count, the sum, and the exact division.

Every exact mean in keras_ctl is one rule: each replica divides its *local*
sum by the *global* count (all-reduced), so the replicas' shares add up to
the mean one device computes over the global batch, and so do their
gradients (`tf.distribute` sums gradients across replicas).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Iterator
from collections.abc import Sequence
from typing import Any
from typing import ParamSpec
from typing import TypeAlias
from typing import TypeVar

import numpy as np
import numpy.typing as npt
import tensorflow as tf

from keras_ctl._lookups import SparseSum
from keras_ctl._lookups import agreed
from keras_ctl.distribute import topology

# This thread's `Reading` while code of the user's own (a `train_step`,
# `test_step` or `compute_loss`) runs (`read_as_batch_losses`).
_batch = threading.local()

# A gradient as `tape.gradient` gives it: dense, or rows of a variable.
Gradient: TypeAlias = tf.Tensor | tf.IndexedSlices
_Value = TypeVar("_Value", tf.Tensor, tf.IndexedSlices, None)

_P = ParamSpec("_P")
_R = TypeVar("_R")


def num_replicas() -> int:
    """Returns the number of replicas of the current strategy.

    Returns:
        `num_replicas_in_sync` of the strategy in scope (1 without one).

    Example:

    ```python
    global_batch_size = 64
    with strategy.scope():
        per_replica_batch = global_batch_size // keras_ctl.num_replicas()
    print(per_replica_batch)  # 32 on 2 replicas
    ```
    """
    return tf.distribute.get_strategy().num_replicas_in_sync


def all_reduce_sum(value: tf.Tensor) -> tf.Tensor:
    """Sums `value` across replicas; the identity on a single replica.

    Call it inside a replica step. Every replica must call it the same number
    of times in the same order, because it is a collective.

    Args:
        value: A tensor, the same shape and dtype on every replica.

    Returns:
        The sum of `value` over all replicas, on every replica.

    Example:

    ```python
    def count(batch):  # on each replica, with its part of the global batch
        return keras_ctl.all_reduce_sum(tf.shape(batch)[0])

    batches = strategy.experimental_distribute_dataset(
        tf.data.Dataset.range(5).batch(5))
    counts = strategy.run(count, args=(next(iter(batches)),))
    print(strategy.experimental_local_results(counts))  # 5 on every replica
    ```
    """
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return value
    return context.all_reduce("SUM", value)


def global_shares(
    local_sums: Sequence[tf.Tensor],
    local_counts: Sequence[tf.Tensor | None],
    *,
    examples: tf.Tensor | None = None,
    global_counts: Sequence[tf.Tensor | float] | None = None,
    valued_as_global: bool = False,
) -> tuple[list[tf.Tensor], list[tf.Tensor]]:
    """Returns `(shares, global_counts)`: each local sum over its global
    count, this replica's share of a mean over the global batch.

    The exactness core: every loss keras_ctl makes exact is divided here
    (the compiled loss of the default, evaluation and XLA steps, Keras's
    `Loss` objects in a step of one's own, `global_mean` and the `GAN`,
    the share of `model.losses`, the fraction a step of one's own is
    weighed by). All counts are summed across replicas in one all-reduce,
    however many there are, and the sums with them when their value is
    asked for.

    Args:
        local_sums: Scalars summed on this replica (differentiable).
        local_counts: Scalars of the sums' dtype, one denominator per sum,
            or `None` for a sum that is not divided (`reduction="sum"`).
            Extra counts past `local_sums` are all-reduced and returned too.
        examples: This replica's number of real examples. A replica
            without any (padded with a placeholder example) adds nothing
            to any sum or count, not even a NaN. Defaults to `None`.
        global_counts: The counts' global values (one per count that is
            not `None`) when the caller has them: no collective for them.
            Defaults to `None` (all-reduced here).
        valued_as_global: Whether each share is valued as the sum of every
            replica's share (the global mean; `valued_as_global`), keeping
            the share's gradient. Defaults to `False`.

    Returns:
        `shares`, one per sum, and the global counts (the `None` entries
        left out).
    """
    if examples is not None:
        local_sums = [only_if_real(value, examples) for value in local_sums]
        local_counts = [only_if_real(count, examples) for count in local_counts]
    counts = [count for count in local_counts if count is not None]
    to_reduce = [] if global_counts is not None else list(counts)
    if valued_as_global:
        to_reduce += [tf.stop_gradient(value) for value in local_sums]
    reduced = _sum_together(to_reduce)
    totals = reduced[len(reduced) - len(local_sums) :] if valued_as_global else []
    found = list(global_counts) if global_counts is not None else reduced[: len(counts)]
    divisors = iter(found)
    shares = []
    for index, (value, count) in enumerate(zip(local_sums, local_counts)):
        divisor = None if count is None else next(divisors)
        share = value if divisor is None else _over(value, divisor)
        if valued_as_global:
            total = totals[index] if divisor is None else _over(totals[index], divisor)
            share = _valued_as(share, total)
        shares.append(share)
    return shares, [tf.convert_to_tensor(count) for count in found]


def only_if_real(value: _Value, examples: tf.Tensor) -> _Value:
    """`value`, or zeros where this replica has no real `examples` (its
    placeholder's loss, count or gradient, NaN included); `None` stays.
    Nothing is traced where the count is a constant above 0 (a batch whose
    size the trace knows, `padding.pad_empty_batch`), nor on one replica,
    which holds the whole batch: `keras.Model` does not guard an empty
    batch of the user's either."""
    if value is None or num_replicas() == 1 or never_empty(examples):
        return value
    if isinstance(value, tf.IndexedSlices):
        return tf.IndexedSlices(
            only_if_real(value.values, examples), value.indices, value.dense_shape
        )
    return tf.where(examples > 0, value, tf.zeros_like(value))


def static_rows(tensor: tf.Tensor) -> int | None:
    """The first dimension of `tensor` (its examples) where the trace knows
    it, else `None`."""
    shape = tf.TensorShape(tensor.shape)
    return shape[0] if shape.rank else None


def known_global_count(local: tf.Tensor | int) -> int | None:
    """The global batch's number of examples where the trace knows it, else
    `None` (it is all-reduced): `local`, this replica's, a constant (a
    batch of static size) that every replica shares (the element spec one
    machine's replicas trace with). Not in an eager step, whose shapes are
    each replica's own (3 and 2 examples)."""
    static = tf.get_static_value(local)
    if static is None or tf.executing_eagerly() or topology.of().workers > 1:
        return None
    return int(static) * num_replicas()


def never_empty(examples: tf.Tensor) -> bool:
    """Whether `examples` (a count, or a fraction of the global batch) is a
    constant above 0: this replica has examples in every batch the trace
    runs on."""
    static = tf.get_static_value(examples)
    return static is not None and static > 0


def _sum_together(values: Sequence[tf.Tensor]) -> list[tf.Tensor]:
    """Each of `values` (scalars) summed across replicas, in one
    collective; as they are on one replica (no gradient through them)."""
    if not values:
        return []
    dtype = values[0].dtype
    stacked = tf.stop_gradient(tf.stack([tf.cast(v, dtype) for v in values]))
    if num_replicas() > 1:
        stacked = all_reduce_sum(stacked)
    return [
        tf.cast(summed, value.dtype)
        for summed, value in zip(tf.unstack(stacked), values)
    ]


def _over(value: tf.Tensor, divisor: tf.Tensor | float) -> tf.Tensor:
    return tf.math.divide_no_nan(value, tf.cast(divisor, value.dtype))


def valued_as_global(share: tf.Tensor, total: tf.Tensor | None = None) -> tf.Tensor:
    """`share`, with the value of the sum of every replica's share.

    The gradient stays the share's (the replicas' gradients are summed
    later): a loss that logs like one device's and trains like a share.
    `total` is that sum when the caller has it; otherwise it is all-reduced
    here (one collective). Inside `read_as_batch_losses` the gradient is the
    share's divided by the replica's fraction of the global batch, which
    the step multiplies back.
    """
    if num_replicas() == 1 or tf.distribute.get_replica_context() is None:
        return share
    if total is None:
        total = all_reduce_sum(tf.stop_gradient(share))
    return _valued_as(share, total)


def _valued_as(share: tf.Tensor, total: tf.Tensor) -> tf.Tensor:
    """`share` with the value `total` (see `valued_as_global`)."""
    if num_replicas() == 1 or tf.distribute.get_replica_context() is None:
        return share
    fraction = batch_fraction()
    if fraction is not None:
        share = tf.math.divide_no_nan(share, tf.cast(fraction, share.dtype))
    return share + tf.stop_gradient(total - share)


@contextlib.contextmanager
def scoped(local: threading.local, name: str, value: object) -> Iterator[None]:
    """Within it, `local.name` (a thread-local's attribute) is `value`; its
    previous value (or `None`) is back on every exit."""
    previous = getattr(local, name, None)
    setattr(local, name, value)
    try:
        yield
    finally:
        setattr(local, name, previous)


class Reading:
    """How the user's own code running on this thread is read: one
    device's code on the replica's part of the batch (`fraction` of the
    global batch), until `written_in_shares` declares it in shares.

    Attributes:
        fraction: This replica's examples over the global batch's.
        owner: The code read, for messages (`"MyModel.train_step"`).
        kind: `"step"` (its gradients and logs are weighed by `fraction`)
            or `"compute_loss"` (its loss is).
        consulted: Whether keras_ctl has read the fraction (a loss, a
            tracker or a gradient computed as one device's): from then on
            the reading cannot change.
        in_shares: Whether the code declared itself written in shares.
    """

    def __init__(self, fraction: tf.Tensor, owner: str, kind: str) -> None:
        self.fraction = fraction
        self.owner = owner
        self.kind = kind
        self.consulted = False
        self.in_shares = False


@contextlib.contextmanager
def read_as_batch_losses(
    fraction: tf.Tensor | None,
    owner: str = "code of your own",
    kind: str = "compute_loss",
) -> Iterator[Reading | None]:
    """Within it (this thread), a loss is read as one device reads it: the
    value of this replica's batch alone, which the step weighs by
    `fraction`, the replica's number of examples over the global batch's.
    Yields the `Reading` (`None` for a `None` fraction).

    So a mean over the replica's examples (`ops.mean`, a loss function's
    per-example values averaged) becomes the global mean once the replicas'
    weighted gradients are summed, a term that does not depend on the batch
    (a regularizer) counts once, and an exact loss (`valued_as_global`:
    Keras's `Loss` objects, `Model.compute_loss`, `global_mean`) keeps its
    one-device gradient. A replica without examples weighs 0: nothing it
    computes on its placeholder reaches the update, NaN included
    (`weighed_by_fraction`). The step weighs the loss (`kind`
    `"compute_loss"`: a `compute_loss` of one's own), or the gradients
    where they are summed (`"step"`: a `train_step` of one's own,
    `sum_across_replicas`) and the logs (`outputs`).
    """
    outer = current_reading()
    if outer is not None:
        outer.consulted = True  # the inner code's value is read as one device's
    reading = None if fraction is None else Reading(fraction, owner, kind)
    with scoped(_batch, "reading", reading):
        yield reading


def current_reading() -> Reading | None:
    """The `Reading` of the user's code running on this thread, or `None`
    (no code of one's own, or keras_ctl's own code written in shares)."""
    return getattr(_batch, "reading", None)


def batch_fraction() -> tf.Tensor | None:
    """This replica's fraction of the global batch while code of one's own
    is read as one device's code, else `None`. Reading it fixes the
    reading: a later `written_in_shares` is refused."""
    reading = current_reading()
    if reading is None or reading.in_shares:
        return None
    reading.consulted = True
    return reading.fraction


def gradient_weight() -> tf.Tensor | None:
    """The fraction a step of one's own read as one device's code weighs
    this replica's gradients by, after `tape.gradient` (`None` elsewhere: a
    `compute_loss` of one's own weighs its loss instead)."""
    reading = current_reading()
    if reading is None or reading.kind != "step":
        return None
    return batch_fraction()


def sum_read_as_one_device(value: tf.Tensor) -> tf.Tensor:
    """`all_reduce_sum(value)`, whose gradient is one device's in a step
    that weighs each replica's gradients by its fraction after
    `tape.gradient` (a `train_step` of one's own read as one device's code).

    TensorFlow's gradient of the sum is the sum of every replica's upstream
    gradient, which that step would then weigh by this replica's fraction
    alone. Here each upstream gradient is weighed by its own replica's
    fraction before the sum, and the result divided by this replica's,
    which the step multiplies back: every replica's loss flows back through
    the sum with the weight it has in one device's loss (a synchronized
    BatchNorm's moments on uneven replicas: 3, 3 and 2 examples)."""
    fraction = gradient_weight()
    if fraction is None:
        return all_reduce_sum(value)

    @tf.custom_gradient
    def summed(value: tf.Tensor) -> tuple[tf.Tensor, Callable[..., tf.Tensor]]:
        def gradient(upstream: tf.Tensor) -> tf.Tensor:
            weighed = all_reduce_sum(weighed_by_fraction(upstream, fraction))
            return tf.math.divide_no_nan(weighed, tf.cast(fraction, weighed.dtype))

        return all_reduce_sum(value), gradient

    return summed(value)


def written_in_shares(method: Callable[_P, _R]) -> Callable[_P, _R]:
    """`method` (keras_ctl's own exact step code, such as `GAN.train_step`)
    runs with its shares as written, also when a step of the user's own
    calls it: no `Reading` is in effect within it."""

    @functools.wraps(method)
    def run(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        reading = current_reading()
        if reading is not None:
            reading.consulted = True  # its value is its own, not a share to weigh
        with scoped(_batch, "reading", None):
            return method(*args, **kwargs)

    return run


def weighed_by_fraction(value: Gradient, fraction: tf.Tensor) -> Gradient:
    """`value x fraction`, exactly 0 where `fraction` is 0: a replica
    without examples adds nothing, not even the NaN of a mean over no
    example or of a layer singular at its placeholder."""
    if isinstance(value, tf.IndexedSlices):
        return tf.IndexedSlices(
            weighed_by_fraction(value.values, fraction),
            value.indices,
            value.dense_shape,
        )
    fraction = tf.cast(fraction, value.dtype)
    if never_empty(fraction):
        return value * fraction
    return tf.where(fraction > 0, value * fraction, tf.zeros_like(value))


def sum_across_replicas(
    gradients: Sequence[Gradient | None],
    counts: Iterable[tf.Tensor] = (),
    *,
    riders: SummedTogether | None = None,
    over_first_count: bool = False,
    examples: tf.Tensor | None = None,
) -> tuple[list[Gradient | None], list[tf.Tensor]]:
    """Returns `(gradients, counts)`, each summed across replicas.

    One collective for everything (a round trip between workers): the
    dense gradients travel as one vector, with the counts and any values
    queued in `riders` (a step's logs). `None` gradients (variables the
    loss does not reach) stay `None`. A sparse gradient of a table looked
    up once a batch is summed slice by slice, one slice a position as on
    one device (`_lookups`).

    Inside `read_as_batch_losses` (a step of the user's own), each
    gradient is weighed by the replica's fraction of the global batch
    first: the gradients of one device's code on each replica's part sum
    to one device's gradient on the whole batch.

    Args:
        gradients: This replica's gradients.
        counts: Scalars to sum along with them, such as this replica's
            number of examples.
        riders: Values to sum in the same collective, read back from it
            once this returns. Defaults to `None`.
        over_first_count: Whether the summed gradients are divided by the
            first summed count (0 where it is 0). Defaults to `False`.
        examples: This replica's number of real examples, when it may have
            none (padded with a placeholder example): its gradients then
            add zeros, not the NaN the placeholder can make. Defaults to
            `None`.
    """
    counts = list(counts)
    fraction = batch_fraction()
    if fraction is not None and num_replicas() > 1:
        gradients = [
            None if g is None else weighed_by_fraction(g, fraction) for g in gradients
        ]
    present = [g for g in gradients if g is not None]
    together = riders or SummedTogether()
    if num_replicas() == 1 or tf.distribute.get_replica_context() is None:
        summed, summed_counts = present, counts
        together.all_reduce()
        if over_first_count:
            summed = _over_count(summed, counts[0])
    else:
        summed, summed_counts = _summed_together(
            present, counts, together, over_first_count, examples
        )
    sums = iter(summed)
    return [None if g is None else next(sums) for g in gradients], summed_counts


def _summed_together(
    gradients: list[Gradient],
    counts: list[tf.Tensor],
    together: SummedTogether,
    over_first_count: bool,
    examples: tf.Tensor | None,
) -> tuple[list[Gradient], list[tf.Tensor]]:
    dtype = _dense_dtype(gradients)
    parts = [SparseSum(g) for g in gradients]
    if any(part.sparse for part in parts):
        votes = iter(agreed([o for part in parts for o in part.once]))
        for part in parts:
            part.once = [next(votes) for _ in part.once]
    pieces = [part.pieces() for part in parts]
    flat = [p for ps in pieces for p in ps]
    # The dense pieces of the gradients' dtype, as one vector.
    dense = [
        i
        for i, p in enumerate(flat)
        if not isinstance(p, tf.IndexedSlices) and p.dtype == dtype
    ]
    if examples is not None:
        # One guard for all the dense gradients, one for each other piece.
        flat = [
            p if i in dense else only_if_real(p, examples) for i, p in enumerate(flat)
        ]
    vector = None
    if dense:
        whole = _concatenated([flat[i] for i in dense])
        vector = together.add(
            whole if examples is None else only_if_real(whole, examples)
        )
    others = {
        i: together.add(p, pack=not isinstance(p, tf.IndexedSlices))
        for i, p in enumerate(flat)
        if i not in dense
    }
    summed_counts = [together.add(tf.cast(c, dtype)) for c in counts]
    together.all_reduce()
    reduced_counts = [tf.cast(get(), c.dtype) for get, c in zip(summed_counts, counts)]
    reduced: dict[int, Any] = {i: get() for i, get in others.items()}
    if vector is not None:
        whole = vector()
        if over_first_count:
            whole = _over(whole, reduced_counts[0])
        reduced.update(zip(dense, _split_like(whole, [flat[i] for i in dense])))
    if over_first_count:
        reduced.update(
            {i: _over_count([reduced[i]], reduced_counts[0])[0] for i in others}
        )
    rest = iter(reduced[i] for i in range(len(flat)))
    summed = [
        part.assembled([next(rest) for _ in ps]) for part, ps in zip(parts, pieces)
    ]
    return summed, reduced_counts


def _over_count(gradients: Sequence[Gradient], count: tf.Tensor) -> list[Gradient]:
    def over(g: Gradient) -> Gradient:
        if isinstance(g, tf.IndexedSlices):
            return tf.IndexedSlices(_over(g.values, count), g.indices, g.dense_shape)
        return _over(g, count)

    return [over(g) for g in gradients]


def _concatenated(tensors: Sequence[tf.Tensor]) -> tf.Tensor:
    """`tensors` flattened and put end to end."""
    flat = [t if t.shape.rank == 1 else tf.reshape(t, [-1]) for t in tensors]
    return flat[0] if len(flat) == 1 else tf.concat(flat, 0)


def _split_like(vector: tf.Tensor, tensors: Sequence[tf.Tensor]) -> list[tf.Tensor]:
    """`vector` (`_concatenated(tensors)`) cut back into `tensors`' shapes."""
    if len(tensors) == 1:
        parts = [vector]
    else:
        sizes = [_size(t) for t in tensors]
        parts = tf.split(vector, sizes if _static(sizes) else tf.stack(sizes))
    return _reshaped(parts, tensors)


def _reshaped(
    parts: Sequence[tf.Tensor], tensors: Sequence[tf.Tensor]
) -> list[tf.Tensor]:
    """Each of `parts` (a vector) in the shape of its tensor in `tensors`."""
    return [
        part if t.shape.rank == 1 else tf.reshape(part, _shape(t))
        for part, t in zip(parts, tensors)
    ]


def _size(tensor: tf.Tensor) -> int | tf.Tensor:
    static = tensor.shape.num_elements()
    return tf.size(tensor) if static is None else static


def _shape(tensor: tf.Tensor) -> list[int] | tf.Tensor:
    shape = tensor.shape
    return shape.as_list() if shape.is_fully_defined() else tf.shape(tensor)


def _static(values: Sequence[Any]) -> bool:
    return all(isinstance(v, int) for v in values)


class SummedTogether:
    """Values summed across replicas in one collective: queue each with
    `add`, which returns its getter, then `all_reduce()` once (in replica
    context), then read each sum with its getter.

    Values of one dtype travel as one vector, one collective a dtype;
    integers travel as float32, exact below 2**24. A step queues its logs
    here and hands it to `sum_across_replicas`, so they ride on the
    gradients' collective.
    """

    def __init__(self) -> None:
        self._parts: dict[tf.DType, list[tf.Tensor]] = {}
        self._whole: list[Any] = []
        self._sums: dict[tf.DType, list[tf.Tensor]] = {}
        self._whole_sums: list[Any] = []
        self.reduced = False

    def add(self, value: Any, pack: bool = True) -> Callable[[], Any]:
        """Queues `value`; returns `get()`, its sum over replicas once
        `all_reduce()` ran. Unpacked (`pack=False`), `value` travels as it
        is (an `IndexedSlices`)."""
        if self.reduced:
            raise RuntimeError("Values are added before the all-reduce.")
        if not pack:
            self._whole.append(value)
            index = len(self._whole) - 1
            return lambda: self._whole_sums[index]
        value = tf.convert_to_tensor(value)
        dtype = value.dtype
        packed = value if dtype.is_floating else tf.cast(value, tf.float32)
        parts = self._parts.setdefault(packed.dtype, [])
        parts.append(packed)
        key, index = packed.dtype, len(parts) - 1
        return lambda: tf.cast(self._sums[key][index], dtype)

    def all_reduce(self) -> None:
        """Sums every queued value across replicas, in one collective."""
        self.reduced = True
        if num_replicas() == 1 or tf.distribute.get_replica_context() is None:
            # Each value is its own sum: nothing packed.
            self._sums, self._whole_sums = self._parts, self._whole
            return
        # One all-reduce a dtype: `tf.distribute` packs the tensors of one
        # call into one, of one dtype. Unpacked values ride with the first.
        whole = self._whole
        for dtype, parts in self._parts.items():
            summed = list(all_reduce_sum([_with_scalars_stacked(parts), *whole]))
            self._sums[dtype] = _unstacked(summed[0], parts)
            self._whole_sums += summed[1:]
            whole = []
        if whole:
            self._whole_sums = list(all_reduce_sum(whole))


def _with_scalars_stacked(tensors: list[tf.Tensor]) -> tf.Tensor:
    """`_concatenated(tensors)`, the scalars stacked first (one op, where
    each would take a reshape)."""
    scalars = [t for t in tensors if t.shape.rank == 0]
    others = [t for t in tensors if t.shape.rank != 0]
    if not scalars:
        return _concatenated(others)
    return _concatenated([tf.stack(scalars), *others])


def _unstacked(vector: tf.Tensor, tensors: list[tf.Tensor]) -> list[tf.Tensor]:
    """`vector` (`_with_scalars_stacked(tensors)`) cut back into `tensors`."""
    scalars = sum(1 for t in tensors if t.shape.rank == 0)
    others = [t for t in tensors if t.shape.rank != 0]
    if not scalars:
        return _split_like(vector, others)
    found: Iterator[tf.Tensor] = iter(())
    rest: Iterator[tf.Tensor] = iter(())
    if not others:
        found = iter(tf.unstack(vector, num=scalars))
    else:
        sizes = [scalars, *(_size(t) for t in others)]
        pieces = tf.split(vector, sizes if _static(sizes) else tf.stack(sizes))
        found = iter(tf.unstack(pieces[0], num=scalars))
        rest = iter(_reshaped(pieces[1:], others))
    return [next(found) if t.shape.rank == 0 else next(rest) for t in tensors]


def with_placeholder_rows(tensor: tf.Tensor, missing: tf.Tensor) -> tf.Tensor:
    """`tensor` with `missing` (0 or 1) placeholder rows of zeros appended:
    what a replica without examples computes on.

    A concatenation, not `tf.pad`: TensorFlow's oneDNN graph rewrite folds a
    `Pad` into the convolution it feeds as spatial padding, and a padded
    batch dimension is then lost (the convolution sees the empty batch).
    """
    inner = tensor.shape[1:]
    if inner.is_fully_defined():
        shape = tf.stack([missing, *inner.as_list()])
    else:
        shape = tf.concat([[missing], tf.shape(tensor)[1:]], 0)
    return tf.concat([tensor, tf.zeros(shape, tensor.dtype)], axis=0)


def _dense_dtype(gradients: Sequence[Gradient]) -> tf.DType:
    for g in gradients:
        if not isinstance(g, tf.IndexedSlices) and g.dtype.is_floating:
            return g.dtype
    return tf.float32


def assign_whole(
    variable: tf.Variable,
    value: npt.ArrayLike,
    strategy: tf.distribute.Strategy,
    add: bool = False,
) -> None:
    """Makes `variable` read `value` (its state plus `value`, if `add`)
    across every replica and worker, exactly: a summed variable holds it in
    the chief's first replica and zeros elsewhere (TensorFlow's own
    cross-replica assign splits it evenly, value / R on each, whose sum
    rounds); any other holds it everywhere. For restoring state written on
    another topology."""
    value = np.asarray(value)  # a list of Python floats is float64, not float32
    components = strategy.experimental_local_results(variable)
    here = topology.of(strategy)
    summed = here.replicas > 1 and variable.aggregation in (
        tf.VariableAggregation.SUM,
        "sum",
    )
    for index, component in enumerate(components):
        whole = not summed or (index == 0 and here.chief)
        part = tf.cast(value if whole else np.zeros_like(value), component.dtype)
        if add:
            component.assign_add(part)
        else:
            component.assign(part)


def examples_before(rows: tf.Tensor) -> tf.Tensor:
    """The examples of the replicas before this one in the global batch,
    which the strategy splits in replica order, for this replica's batch
    of `rows` examples (one all-gather of each replica's count)."""
    context = tf.distribute.get_replica_context()
    counts = context.all_gather(tf.reshape(tf.cast(rows, tf.int32), [1]), axis=0)
    return tf.reduce_sum(counts[: context.replica_id_in_sync_group])
