"""The keras.io corpus: examples whose model overrides `train_step`,
`test_step`, `compute_loss` or `compute_metrics`, their model code as
published (keras-team/keras-io, Apache License 2.0) with the base class a
parameter, on tiny data.

Each module has `SOURCE` (its keras-io path) and `train(base, strategy,
parity=True)`, which builds, compiles and fits the example in the current
dtype and returns `{"weights": [...], "history": {...}}`. `parity=True`
takes the step's random draws from the data (marked where the code
changes), so one device and R replicas see the same numbers; `False` runs
the step as written, with its own randomness.

Sizes: 17 rows, batch 8. The last batch has one row, so under 2
or 3 replicas some replica gets none.
"""

import importlib
import threading
import zlib

import keras
import numpy as np

SIZE, BATCH, EPOCHS = 17, 8, 2

# Equal to one device in parity mode.
EXACT = (
    "conditional_gan",
    "dcgan",
    "cyclegan",
    "trainer_pattern",
    "distiller",
    "simsiam",
    "consistency_training",
    "barlow_twins",
    "simclr",
    "adamatch",
    "mlm",
    "nnclr",
    "rs_sequential_retrieval",
    "rs_multi_task",
    "vae",
    "zero_dce",
    "vq_vae",
    "wgan_gp",
    "siamese_network",
    # The second siamese form: a contrastive loss of its own, a mean.
    "siamese_contrastive",
    "metric_learning",
    "nl_image_search",
    "ddpm",
    # A per-pixel loss that `tape.gradient` sums: run in shares as measured.
    "ddim",
    "molecule_generation",
    "wgan_graphs",
    "custom_train_step_guide",
    "adain",
    "melgan",
    "gan_ada",
    "deit",
    # Each looks a position table up once a batch (`emb(range(T))`), its
    # sparse gradient summed position by position as one device has it.
    "masked_image_modeling",
    "transformer_asr",
    "image_captioning",
)
# Examples whose trained layers equal one device in parity mode, warned of
# by name for a value they keep of each replica's examples (words of the
# warning): Forward-Forward's layers train themselves with optimizers of
# their own, summed as the model's, and its step adds each layer's
# tracker's result, the replica's own, to `loss_var` (an unnamed
# `keras.Variable`, named by Keras in the order made).
WARNED = {
    "forward_forward": "(from the result of Mean `mean`, read inside the step) "
    "from each replica's own examples",
}
# Semantic image clustering is ported, and in parity
# mode equals one device on 2 replicas and in float64 on 3; in float32 on
# 3 replicas its last batch (1, 0 and 0 examples) stops on a shape mismatch
# between the collectives of its two synchronized BatchNorm layers (12
# values against 9), not yet explained; as written, a replica without
# examples divides by its batch size, 0. Left out:
# RealNVP needs TensorFlow Probability, not installed here.
# Run as written under replicas, with their own randomness. As written,
# Barlow Twins', SimCLR's and AdaMatch's losses couple the examples of the
# replica's batch (their parity modes gather them). The masked language
# model's `compute_loss` returns a sum over the batch's tokens, read in
# shares as measured: exact as written (its parity mode gives it the global
# batch's: docs/guides/custom-step.md, "Overriding `compute_loss`").
AS_WRITTEN = (
    "conditional_gan",
    "dcgan",
    "trainer_pattern",
    "vae",
    "simsiam",
    "barlow_twins",
    "simclr",
    "consistency_training",
    "adamatch",
    "vq_vae",
    "zero_dce",
    "wgan_gp",
    "metric_learning",
    "nl_image_search",
    "ddpm",
    "molecule_generation",
    "custom_train_step_guide",
    "adain",
    "deit",
    "masked_image_modeling",
    "transformer_asr",
    "siamese_network",
    "mlm",
    "siamese_contrastive",
    "forward_forward",
)
# NNCLR does not run as written: on a replica without examples its queue
# update, `feature_queue[:-batch_size]` with a batch size of 0, is empty;
# the step stops with keras_ctl's error that names the shapes, the replica
# and the line (`REFUSED_AS_WRITTEN`).
# The graph WGAN does not either: it keeps the replica's batch size in
# `self.batch_size`, which the replica threads share; read after the
# critic's update, it is another replica's (`loss_gen` NaN on the last
# batch). As written, GAN-ADA's augmentation probability, a variable, is
# set from a mean over the replica's examples: NaN on a replica without
# examples, and each replica keeps its own copy (`aug_p` logs NaN).
# As written, AdaMatch's step is declared written in shares (its parity mode
# divides by the replica count), so its logged losses are a replica's local
# means: NaN for a replica without examples (docs/good-to-know.md, "A step
# of one's own is read as one device's code").
LOCAL_MEANS_LOGGED = ("adamatch",)
# float64 relative difference and float32 absolute difference allowed.
TOLERANCE = {"float64": 1e-9, "float32": 1e-5}
# Examples whose round-off an optimizer amplifies, the logic exact: a
# weight whose gradient is 0 but for round-off (a bias that cancels) moves
# under Adam by round-off over Adam's epsilon (1e-7) times the learning
# rate, where one device and the replicas round differently.
# - The WGAN-GP's critic biases end near 2e-3 with gradients near 0; on 3
#   replicas one ends 1.3e-5 off in float32 (float64: 6.0e-16).
# - The siamese network's last biases cancel in its distances (`f(A) -
#   f(P)`); in float32 they and the logged losses end up to 2.5e-4 off on
#   3 replicas (float64: 4.6e-14, in those biases).
# - Semantic image clustering's convolution bias before a BatchNorm
#   cancels; it ends at 7.1e-10 on one device (its true value 0) and
#   1.1e-9 from it on 3 replicas in float64 (AdamW, learning rate 1e-3).
TOLERANCE_OF = {
    "wgan_gp": {"float32": 5e-5},
    "siamese_network": {"float32": 5e-4},
    "semantic_image_clustering": {"float64": 1e-8},
}


# Examples that stop as written under replicas, and the start of the
# message that names why, by replica count. NNCLR logs its loss per
# example: on 3 replicas the first batch's parts (3, 3, 2) give logs of two
# sizes; on 2 (4, 4) its queue fails on the last batch (1, 0). keras-rs's
# retrieval losses score in-batch candidates: measured on the first batch,
# they are neither a mean nor a sum over examples
# (`compute_loss_over="global_batch"`, in parity mode, makes them one
# device's). (The siamese network's step and the masked language model's
# `compute_loss`, sums over examples, run in shares as measured: exact as
# written.)
# MelGAN's dB floor is set by the largest value of the batch, and image
# captioning's caption loss is a masked mean over the batch's count of
# tokens: each couples the batch's examples (their parity modes make it
# the global batch's).
REFUSED_AS_WRITTEN = {
    "nnclr": {
        2: "The step assigned a value of shape [0, 8] to a variable of shape [24, 8] (",
        3: "The replicas summed values of different sizes in one collective of "
        "the step. Received: ",
    },
    **{
        name: dict.fromkeys(
            (2, 3),
            f"{model}.compute_loss is neither a mean nor a sum over examples: "
            "on the first batch (",
        )
        for name, model in (
            ("rs_sequential_retrieval", "SequentialRetrievalModel"),
            ("rs_multi_task", "MultiTaskModel"),
        )
    },
    **{
        name: dict.fromkeys(
            (2, 3),
            f"{model}.train_step is read as one device's code, but the "
            "gradients it applies on the first batch (",
        )
        for name, model in (
            ("melgan", "MelGAN"),
            ("image_captioning", "ImageCaptioningModel"),
        )
    },
}


def refusal_as_written(name, strategy):
    """`[]` when example `name`, trained as written on `strategy`, stops
    with its `REFUSED_AS_WRITTEN` message, else the problem."""
    import keras_ctl

    expected = REFUSED_AS_WRITTEN[name][strategy.num_replicas_in_sync]
    try:
        train(name, keras_ctl.CTLModel, strategy, parity=False)
    except ValueError as error:
        return [] if str(error).startswith(expected) else [f"stopped: {error}"]
    return ["ran, not refused"]


def warned_on_2_replicas(name):
    """`(largest difference of the trained layers' weights, warnings)` of
    example `name` in float64, `keras.Model` on one device against
    CTLModel on 2 replicas, and the warnings the latter gave."""
    import warnings

    import configurations
    import devices

    import keras_ctl

    with configurations.computing_in("float64"):
        expected = train(name, keras.Model, devices.get("default"))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = train(name, keras_ctl.CTLModel, devices.get("mirrored"))
    pairs = zip(got["layer_weights"], expected["layer_weights"], strict=True)
    largest = max(float(np.max(np.abs(g - e))) for g, e in pairs)
    return largest, [str(w.message) for w in caught]


def tolerance(name, dtype):
    """The largest difference allowed for example `name` in `dtype`."""
    return TOLERANCE_OF.get(name, {}).get(dtype, TOLERANCE[dtype])


# The longest examples (30 s or more for one check: four models traced,
# or a U-Net, MelGAN's three-scale critic, a teacher, a transformer):
# `.ci/keras_io.py` runs them; the suite, which must stay within its time,
# does not (`tests/models/table_lookups_test.py` holds the transformers'
# position tables).
LONGEST = (
    "cyclegan",
    "ddpm",
    "ddim",
    "melgan",
    "deit",
    "gan_ada",
    "masked_image_modeling",
    "transformer_asr",
    "image_captioning",
)


def in_suite(replicas):
    """The exact examples the suite runs on `replicas` (2 or 3)."""
    return [
        name
        for name in EXACT
        if name not in LONGEST and replicas_in_suite(name) == replicas
    ]


def replicas_in_suite(name):
    """The replica count (2 or 3) the test suite runs example `name` on, or
    `None`, from a hash of its name: half the examples on 2 replicas, a
    quarter on 3 (a child process of their own, in float64: a long check,
    `.ci/long_checks`). `.ci/keras_io` runs every example on 1, 2 and 3
    replicas, in float64 and float32, and as written."""
    hashed = zlib.crc32(name.encode()) % 4
    return {0: 2, 2: 2, 1: 3}.get(hashed)


def train(name, base, strategy, parity=True):
    return importlib.import_module(f"keras_io.{name}").train(base, strategy, parity)


def difference_on_2_replicas(name):
    """`(largest difference, update counts equal)` of example `name` in
    float64, `keras.Model` on one device against CTLModel on 2 replicas."""
    import configurations
    import devices

    import keras_ctl

    with configurations.computing_in("float64"):
        expected = train(name, keras.Model, devices.get("default"))
        got = train(name, keras_ctl.CTLModel, devices.get("mirrored"))
    return largest_difference(expected, got), got["iterations"] == expected[
        "iterations"
    ]


def largest_difference(expected, got):
    """The largest relative difference of weights and history values."""
    pairs = list(zip(got["weights"], expected["weights"], strict=True))
    assert set(got["history"]) == set(expected["history"]), (got, expected)
    pairs += [(got["history"][k], v) for k, v in expected["history"].items()]
    # `np.max`, not `max`: a NaN difference is the largest, in any order.
    return float(
        np.max(
            [
                np.max(np.abs(np.subtract(g, e)) / np.maximum(1.0, np.abs(e)))
                for g, e in pairs
            ]
        )
    )


def result(model, history):
    """Weights, history and each optimizer's update count of `model`."""
    return {
        "weights": [np.asarray(w, "float64") for w in model.get_weights()],
        "history": {k: np.asarray(v, "float64") for k, v in history.history.items()},
        "iterations": sorted(
            int(value.iterations.numpy())
            for value in vars(model).values()
            if isinstance(value, keras.optimizers.Optimizer)
        ),
    }


def compare(names, strategy, dtypes=tuple(TOLERANCE)):
    """`{dtype: {name: largest difference}}` of CTLModel under `strategy`
    against keras.Model on one device, in each of `dtypes`."""
    import configurations
    import tensorflow as tf

    import keras_ctl

    found = {}
    for dtype in dtypes:
        with configurations.computing_in(dtype):
            found[dtype] = {
                name: largest_difference(
                    train(name, keras.Model, tf.distribute.get_strategy()),
                    train(name, keras_ctl.CTLModel, strategy),
                )
                for name in names
            }
    return found


def problems_as_written(name, got):
    """What is wrong with `got`, example `name` trained as written (its own
    randomness) on several replicas: `[]` when every optimizer the step
    uses was applied the same number of times a step (once, the WGAN-GP
    critic's extra steps, or image captioning's once a caption; a GAN's
    `super().compile()` adds a default optimizer that it never uses), a step counter of the model's own counts
    steps, as on one device, and weights and logs are finite."""
    steps = EPOCHS * -(-SIZE // BATCH)
    problems = []
    used = [count for count in got["iterations"] if count]
    if not used or any(count % steps for count in used):
        problems.append(f"optimizer updates {got['iterations']}, {steps} steps")
    if got.get("current_step", steps) != steps:
        problems.append(f"step counter {got['current_step']}, {steps} steps")
    if not all(np.isfinite(w).all() for w in got["weights"]):
        problems.append("weights not finite")
    if name not in LOCAL_MEANS_LOGGED:
        for key, values in got["history"].items():
            if not np.isfinite(values).all() or len(values) != EPOCHS:
                problems.append(f"log {key}: {list(values)}")
    return problems


class DrawsFromData:
    """Random draws a step takes from its data instead (parity mode).

    Replica threads share the model, so the draws are kept per thread.
    """

    def __init__(self):
        self._local = threading.local()

    def hold(self, draws):
        self._local.draws = list(draws)

    def next(self):
        return self._local.draws.pop(0)
