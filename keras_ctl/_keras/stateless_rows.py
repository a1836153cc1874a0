"""One replica's rows of a stateless draw for the global batch, drawn
alone (`rows_of`).

TensorFlow's stateless random kernels (Philox, which they pick on CPU and
GPU) fill their output in row-major order, a group of elements at a time:
group `g` is drawn from the key and the counter advanced by `g` times a
fixed step. So rows `before:` of a draw of `before + rows` rows are a draw
of their own from an advanced counter, and a replica draws only its own
examples' numbers instead of every row up to them. Checked bit for bit
against the wider draw, for each kind and dtype, in the tests.
"""

import functools

import numpy as np
import tensorflow as tf

_KERNELS = {
    "uniform": tf.raw_ops.StatelessRandomUniformV2,
    "normal": tf.raw_ops.StatelessRandomNormalV2,
    "truncated_normal": tf.raw_ops.StatelessTruncatedNormalV2,
    "uniform_int": tf.raw_ops.StatelessRandomUniformIntV2,
}

# Counter steps per group: one Philox block (four 32-bit numbers) a group,
# except truncated normal, which reserves 256 numbers an element for its
# rejections (`kReservedSamplesPerOutput` in TensorFlow's kernels).
_RESERVED_PER_ELEMENT = {"truncated_normal": 256}


def rows_of(kind, shape, before, seed, dtype, **bounds):
    """Rows `before:` of TensorFlow's stateless `kind` draw (see
    `_KERNELS`) of shape `[before + shape[0], *shape[1:]]` with `seed`,
    before any scaling: the numbers of the kernel, of shape `shape`.
    `before` may be a tensor; `bounds` are the kernel's other inputs
    (`minval`, `maxval` of `uniform_int`)."""
    dtype = tf.as_dtype(dtype)
    dimensions = _dimensions(shape)
    # A Philox block is four 32-bit numbers: four elements of 32 bits or
    # less, or two of 64.
    per_group = 2 if dtype.size == 8 else 4
    steps = max(1, _RESERVED_PER_ELEMENT.get(kind, 1) * per_group // 4)
    per_row = _product(dimensions[1:])
    static_before = tf.get_static_value(before)
    # A Python int where the trace knows it: the arithmetic makes no op.
    before = int(static_before) if static_before is not None else before
    rows = dimensions[0]
    static = all(isinstance(d, int) for d in dimensions)
    key, counter, alg = tf.raw_ops.StatelessRandomGetKeyCounterAlg(seed=seed)
    kernel = functools.partial(
        _KERNELS[kind],
        key=key,
        alg=alg,
        **({"dtype": dtype} if kind != "uniform_int" else {}),
        **bounds,
    )
    if isinstance(per_row, int) and per_row % per_group == 0:
        # Rows start at a group: nothing drawn in front of them, and the
        # draw in their shape is the flat draw's numbers in row-major order.
        advance = _times(before, per_row // per_group * steps)
        return kernel(
            shape=dimensions if static else tf.stack(dimensions),
            counter=_advanced(counter, advance),
        )
    # The rows start inside a group: its numbers in front of them are drawn
    # and dropped.
    if not isinstance(before, int):
        before = tf.cast(before, tf.int64)
    start = before * per_row
    lead, advance = start % per_group, start // per_group * steps
    count = lead + _product([rows, per_row])
    drawn = kernel(
        shape=[count] if isinstance(count, int) else tf.reshape(count, [1]),
        counter=_advanced(counter, advance),
    )
    if not isinstance(lead, int) or lead:
        drawn = drawn[lead:]
    return tf.reshape(drawn, dimensions if static else tf.stack(dimensions))


def _dimensions(shape):
    """`shape` (a list, a `TensorShape` or a 1-D tensor of known length) as
    a list: Python ints where known before the step runs, else int64
    scalars."""
    if isinstance(shape, tf.TensorShape):
        shape = shape.as_list()
    if not isinstance(shape, (list, tuple)):
        shape = tf.unstack(tf.convert_to_tensor(shape))
    dimensions = []
    for dimension in shape:
        static = tf.get_static_value(dimension)
        dimensions.append(
            tf.cast(dimension, tf.int64) if static is None else int(static)
        )
    return dimensions


def _product(dimensions):
    """The product of `dimensions`: a Python int where all are, no op."""
    static = [d for d in dimensions if isinstance(d, int)]
    dynamic = [d for d in dimensions if not isinstance(d, int)]
    product = int(np.prod(static, dtype=np.int64))
    for dimension in dynamic:
        product = product * dimension
    return product


def _times(count, factor):
    """`count x factor` (counter steps): a Python int where `count` is,
    else a uint64 tensor."""
    if isinstance(count, int):
        return count * factor
    steps = tf.cast(count, tf.uint64)
    return steps if factor == 1 else steps * tf.constant(factor, tf.uint64)


def _advanced(counter, steps):
    """The 128-bit Philox `counter` (two uint64, low first) plus `steps`."""
    if isinstance(steps, int) and steps == 0:
        return counter
    low, high = tf.unstack(counter, num=2)
    if isinstance(steps, int):
        steps = tf.constant(steps, tf.uint64)
    advanced = low + tf.cast(steps, tf.uint64)
    carry = tf.cast(advanced < low, tf.uint64)
    return tf.stack([advanced, high + carry])
