"""The scope in which the replacements of `table.REPLACEMENTS` are in
place.

Nothing is replaced on import. `in_effect()` puts the whole table in place
when the outermost keras_ctl call starts (in any thread) and puts Keras's
own attributes back when the last one ends: on return, on an exception, on
`KeyboardInterrupt`. The one exception is `SHARDED_READS`, kept for the
process once a CTLModel is made under a `ParameterServerStrategy`. While
in place, each replacement does what Keras does unless this thread runs a
replica step of keras_ctl (`replica_step`) or an object keras_ctl marked
asks otherwise, so plain Keras in another thread keeps Keras's
behaviour. Checked on Keras 3.12.0 and 3.15.1; the owners are looked up
through `names` (3.16 moved some).
"""

import contextlib
import threading
from collections.abc import Iterator

import keras

from keras_ctl._keras import behaviours
from keras_ctl._keras import names
from keras_ctl._keras import optimizers
from keras_ctl._keras.behaviours import Replacement
from keras_ctl._keras.state import in_step
from keras_ctl._keras.table import REPLACEMENTS


def _where(replacement: Replacement) -> tuple[object, str]:
    """`(owner, name)` the row replaces in this Keras: its own, else its
    fallback's where Keras lacks the private owner."""
    try:
        return replacement.owner(), replacement.name
    except names.KerasInternalMissing:
        if replacement.fallback is None:
            raise
        owner, name = replacement.fallback
        return owner(), name


_lock = threading.Lock()
_users = 0
# (owner, name, Keras's own entry of `vars(owner)` or `_ABSENT`, replacement)
_installed: list[tuple[object, str, object, object]] = []
# The same, for the rows `keep_sharded_reads` keeps in place.
_kept: list[tuple[object, str, object, object]] = []
_ABSENT = object()

# The one exception to "only while keras_ctl runs": reads of a variable
# sharded across parameter servers. A user's own `tf.train.Checkpoint(...)`
# or `np.asarray(variable)` after `fit()` reads it outside keras_ctl's
# calls, and fails without them. They change nothing for a variable that is
# not sharded, and plain Keras makes none (`keep_sharded_reads`).
SHARDED_READS = ("__array__", "_serialize_to_tensors")


def keep_sharded_reads():
    """Keeps the `SHARDED_READS` rows in place for the process: called when
    a CTLModel is made under a `ParameterServerStrategy`."""
    with _lock:
        if _kept:
            return
        for replacement in REPLACEMENTS:
            if replacement.name in SHARDED_READS:
                _kept.append(_put_in_place(replacement, *_where(replacement)))


@contextlib.contextmanager
def in_effect():
    """Within it, the replacements are in place, in every thread; they are
    Keras's own attributes again when the last `in_effect` of the process
    ends. Nests and may be entered from several threads at once."""
    global _users
    with _lock:
        if _users == 0:
            _install()
        _users += 1
    try:
        yield
    finally:
        with _lock:
            _users -= 1
            if _users == 0:
                _restore()


def _install():
    try:
        for replacement in REPLACEMENTS:
            behaviours.named(replacement.behaviour)  # every row, loudly
        for replacement in REPLACEMENTS:
            owner, name = _where(replacement)
            if owner is None:
                continue
            current = getattr(owner, name)
            if any(current is new for *_, new in _installed + _kept):
                continue  # inherited from a class replaced already, or kept
            _installed.append(_put_in_place(replacement, owner, name))
    except BaseException:
        _restore()
        raise


# Each replacement made once per original: the same function object every
# call, so what TensorFlow caches by function (autograph's conversions)
# stays valid from one keras_ctl call to the next.
_made: dict[tuple[Replacement, int], tuple[object, object]] = {}


def _put_in_place(replacement, owner, name):
    own = vars(owner).get(name, _ABSENT)
    current = getattr(owner, name)
    key = (replacement, id(current))
    if key not in _made:
        _made[key] = (current, replacement.make(current))
    new = _made[key][1]
    setattr(owner, name, new)
    return owner, name, own, new


def _restore():
    while _installed:
        owner, name, own, new = _installed.pop()
        if vars(owner).get(name) is not new:
            continue  # replaced again by someone else since: leave theirs
        if own is _ABSENT:
            delattr(owner, name)
        else:
            setattr(owner, name, own)


def replaced():
    """`[(owner, name)]` of every attribute the table replaces in this Keras."""
    return [where for r in REPLACEMENTS if (where := _where(r))[0] is not None]


@contextlib.contextmanager
def replica_step(
    written=None, stands_for_trace=False, batch_statistics=None, assigned=None
):
    """Within it (in this thread), Keras code called by a replica step is
    exact across replicas: `Loss` objects, synchronized BatchNorm, layers of
    a replica without examples, `optimizer.apply`, and variables that
    workers share or parameter servers shard (`REPLACEMENTS`). The ids of
    the variables it assigns are added to the set `written`, when given,
    and `(variable, value)` to the list `assigned`.
    `stands_for_trace`: the step runs eagerly in place of a traced one, so
    shapes the trace would not know are taken as unknown
    (the behaviour `weighed_by_batch`). `batch_statistics="global"`:
    moments over the examples' axis are the global batch's (the behaviour
    `moments_over_global_batch`)."""
    with in_effect():
        previous = vars(in_step).copy()
        in_step.active = True
        in_step.real_examples = None
        in_step.written = written
        in_step.assigned = assigned
        in_step.batch_statistics = batch_statistics
        in_step.stands_for_trace = stands_for_trace
        try:
            yield
        finally:
            vars(in_step).clear()
            vars(in_step).update(previous)


@contextlib.contextmanager
def gradients_already_summed(optimizer: keras.optimizers.Optimizer) -> Iterator[None]:
    """`optimizers.gradients_already_summed`, with Keras's all-reduce of
    gradients switchable."""
    with in_effect(), optimizers.gradients_already_summed(optimizer):
        yield
