"""Training cases shared by the invariance tests and their child processes.

Each case builds the same model twice (plain `keras.Model` on one device as
the reference, `CTLModel` under a strategy), trains it with `shuffle=False`
and reports weights, `history` and `evaluate()` as plain lists.
"""

import keras
import numpy as np

import keras_ctl

EPOCHS = 2


def digits(n, seed=0):
    """`n` 8x8 pseudo-digits with labels (deterministic, no download)."""
    rng = np.random.default_rng(seed)
    x = rng.random((n, 8, 8, 1), dtype=np.float32)
    y = (x.reshape(n, -1)[:, :10].argmax(axis=1)).astype("int32")
    return x, y


def _conv_body(inputs):
    h = keras.layers.Conv2D(
        6,
        3,
        activation="relu",
        kernel_regularizer=keras.regularizers.l2(1e-2),
        kernel_initializer=keras.initializers.GlorotUniform(seed=1),
    )(inputs)
    h = keras.layers.Flatten()(h)
    return _AddLoss()(h)


@keras.saving.register_keras_serializable(package="tests")
class _AddLoss(keras.layers.Layer):
    """Adds a weight-free loss with `add_loss` (same on every replica)."""

    def build(self, input_shape):
        self.scale = self.add_weight(shape=(), initializer="ones", name="scale")

    def call(self, x):
        self.add_loss(1e-3 * keras.ops.square(self.scale))
        return x * self.scale


def _dense(units, seed, **kwargs):
    return keras.layers.Dense(
        units, kernel_initializer=keras.initializers.GlorotUniform(seed=seed), **kwargs
    )


# Optimizer options that act on the summed gradient, on the empty-replica
# data (97 examples, batch 8): the clipping thresholds bind on most steps.
OPTIMIZER_CASES = {
    "global_clipnorm": {"global_clipnorm": 0.05},
    "clipnorm": {"clipnorm": 0.02},
    "clipvalue": {"clipvalue": 0.002},
    "ema_overwrite": {"use_ema": True, "ema_overwrite_frequency": 5},
    "accumulation": {"gradient_accumulation_steps": 3},
}


def keras_io_guide_model(base, step):
    """A model class of the keras.io guide "Customizing what happens in
    fit()" (TensorFlow), copied as written with `keras.Model` as `base`."""
    import tensorflow as tf

    class CustomModel(base):
        def train_step(self, data):
            # Unpack the data. Its structure depends on your model and
            # on what you pass to `fit()`.
            x, y = data

            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)  # Forward pass
                # Compute the loss value
                # (the loss function is configured in `compile()`)
                loss = self.compute_loss(y=y, y_pred=y_pred)

            # Compute gradients
            trainable_vars = self.trainable_variables
            gradients = tape.gradient(loss, trainable_vars)

            # Update weights
            self.optimizer.apply(gradients, trainable_vars)

            # Update metrics (includes the metric that tracks the loss)
            for metric in self.metrics:
                if metric.name == "loss":
                    metric.update_state(loss)
                else:
                    metric.update_state(y, y_pred)

            # Return a dict mapping metric names to current value
            return {m.name: m.result() for m in self.metrics}

    class SampleWeightModel(base):
        def train_step(self, data):
            # Unpack the data. Its structure depends on your model and
            # on what you pass to `fit()`.
            if len(data) == 3:
                x, y, sample_weight = data
            else:
                sample_weight = None
                x, y = data

            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)  # Forward pass
                # Compute the loss value.
                # The loss function is configured in `compile()`.
                loss = self.compute_loss(
                    y=y,
                    y_pred=y_pred,
                    sample_weight=sample_weight,
                )

            # Compute gradients
            trainable_vars = self.trainable_variables
            gradients = tape.gradient(loss, trainable_vars)

            # Update weights
            self.optimizer.apply(gradients, trainable_vars)

            # Update the metrics.
            # Metrics are configured in `compile()`.
            for metric in self.metrics:
                if metric.name == "loss":
                    metric.update_state(loss)
                else:
                    metric.update_state(y, y_pred, sample_weight=sample_weight)

            # Return a dict mapping metric names to current value.
            # Note that it will include the loss (tracked in self.metrics).
            return {m.name: m.result() for m in self.metrics}

    class TestStepModel(CustomModel):
        def test_step(self, data):
            # Unpack the data
            x, y = data
            # Compute predictions
            y_pred = self(x, training=False)
            # Updates the metrics tracking the loss
            loss = self.compute_loss(y=y, y_pred=y_pred)
            # Update the metrics.
            for metric in self.metrics:
                if metric.name == "loss":
                    metric.update_state(loss)
                else:
                    metric.update_state(y, y_pred)
            # Return a dict mapping metric names to current value.
            # Note that it will include the loss (tracked in self.metrics).
            return {m.name: m.result() for m in self.metrics}

    class LowerLevelModel(base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.loss_tracker = keras.metrics.Mean(name="loss")
            self.mae_metric = keras.metrics.MeanAbsoluteError(name="mae")
            self.loss_fn = keras.losses.MeanSquaredError()

        def train_step(self, data):
            x, y = data

            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)  # Forward pass
                # Compute our own loss
                loss = self.loss_fn(y, y_pred)

            # Compute gradients
            trainable_vars = self.trainable_variables
            gradients = tape.gradient(loss, trainable_vars)

            # Update weights
            self.optimizer.apply(gradients, trainable_vars)

            # Compute our own metrics
            self.loss_tracker.update_state(loss)
            self.mae_metric.update_state(y, y_pred)
            return {
                "loss": self.loss_tracker.result(),
                "mae": self.mae_metric.result(),
            }

        @property
        def metrics(self):
            # We list our `Metric` objects here so that `reset_states()` can be
            # called automatically at the start of each epoch
            # or at the start of `evaluate()`.
            return [self.loss_tracker, self.mae_metric]

    return {
        "train_step": CustomModel,
        "sample_weight": SampleWeightModel,
        "test_step": TestStepModel,
        "lower_level": LowerLevelModel,
    }[step]


# The keras.io guide's steps, on 103 digits in batches of 16: the last one,
# of 7, splits unevenly over 2, 3 and 4 replicas and leaves none empty (a
# step of one's own gets no placeholder example; a convolution's gradient
# fails on an empty batch).
GUIDE_CASES = {
    "guide_train_step": "train_step",
    "guide_clipnorm": "train_step",  # `self.optimizer.apply` clips the sum
    "guide_sample_weight": "sample_weight",
    "guide_test_step": "test_step",
    "guide_lower_level": "lower_level",
}


def in_batch_negatives_model(base):
    """`base` with a `compute_loss` written for one device that couples the
    batch: each example's target against every other one of the batch."""

    class InBatchNegatives(base):
        def compute_loss(self, x, y, y_pred, sample_weight=None, training=True):
            scores = keras.ops.matmul(y_pred, keras.ops.transpose(y))
            labels = keras.ops.eye(keras.ops.shape(scores)[0], dtype=scores.dtype)
            return keras.ops.mean(
                keras.losses.categorical_crossentropy(labels, scores, from_logits=True)
            )

    return InBatchNegatives


def build(case, model_class):
    """Returns `(model, fit_kwargs, eval_kwargs)` for `case`."""
    inputs = keras.Input((8, 8, 1))
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    compile_kwargs = {}
    optimizer_options = OPTIMIZER_CASES.get(case, {})
    if optimizer_options:
        case = "empty_replica"
    elif case == "guide_clipnorm":
        optimizer_options = {"global_clipnorm": 0.05}
    if case in ("uneven", "empty_replica", "sample_weight", "tutorial"):
        n, batch = {
            "uneven": (1001, 64),
            "empty_replica": (97, 8),
            "sample_weight": (203, 16),
            "tutorial": (256, 32),
        }[case]
        outputs = _dense(10, 2)(_conv_body(inputs))
        x, y = digits(n)
        data = {"x": x, "y": y}
        if case == "sample_weight":
            data["sample_weight"] = np.linspace(0.1, 2.0, n).astype("float32")
        compile_kwargs["metrics"] = ["accuracy"]
    elif case == "guide_lower_level":  # its own MSE loss and trackers
        model_class = keras_io_guide_model(model_class, GUIDE_CASES[case])
        outputs = _dense(1, 2)(_conv_body(inputs))
        x, _ = digits(103)
        batch = 16
        data = {"x": x, "y": x.mean(axis=(1, 2))}
        loss = "mse"  # for evaluate(); the step uses its own
    elif case in GUIDE_CASES:
        model_class = keras_io_guide_model(model_class, GUIDE_CASES[case])
        outputs = _dense(10, 2)(_conv_body(inputs))
        x, y = digits(103)
        batch = 16
        data = {"x": x, "y": y}
        if case == "guide_sample_weight":
            data["sample_weight"] = np.linspace(0.1, 2.0, 103).astype("float32")
        compile_kwargs["metrics"] = ["accuracy"]
    elif case == "sync_batchnorm":  # a replica gets no example (97, batch 8)
        h = keras.layers.Conv2D(
            4, 3, kernel_initializer=keras.initializers.GlorotUniform(seed=1)
        )(inputs)
        h = keras.layers.BatchNormalization(synchronized=True, momentum=0.5)(h)
        h = keras.layers.Flatten()(keras.layers.ReLU()(h))
        outputs = _dense(10, 2)(h)
        x, y = digits(97)
        batch = 8
        data = {"x": x, "y": y}
        compile_kwargs["metrics"] = ["accuracy"]
    elif case == "per_pixel":
        outputs = keras.layers.Conv2D(
            3,
            3,
            padding="same",
            kernel_initializer=keras.initializers.GlorotUniform(seed=3),
        )(inputs)
        x, _ = digits(101)
        y = (x[..., 0] * 3).astype("int32")
        batch = 16
        data = {"x": x, "y": y}
    elif case == "in_batch_negatives":  # a loss coupling the batch (97, batch 8)
        model_class = in_batch_negatives_model(model_class)
        outputs = _dense(8, 6)(_conv_body(inputs))
        x, _ = digits(97)
        batch = 8
        data = {"x": x, "y": x[..., 0].mean(axis=1)}
        loss = None
        if issubclass(model_class, keras_ctl.CTLModel):
            compile_kwargs["compute_loss_over"] = "global_batch"
    elif case == "multi_output":
        h = _conv_body(inputs)
        outputs = {
            "label": _dense(10, 4, name="label")(h),
            "mean": _dense(1, 5, name="mean")(h),
        }
        x, y = digits(150)
        batch = 16
        data = {"x": x, "y": {"label": y, "mean": x.mean(axis=(1, 2))}}
        loss = {"label": loss, "mean": "mse"}
        compile_kwargs["loss_weights"] = {"label": 1.0, "mean": 0.5}
    else:
        raise ValueError(f"Unknown case: {case}")
    model = model_class(inputs, outputs)
    optimizer = keras.optimizers.SGD(0.1, **optimizer_options)
    model.compile(optimizer=optimizer, loss=loss, **compile_kwargs)
    fit_kwargs = dict(data, batch_size=batch, epochs=EPOCHS, shuffle=False, verbose=0)
    eval_kwargs = dict(data, batch_size=batch, verbose=0, return_dict=True)
    return model, fit_kwargs, eval_kwargs


def run(case, model_class=keras_ctl.CTLModel, strategy=None, **compile_options):
    """Trains `case` and returns its weights, history and evaluation."""
    import tensorflow as tf

    strategy = strategy or tf.distribute.get_strategy()
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model, fit_kwargs, eval_kwargs = build(case, model_class)
        if compile_options:
            model.compile(
                optimizer=model.optimizer,
                loss=model.loss,
                metrics=["accuracy"],
                **compile_options,
            )
    history = model.fit(**fit_kwargs).history
    evaluation = model.evaluate(**eval_kwargs)
    return {
        "weights": [w.tolist() for w in model.get_weights()],
        "history": {k: [float(v) for v in vs] for k, vs in history.items()},
        "evaluate": {k: float(v) for k, v in evaluation.items()},
    }


INVARIANCE_CASES = (
    "uneven",
    "empty_replica",
    "per_pixel",
    "sample_weight",
    "multi_output",
    "sync_batchnorm",
    "in_batch_negatives",
    *OPTIMIZER_CASES,
    *GUIDE_CASES,
)


def run_tutorial_loop(strategy=None):
    """Trains the "tutorial" case with the tutorial's hand-written loop."""
    import tensorflow as tf
    import tutorial_loop

    strategy = strategy or tf.distribute.get_strategy()
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model, fit_kwargs, _ = build("tutorial", keras.Model)
    losses = tutorial_loop.train(
        model,
        fit_kwargs["x"],
        fit_kwargs["y"],
        fit_kwargs["batch_size"],
        EPOCHS,
        strategy,
    )
    return {
        "weights": [w.tolist() for w in model.get_weights()],
        "history": {"loss": losses},
    }


def run_all(strategy):
    """Every invariance case, the spe=32 variant and seed parity on `strategy`."""
    results = {case: run(case, strategy=strategy) for case in INVARIANCE_CASES}
    results["uneven_spe32"] = run("uneven", strategy=strategy, steps_per_execution=32)
    results["uneven_xla"] = run("uneven", strategy=strategy, jit_compile=True)
    results["tutorial_ctl"] = run("tutorial", strategy=strategy)
    results["tutorial_loop"] = run_tutorial_loop(strategy)
    results["gan"] = run_gan(strategy)
    results["gan_clipped"] = run_gan(strategy, **GAN_CLIPPING)
    results["gan_ema"] = run_gan(strategy, **GAN_EMA)
    return results


GAN_LATENT = 8
GAN_D_STEPS = 2


def build_gan(seed=0, synchronized_norm=False, **gan_kwargs):
    """A tiny DCGAN for 8x8 images, with fixed initial weights;
    `synchronized_norm` adds a synchronized BatchNorm to the discriminator."""
    init = keras.initializers.GlorotUniform
    generator = keras.Sequential(
        [
            keras.Input((GAN_LATENT,)),
            keras.layers.Dense(16, activation="relu", kernel_initializer=init(seed)),
            keras.layers.Dense(
                64, activation="sigmoid", kernel_initializer=init(seed + 1)
            ),
            keras.layers.Reshape((8, 8, 1)),
        ],
        name="generator",
    )
    discriminator = keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Conv2D(4, 3, kernel_initializer=init(seed + 2)),
            *(
                [keras.layers.BatchNormalization(synchronized=True)]
                if synchronized_norm
                else []
            ),
            keras.layers.LeakyReLU(0.2),
            keras.layers.Flatten(),
            keras.layers.Dense(1, kernel_initializer=init(seed + 3)),
        ],
        name="discriminator",
    )
    options = {"d_steps": GAN_D_STEPS, "label_noise": 0.0, "seed": 7, **gan_kwargs}
    return keras_ctl.GAN(
        discriminator=discriminator,
        generator=generator,
        latent_dim=GAN_LATENT,
        **options,
    )


def gan_data(n=101, d_steps=GAN_D_STEPS):
    x, _ = digits(n)
    rng = np.random.default_rng(1)
    latents = rng.normal(size=(n, d_steps + 1, GAN_LATENT)).astype("float32")
    return x, latents


GAN_CLIPPING = {"clipvalue": 0.01}
GAN_EMA = {"use_ema": True, "ema_overwrite_frequency": 3}


def run_gan(strategy=None, epochs=EPOCHS, batch_size=16, **optimizer_options):
    """Trains the tiny GAN in deterministic mode (latents given with the data).

    `optimizer_options` go to both optimizers (e.g. clipping)."""
    import tensorflow as tf

    strategy = strategy or tf.distribute.get_strategy()
    keras.utils.set_random_seed(0)
    with strategy.scope():
        gan = build_gan()
        gan.compile(
            d_optimizer=keras.optimizers.Adam(3e-3, **optimizer_options),
            g_optimizer=keras.optimizers.Adam(4e-3, **optimizer_options),
        )
    x, latents = gan_data()
    history = gan.fit(
        x, latents, batch_size=batch_size, epochs=epochs, shuffle=False, verbose=0
    ).history
    return {
        "weights": [w.tolist() for w in gan.get_weights()],
        "history": {k: [float(v) for v in vs] for k, vs in history.items()},
        "iterations": [
            int(gan.d_optimizer.iterations.numpy()),
            int(gan.g_optimizer.iterations.numpy()),
        ],
    }


def run_dataset(case, strategy=None, shard_policy="AUTO"):
    """Like `run`, but fits a batched `tf.data.Dataset` with a shard policy."""
    import tensorflow as tf

    strategy = strategy or tf.distribute.get_strategy()
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model, fit_kwargs, _ = build(case, keras_ctl.CTLModel)
    dataset = tf.data.Dataset.from_tensor_slices((fit_kwargs["x"], fit_kwargs["y"]))
    dataset = dataset.batch(fit_kwargs["batch_size"])
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = getattr(
        tf.data.experimental.AutoShardPolicy, shard_policy
    )
    history = model.fit(dataset.with_options(options), epochs=EPOCHS, verbose=0).history
    return {
        "weights": [w.tolist() for w in model.get_weights()],
        "history": {k: [float(v) for v in vs] for k, vs in history.items()},
    }


def run_predict(strategy=None):
    """Predictions of the "uneven" model on 37 examples, batch 8."""
    import tensorflow as tf

    strategy = strategy or tf.distribute.get_strategy()
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model, fit_kwargs, _ = build("uneven", keras_ctl.CTLModel)
    return {
        "predictions": model.predict(
            fit_kwargs["x"][:37], batch_size=8, verbose=0
        ).tolist()
    }


def embedding_data():
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 500, (64, 3))
    return ids, (ids.sum(axis=1) % 2).astype("int32")


def embedding_model():
    """A 500 x 8 embedding table (16 kB) and a classifier head."""
    inputs = keras.Input((3,), dtype="int32")
    embedded = keras.layers.Embedding(
        500,
        8,
        name="table",
        embeddings_initializer=keras.initializers.RandomUniform(seed=0),
    )(inputs)
    outputs = keras.layers.Dense(
        2, kernel_initializer=keras.initializers.GlorotUniform(seed=1)
    )(keras.layers.Flatten()(embedded))
    model = keras_ctl.CTLModel(inputs, outputs)
    model.compile(
        optimizer=keras.optimizers.Adam(0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model
