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
    before = tf.cast(before, tf.int64)
    rows = dimensions[0]
    if isinstance(per_row, int) and per_row % per_group == 0:
        # Rows start at a group: nothing drawn in front of them.
        lead: int | tf.Tensor = 0
        advance = before * (per_row // per_group * steps)
    else:
        start = before * per_row
        lead, advance = start % per_group, start // per_group * steps
    count = _product([rows, per_row])
    if not isinstance(lead, int):
        count = lead + count
    key, counter, alg = tf.raw_ops.StatelessRandomGetKeyCounterAlg(seed=seed)
    drawn = _KERNELS[kind](
        shape=[count] if isinstance(count, int) else tf.reshape(count, [1]),
        key=key,
        counter=_advanced(counter, advance),
        alg=alg,
        **({"dtype": dtype} if kind != "uniform_int" else {}),
        **bounds,
    )
    if not isinstance(lead, int):
        drawn = drawn[lead:]
    static = all(isinstance(d, int) for d in dimensions)
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


def _advanced(counter, steps):
    """The 128-bit Philox `counter` (two uint64, low first) plus `steps`."""
    low = counter[0] + tf.cast(steps, tf.uint64)
    carry = tf.cast(low < counter[0], tf.uint64)
    return tf.stack([low, counter[1] + carry])
