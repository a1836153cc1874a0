"""`GAN`: the Keras GAN guide's model, exact under any strategy.

Each step follows the Keras guide "Customizing what happens in fit()": the
discriminator learns on generated images (label 1) and real images (label 0)
with noisy labels, `d_steps` times, then the generator learns against "all
real" labels (0). Each loss is a mean over the global batch
(`keras_ctl.global_mean`), each optimizer scales its own loss (its own
`LossScaleOptimizer` under `mixed_float16`) and applies summed gradients to
its own variables only.
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from keras_ctl import _checks
from keras_ctl import _keras
from keras_ctl import _signature
from keras_ctl import blocks
from keras_ctl._engine import random_draws
from keras_ctl._engine.padding import pad_empty_batch
from keras_ctl._replicas import written_in_shares
from keras_ctl.model import CTLModel


@keras.saving.register_keras_serializable(package="keras_ctl")
class GAN(CTLModel):
    """A generative adversarial network trained with `fit()`.

    Args:
        discriminator: A `keras.Model` mapping images to one logit per
            example, shape `(batch, 1)`.
        generator: A `keras.Model` mapping latent vectors of shape
            `(batch, latent_dim)` to images.
        latent_dim: Size of the latent vectors.
        d_steps: Discriminator updates per generator update; each uses the
            step's real images and fresh latent vectors. Defaults to `1`.
        label_noise: Amplitude of the uniform noise added to the
            discriminator's labels (the guide's "important trick").
            Defaults to `0.05`.
        seed: Seed of the latent random stream. Defaults to `None` (random).

    `fit(images)` samples latent vectors from a `keras.random.SeedGenerator`
    whose state is a model variable: a saved and restored GAN continues the
    same stream. For a reproducible run, pass the latent vectors with the
    data instead: `fit(images, latents)` with `latents` of shape
    `(n, d_steps + 1, latent_dim)` (one vector per discriminator step, then
    one for the generator step), and `label_noise=0.0`.

    `history` holds `d_loss` and `g_loss`, each the mean over steps of the
    global-batch loss. Calling the model generates: `gan(latents)`.

    Example:

    ```python
    with strategy.scope():
        d = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(),
                              keras.layers.Dense(1)])
        g = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, "sigmoid"),
                              keras.layers.Reshape((8, 8, 1))])
        gan = keras_ctl.GAN(discriminator=d, generator=g, latent_dim=32)
        gan.compile(
            d_optimizer=keras.optimizers.Adam(3e-4),
            g_optimizer=keras.optimizers.Adam(4e-4),
            loss_fn=keras.losses.BinaryCrossentropy(from_logits=True),
        )
    history = gan.fit(images, batch_size=64, epochs=2)
    print(history.history["d_loss"], history.history["g_loss"])
    ```
    """

    def __init__(
        self,
        discriminator: keras.Model,
        generator: keras.Model,
        latent_dim: int,
        *,
        d_steps: int = 1,
        label_noise: float = 0.05,
        seed: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        _check_options(latent_dim, d_steps, label_noise)
        _check_models(discriminator, generator, latent_dim)
        self.discriminator = discriminator
        self.generator = generator
        self.latent_dim = int(latent_dim)
        self.d_steps = int(d_steps)
        self.label_noise = float(label_noise)
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed, name="latent_seed")
        self.d_loss_tracker = keras.metrics.Mean(name="d_loss")
        self.g_loss_tracker = keras.metrics.Mean(name="g_loss")
        self.built = discriminator.built and generator.built

    # Two optimizers and a loss of its own, as in Keras's GAN guide: not
    # `CTLModel.compile`'s arguments.
    def compile(  # type: ignore[override]
        self,
        d_optimizer: keras.optimizers.Optimizer | str | None = None,
        g_optimizer: keras.optimizers.Optimizer | str | None = None,
        loss_fn: keras.losses.Loss | None = None,
        **kwargs: Any,
    ) -> None:
        """Configures the two optimizers and the loss.

        Args:
            d_optimizer: Optimizer of the discriminator (instance or name).
            g_optimizer: Optimizer of the generator (instance or name).
            loss_fn: Loss of both phases, computed per example. Defaults to
                `keras.losses.BinaryCrossentropy(from_logits=True)`.
            **kwargs: Other `CTLModel.compile()` options
                (`steps_per_execution`, `jit_compile`, `run_eagerly`,
                `random_draws`: by default the latent vectors and label
                noise of each example are one device's on any replica
                count; `"per_replica"` gives each replica its own).

        Returns:
            `None`.

        Raises:
            ValueError: if an optimizer is missing.

        Example:

        ```python
        with strategy.scope():
            gan.compile(d_optimizer=keras.optimizers.Adam(3e-4),
                        g_optimizer=keras.optimizers.Adam(4e-4))
        ```
        """
        for name, value in (("d_optimizer", d_optimizer), ("g_optimizer", g_optimizer)):
            if value is None:
                raise ValueError(
                    f"`GAN.compile()` needs `{name}`, the optimizer of the "
                    f"{'discriminator' if name[0] == 'd' else 'generator'}. "
                    f"Received: {name}=None. Pass e.g. "
                    f"`{name}=keras.optimizers.Adam(3e-4)`."
                )
        super().compile(optimizer=None, **kwargs)
        self.d_optimizer = self._with_loss_scale(keras.optimizers.get(d_optimizer))
        self.g_optimizer = self._with_loss_scale(keras.optimizers.get(g_optimizer))
        self.loss_fn = keras.losses.get(
            loss_fn or keras.losses.BinaryCrossentropy(from_logits=True)
        )
        self._gan_compile_config = {
            "d_optimizer": self.d_optimizer,
            "g_optimizer": self.g_optimizer,
            "loss_fn": self.loss_fn,
        }
        # Build both optimizers now, so that a backup or checkpoint (stock
        # `BackupAndRestore` included) can restore their state before fit.
        if self.built:
            self.build_optimizers()

    def _with_loss_scale(
        self, optimizer: keras.optimizers.Optimizer
    ) -> keras.optimizers.Optimizer:
        # Each optimizer keeps its own dynamic loss scale.
        if self.dtype_policy.name == "mixed_float16" and not isinstance(
            optimizer, keras.optimizers.LossScaleOptimizer
        ):
            return keras.optimizers.LossScaleOptimizer(optimizer)
        return optimizer

    @property
    def metrics(self) -> list[keras.metrics.Metric]:
        return [self.d_loss_tracker, self.g_loss_tracker]

    def call(self, latents: tf.Tensor, training: bool = False) -> tf.Tensor:
        """The generator's images for `latents`.

        Args:
            latents: Latent vectors, `(n, latent_dim)`.
            training: Whether the generator runs in training mode.

        Returns:
            The generated images.

        Example:

        ```python
        generated = gan(np.random.default_rng(0).normal(size=(16, 32)))
        print(generated.shape)  # (16, 8, 8, 1)
        ```
        """
        return self.generator(latents, training=training)

    @written_in_shares
    def train_step(self, data: Any) -> dict[str, Any]:
        data, batch_size = pad_empty_batch(data)
        real, latents, _ = keras.utils.unpack_x_y_sample_weight(data)
        self._check_shapes(real, latents)
        # The placeholder example of an empty replica weighs nothing.
        weight = tf.fill([tf.shape(real)[0]], tf.cast(batch_size > 0, self._loss_dtype))
        # Every phase divides by the same global count: one collective.
        global_weight = blocks.all_reduce_sum(tf.reduce_sum(weight))
        # Each replica adds its share and 1/R of a step: the mean over steps.
        steps_per_replica = 1.0 / blocks.num_replicas()
        for i in range(self.d_steps):
            d_loss = self.train_discriminator(
                real, self._latents(latents, i, real), weight, global_weight
            )
            _keras.add_to_mean(self.d_loss_tracker, d_loss, steps_per_replica)
        g_loss = self.train_generator(
            self._latents(latents, self.d_steps, real), weight, global_weight
        )
        _keras.add_to_mean(self.g_loss_tracker, g_loss, steps_per_replica)
        return {m.name: m.result() for m in self.metrics}

    @written_in_shares
    def train_discriminator(
        self,
        real: tf.Tensor,
        latents: tf.Tensor,
        weight: tf.Tensor | None = None,
        global_weight: tf.Tensor | None = None,
    ) -> tf.Tensor:
        """One discriminator update on real and generated images.

        Only the discriminator's variables move; the generator runs forward.

        Args:
            real: A batch of real images.
            latents: Latent vectors, shape `(batch, latent_dim)`.
            weight: Optional per-example weights of the real batch (the
                generated images get the same). Defaults to ones.
            global_weight: Optional sum of `weight` over the global batch,
                when known: saves a collective. Defaults to `None`.

        Returns:
            This replica's share of the discriminator loss.

        Example:

        ```python
        class TwoToOne(keras_ctl.GAN):  # a schedule of one's own
            def train_step(self, data):
                latents = keras.random.normal((2, tf.shape(data)[0], self.latent_dim))
                d_loss = self.train_discriminator(data, latents[0])
                d_loss = self.train_discriminator(data, latents[1])
                g_loss = self.train_generator(latents[0])
                return {"batch_d_loss": keras_ctl.ReplicaSum(d_loss),
                        "batch_g_loss": keras_ctl.ReplicaSum(g_loss)}

        with strategy.scope():
            gan = TwoToOne(discriminator=d, generator=g, latent_dim=32)
            gan.compile(d_optimizer="adam", g_optimizer="adam")
        history = gan.fit(images, batch_size=64, epochs=1)
        print(history.history["batch_d_loss"], history.history["batch_g_loss"])
        ```
        """
        if weight is None:
            weight = tf.ones([tf.shape(real)[0]], self._loss_dtype)
        fake = self.generator(latents)
        combined = tf.concat([fake, tf.cast(real, fake.dtype)], axis=0)
        labels = tf.concat([tf.ones_like(weight), tf.zeros_like(weight)], axis=0)[
            :, None
        ]
        if self.label_noise:
            noise = self._label_noise(tf.shape(weight)[0])
            labels += self.label_noise * tf.cast(noise, labels.dtype)
        weights = tf.concat([weight, weight], axis=0)
        variables = self.discriminator.trainable_weights
        with tf.GradientTape() as tape:
            predictions = self.discriminator(combined)
            loss = self._mean_loss(
                labels, predictions, weights, self.discriminator, global_weight, 2.0
            )
        blocks.minimize(loss, variables, self.d_optimizer, tape)
        return loss

    @written_in_shares
    def train_generator(
        self,
        latents: tf.Tensor,
        weight: tf.Tensor | None = None,
        global_weight: tf.Tensor | None = None,
    ) -> tf.Tensor:
        """One generator update against "all real" labels.

        Only the generator's variables move; the discriminator runs forward.

        Args:
            latents: Latent vectors, shape `(batch, latent_dim)`.
            weight: Optional per-example weights. Defaults to ones.
            global_weight: Optional sum of `weight` over the global batch,
                when known: saves a collective. Defaults to `None`.

        Returns:
            This replica's share of the generator loss.

        Example:

        ```python
        class OneToTwo(keras_ctl.GAN):  # a schedule of one's own
            def train_step(self, data):
                latents = keras.random.normal((2, tf.shape(data)[0], self.latent_dim))
                d_loss = self.train_discriminator(data, latents[0])
                g_loss = self.train_generator(latents[0])
                g_loss = self.train_generator(latents[1])
                return {"batch_d_loss": keras_ctl.ReplicaSum(d_loss),
                        "batch_g_loss": keras_ctl.ReplicaSum(g_loss)}

        with strategy.scope():
            gan = OneToTwo(discriminator=d, generator=g, latent_dim=32)
            gan.compile(d_optimizer="adam", g_optimizer="adam")
        history = gan.fit(images, batch_size=64, epochs=1)
        print(history.history["batch_d_loss"], history.history["batch_g_loss"])
        ```
        """
        if weight is None:
            weight = tf.ones([tf.shape(latents)[0]], self._loss_dtype)
        misleading_labels = tf.zeros_like(weight)[:, None]
        variables = self.generator.trainable_weights
        with tf.GradientTape() as tape:
            predictions = self.discriminator(self.generator(latents))
            loss = self._mean_loss(
                misleading_labels, predictions, weight, self.generator, global_weight
            )
        blocks.minimize(loss, variables, self.g_optimizer, tape)
        return loss

    def _mean_loss(
        self,
        labels: tf.Tensor,
        predictions: tf.Tensor,
        weights: tf.Tensor,
        model: keras.Model,
        global_weight: tf.Tensor | None = None,
        copies: float = 1.0,
    ) -> tf.Tensor:
        """This replica's share of the weighted mean loss (+ regularization).

        `global_weight` is the global sum of the real batch's weights, and
        `weights` holds `copies` of them (real and generated images).
        """
        # Layer losses first: a later all-reduce may swap them (replica threads).
        regularization = blocks.scaled_regularization_loss(model.losses)
        predictions = tf.cast(predictions, self._loss_dtype)
        if isinstance(self.loss_fn, keras.losses.Loss):
            per_example = self.loss_fn.call(labels, predictions)
        else:
            per_example = self.loss_fn(labels, predictions)
        if global_weight is not None and per_example.shape.rank == 1:
            global_weight = global_weight * copies  # one weight per example
        else:
            global_weight = None
        mean = blocks.global_mean(per_example, weights, global_weight=global_weight)
        return mean + regularization

    @property
    def _loss_dtype(self) -> str:
        """float32 (mixed precision's losses too), or float64 for a float64
        discriminator: its losses round off no more than its weights."""
        dtype = self.discriminator.compute_dtype
        return "float64" if dtype == "float64" else "float32"

    def _check_shapes(self, real: tf.Tensor, latents: tf.Tensor | None) -> None:
        """Names the argument when the data cannot fit the two models (the
        shapes are static when the step is traced)."""
        try:
            expected = tuple(self.generator.output_shape[1:])
        except (AttributeError, ValueError):
            expected = None  # a generator without a known output shape
        if expected is not None and tuple(real.shape[1:]) != expected:
            raise ValueError(
                "Expected real images shaped like the generator's output, "
                f"{expected} per example. Received: x with examples of shape "
                f"{tuple(real.shape[1:])}. Pass images of that shape to `fit()`."
            )
        wanted = (self.d_steps + 1, self.latent_dim)
        if latents is not None and tuple(latents.shape[1:]) != wanted:
            raise ValueError(
                "Expected latent vectors given as data (deterministic mode) of "
                f"shape (d_steps + 1, latent_dim) = {wanted} per example: one "
                "vector per discriminator step and one for the generator step. "
                f"Received: y with examples of shape {tuple(latents.shape[1:])}."
            )

    def _latents(
        self, latents: tf.Tensor | None, index: int, real: tf.Tensor
    ) -> tf.Tensor:
        if latents is not None:
            return latents[:, index]
        shape = tf.stack([tf.shape(real)[0], self.latent_dim])
        if random_draws.as_one_device(self):
            return keras.random.normal(shape, seed=self.seed_generator)
        return tf.random.stateless_normal(shape, seed=self._replica_seed())

    def _label_noise(self, rows: tf.Tensor) -> tf.Tensor:
        """Uniform noise for the labels of `rows` generated, then `rows`
        real examples: as one device draws it for them with
        `compile(random_draws="as_one_device")` (a draw per half, each the
        batch's rows), else this replica's own."""
        if random_draws.as_one_device(self):
            halves = [
                keras.random.uniform(
                    (rows, 1), seed=self.seed_generator, dtype="float32"
                )
                for _ in range(2)
            ]
            return tf.cast(tf.concat(halves, axis=0), "float32")
        return tf.random.stateless_uniform([2 * rows, 1], seed=self._replica_seed())

    def _replica_seed(self) -> tf.Tensor:
        """Next seed of the stream, different on every replica."""
        seed = self.seed_generator.next()
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        return tf.random.experimental.stateless_fold_in(seed, replica)

    @_signature.keras_signature(keras.Model.fit)
    def fit(self, *args: Any, **kwargs: Any) -> keras.callbacks.History:
        """`keras.Model.fit` for the GAN: `x` holds the real images, and
        optionally latent vectors, `(n, d_steps + 1, latent_dim)`, as `y`.

        At the end, each optimizer with EMA copies its averages into its own
        variables (Keras does so only for `model.optimizer`).

        Every argument is `keras.Model.fit()`'s.

        Args:
            x: The real images, or a dataset of them (and latent vectors).
            y: Optional latent vectors, `(n, d_steps + 1, latent_dim)`.

        Returns:
            A `keras.callbacks.History` with `d_loss` and `g_loss`.

        Example:

        ```python
        history = gan.fit(images, batch_size=64, epochs=2)
        print(history.history["d_loss"], history.history["g_loss"])
        ```
        """
        pairs = self.optimizers_and_variables()
        before = [int(optimizer.iterations.numpy()) for optimizer, _ in pairs]
        history = super().fit(*args, **kwargs)
        # Keras finalizes only `self.optimizer` (EMA weights); do both.
        for (optimizer, variables), start in zip(pairs, before):
            if int(optimizer.iterations.numpy()) > start:
                optimizer.finalize_variable_values(variables)
        return history

    def optimizers_and_variables(
        self,
    ) -> list[tuple[keras.optimizers.Optimizer, list[keras.Variable]]]:
        """The discriminator's optimizer and variables, then the generator's."""
        return [
            (self.d_optimizer, self.discriminator.trainable_weights),
            (self.g_optimizer, self.generator.trainable_weights),
        ]

    def make_train_function(self, force: bool = False) -> Any:
        if self.train_function is None or force:
            self.build_optimizers()  # `CTLModel` builds them only when built
        return super().make_train_function(force)

    @written_in_shares
    def test_step(self, data: Any) -> dict[str, Any]:
        raise NotImplementedError(
            "A GAN has no labels to evaluate against. Received: a call to "
            "`evaluate()`. Generate with `gan(latents)` or `gan.predict(latents)`."
        )

    def save_own_variables(self, store: Any) -> None:
        # Keras 3.15 saves no `SeedGenerator` state; the latent stream needs it.
        super().save_own_variables(store)
        store[_SEED_KEY] = self.seed_generator.state

    def load_own_variables(self, store: Any) -> None:
        # Keras checks that the store holds exactly its own variables.
        super().load_own_variables(
            {key: store[key] for key in store.keys() if key != _SEED_KEY}
        )
        if _SEED_KEY in store.keys():
            self.seed_generator.state.assign(store[_SEED_KEY])

    def get_config(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "discriminator": keras.saving.serialize_keras_object(self.discriminator),
            "generator": keras.saving.serialize_keras_object(self.generator),
            "latent_dim": self.latent_dim,
            "d_steps": self.d_steps,
            "label_noise": self.label_noise,
            "seed": self.seed,
        }

    @classmethod
    def from_config(
        cls, config: dict[str, Any], custom_objects: dict[str, Any] | None = None
    ) -> GAN:
        config = dict(config)
        for key in ("discriminator", "generator"):
            config[key] = keras.saving.deserialize_keras_object(
                config[key], custom_objects=custom_objects
            )
        return cls(**config)

    def get_compile_config(self) -> dict[str, Any]:
        config = getattr(self, "_gan_compile_config", None)
        return keras.saving.serialize_keras_object(config) if config else {}

    def compile_from_config(self, config: dict[str, Any]) -> None:
        # `compile()` builds both optimizers, so their saved state loads.
        self.compile(**keras.saving.deserialize_keras_object(config))


_SEED_KEY = "latent_seed_state"


def _check_options(latent_dim: int, d_steps: int, label_noise: float) -> None:
    _checks.positive_int("latent_dim", latent_dim)
    _checks.positive_int("d_steps", d_steps)
    if not 0.0 <= float(label_noise) <= 1.0:
        raise ValueError(
            "Expected `label_noise` between 0 and 1. "
            f"Received: label_noise={label_noise!r}"
        )


def _check_models(
    discriminator: keras.Model, generator: keras.Model, latent_dim: int
) -> None:
    for name, model in (("discriminator", discriminator), ("generator", generator)):
        if not isinstance(model, keras.Model):
            raise TypeError(
                f"Expected `{name}` to be a `keras.Model`. "
                f"Received: {name}={model!r} of type {type(model).__name__}."
            )
    generator_input = _static_shape(generator, "inputs")
    if generator_input is not None and generator_input[-1] != latent_dim:
        raise ValueError(
            "Expected `latent_dim` to match the generator's input size "
            f"{generator_input[-1]} (input shape {generator_input}). Received: "
            f"latent_dim={latent_dim}. Pass latent_dim={generator_input[-1]}."
        )
    output = _static_shape(discriminator, "outputs")
    if output is not None and tuple(output[1:]) != (1,):
        raise ValueError(
            "Expected the discriminator to output one logit per example, "
            f"shape (batch, 1). Received: discriminator output shape {output}. "
            "End it with `keras.layers.Dense(1)`."
        )


def _static_shape(model: keras.Model, attribute: str) -> tuple[int | None, ...] | None:
    try:
        tensors = getattr(model, attribute)
    except (AttributeError, ValueError):
        return None
    if not tensors or len(tensors) != 1:
        return None
    return tuple(tensors[0].shape)
