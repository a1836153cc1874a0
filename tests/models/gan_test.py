"""GAN: two optimizers, exact losses, replayable randomness, save/load."""

import cases
import devices
import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_ctl

ATOL = 1e-5


def compiled_gan(
    strategy=None, d_optimizer=None, g_optimizer=None, random_draws=None, **gan_kwargs
):
    """`d_optimizer` / `g_optimizer`: factories, called in the strategy scope."""
    strategy = strategy or tf.distribute.get_strategy()
    keras.utils.set_random_seed(0)
    with strategy.scope():
        gan = cases.build_gan(**gan_kwargs)
        gan.compile(
            d_optimizer=d_optimizer() if d_optimizer else keras.optimizers.Adam(3e-3),
            g_optimizer=g_optimizer() if g_optimizer else keras.optimizers.Adam(4e-3),
            random_draws=random_draws,
        )
    return gan


def numpy_weights(model):
    return [w.copy() for w in model.get_weights()]


def assert_all_close(got, expected, atol=ATOL):
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(g, e, atol=atol, rtol=0)


def test_optimizer_iterations_count_their_own_updates():
    result = cases.run_gan()
    steps = 2 * 7  # 2 epochs of ceil(101 / 16) steps
    assert result["iterations"] == [cases.GAN_D_STEPS * steps, steps]
    assert set(result["history"]) == {"d_loss", "g_loss"}
    assert all(np.isfinite(result["history"]["d_loss"] + result["history"]["g_loss"]))


def test_each_phase_moves_only_its_own_model():
    gan = compiled_gan()
    x, latents = cases.gan_data(16)
    d_before, g_before = numpy_weights(gan.discriminator), numpy_weights(gan.generator)
    gan.train_discriminator(x, latents[:, 0])
    assert_all_close(numpy_weights(gan.generator), g_before, atol=0)
    moved = [
        np.abs(a - b).max() for a, b in zip(numpy_weights(gan.discriminator), d_before)
    ]
    assert min(moved) > 1e-6
    d_after = numpy_weights(gan.discriminator)
    gan.train_generator(latents[:, 1])
    assert_all_close(numpy_weights(gan.discriminator), d_after, atol=0)
    moved = [
        np.abs(a - b).max() for a, b in zip(numpy_weights(gan.generator), g_before)
    ]
    assert min(moved) > 1e-6
    assert int(gan.d_optimizer.iterations.numpy()) == 1
    assert int(gan.g_optimizer.iterations.numpy()) == 1


def test_discriminator_loss_matches_the_guide_formula():
    """Share on one device = BinaryCrossentropy over fake (1) and real (0)."""
    gan = compiled_gan()
    x, latents = cases.gan_data(12)
    fake = gan.generator(latents[:, 0])
    logits = gan.discriminator(tf.concat([fake, x], axis=0))
    labels = tf.concat([tf.ones((12, 1)), tf.zeros((12, 1))], axis=0)
    expected = keras.losses.BinaryCrossentropy(from_logits=True)(labels, logits)
    loss = gan.train_discriminator(x, latents[:, 0])
    assert float(loss) == pytest.approx(float(expected), abs=1e-6)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_gives_each_optimizer_its_own_loss_scale(policy):
    keras.config.set_dtype_policy(policy)
    try:
        gan = compiled_gan(
            devices.get("mirrored"),
            # The discriminator's loss scale starts so high that float16
            # overflows: only its own scale may shrink.
            d_optimizer=(
                lambda: keras.optimizers.LossScaleOptimizer(
                    keras.optimizers.Adam(3e-3), initial_scale=2.0**40
                )
            )
            if policy == "mixed_float16"
            else None,
        )
        x, latents = cases.gan_data()
        history = gan.fit(x, latents, batch_size=16, epochs=1, verbose=0).history
    finally:
        keras.config.set_dtype_policy("float32")
    assert all(np.isfinite(history["d_loss"] + history["g_loss"]))
    if policy == "mixed_float16":
        assert isinstance(gan.d_optimizer, keras.optimizers.LossScaleOptimizer)
        assert isinstance(gan.g_optimizer, keras.optimizers.LossScaleOptimizer)
        assert gan.d_optimizer is not gan.g_optimizer
        d_scale = float(gan.d_optimizer.dynamic_scale.numpy())
        g_scale = float(gan.g_optimizer.dynamic_scale.numpy())
        assert d_scale < 2.0**40 and g_scale == 2.0**15
    else:
        assert not isinstance(gan.d_optimizer, keras.optimizers.LossScaleOptimizer)
    assert gan.generator(latents[:2, 0]).dtype == (
        "float16" if policy == "mixed_float16" else "bfloat16"
    )


def test_ema_is_finalised_for_both_optimizers():
    gan = compiled_gan(
        d_optimizer=lambda: keras.optimizers.Adam(3e-3, use_ema=True, ema_momentum=0.9),
        g_optimizer=lambda: keras.optimizers.Adam(4e-3, use_ema=True, ema_momentum=0.9),
    )
    x, latents = cases.gan_data()
    gan.fit(x, latents, batch_size=16, epochs=1, verbose=0)
    for optimizer, model in (
        (gan.d_optimizer, gan.discriminator),
        (gan.g_optimizer, gan.generator),
    ):
        for variable in model.trainable_weights:
            index = optimizer._get_variable_index(variable)
            average = optimizer._model_variables_moving_average[index]
            np.testing.assert_allclose(variable.numpy(), average.numpy(), atol=0)


def test_save_and_load_restores_models_optimizers_and_random_stream(tmp_path):
    gan = compiled_gan(label_noise=0.05)
    x, _ = cases.gan_data()
    # Random mode: latents and label noise come from the seed generator.
    gan.fit(x, batch_size=16, epochs=1, shuffle=False, verbose=0)
    path = tmp_path / "gan.keras"
    gan.save(path)
    loaded = keras.models.load_model(path, safe_mode=True)
    assert isinstance(loaded, keras_ctl.GAN) and loaded.d_steps == cases.GAN_D_STEPS
    latents = (
        np.random.default_rng(3).normal(size=(5, cases.GAN_LATENT)).astype("float32")
    )
    np.testing.assert_array_equal(loaded.generator(latents), gan.generator(latents))
    np.testing.assert_allclose(
        loaded(latents), gan.predict(latents, verbose=0), atol=1e-6
    )
    for original, restored in (
        (gan.d_optimizer, loaded.d_optimizer),
        (gan.g_optimizer, loaded.g_optimizer),
    ):
        assert_all_close(
            [v.numpy() for v in restored.variables],
            [v.numpy() for v in original.variables],
            atol=0,
        )
    np.testing.assert_array_equal(loaded.seed_generator.state, gan.seed_generator.state)
    # Both continue with the same random stream and optimizer state.
    gan.fit(x, batch_size=16, epochs=1, shuffle=False, verbose=0)
    loaded.fit(x, batch_size=16, epochs=1, shuffle=False, verbose=0)
    assert_all_close(numpy_weights(loaded), numpy_weights(gan), atol=1e-6)


def trained_weights(gan, epochs=1):
    x, latents = cases.gan_data()
    gan.fit(x, latents, batch_size=16, epochs=epochs, shuffle=False, verbose=0)
    return numpy_weights(gan)


def test_two_replicas_train_as_one_device_with_synchronized_norm():
    """The discriminator sees real and generated images stacked in one
    batch: every row enters the loss and the synchronized moments."""
    expected = trained_weights(compiled_gan(synchronized_norm=True))
    found = trained_weights(
        compiled_gan(devices.get("mirrored"), synchronized_norm=True)
    )
    assert_all_close(found, expected)


def test_latent_stream_differs_across_replicas_drawing_per_replica():
    gan = compiled_gan(devices.get("mirrored"), random_draws="per_replica")
    strategy = devices.get("mirrored")

    @tf.function
    def sample():
        return strategy.run(lambda: gan._latents(None, 0, tf.zeros((3, 8, 8, 1))))

    first, second = strategy.experimental_local_results(sample())
    assert first.shape == (3, cases.GAN_LATENT)
    assert np.abs(first.numpy() - second.numpy()).max() > 0.1


def test_compile_without_an_optimizer_names_it():
    gan = cases.build_gan()
    with pytest.raises(
        ValueError, match=r"needs `g_optimizer`.*Received: g_optimizer=None"
    ):
        gan.compile(d_optimizer="adam")


def test_latent_dim_must_match_the_generator():
    gan = cases.build_gan()
    with pytest.raises(ValueError, match=r"Received: latent_dim=5\. Pass latent_dim=8"):
        keras_ctl.GAN(
            discriminator=gan.discriminator, generator=gan.generator, latent_dim=5
        )


def test_discriminator_must_output_one_logit_per_example():
    gan = cases.build_gan()
    two_logits = keras.Sequential(
        [keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(2)]
    )
    with pytest.raises(ValueError, match=r"one logit per example.*\(None, 2\)"):
        keras_ctl.GAN(discriminator=two_logits, generator=gan.generator, latent_dim=8)


def test_d_steps_must_be_positive():
    gan = cases.build_gan()
    with pytest.raises(ValueError, match=r"Received: d_steps=0"):
        keras_ctl.GAN(
            discriminator=gan.discriminator,
            generator=gan.generator,
            latent_dim=8,
            d_steps=0,
        )


@pytest.mark.parametrize(
    "data, message",
    [
        (
            {"x": np.zeros((8, 7, 7, 1), "float32")},
            r"Received: x with examples of shape \(7, 7, 1\)",
        ),
        (
            {
                "x": np.zeros((8, 8, 8, 1), "float32"),
                "y": np.zeros((8, cases.GAN_LATENT), "float32"),
            },
            r"= \(3, 8\) per example.*Received: y with examples of shape \(8,\)",
        ),
    ],
)
def test_data_that_cannot_fit_the_models_names_the_argument(data, message):
    gan = compiled_gan(devices.get("mirrored"))
    with pytest.raises(ValueError, match=message):
        gan.fit(**data, batch_size=4, epochs=1, verbose=0)


def test_sub_models_built_outside_the_strategy_scope_are_named():
    generator = keras.Sequential([keras.Input((2,)), keras.layers.Dense(3)])
    discriminator = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    # TensorFlow's error printed the whole weight matrix; `compile()` builds
    # the optimizers, so it tells at once.
    with pytest.raises(
        ValueError,
        match=r"model's weights were created outside `strategy.scope\(\)`.*"
        r"every model inside it",
    ):
        with devices.get("mirrored").scope():
            gan = keras_ctl.GAN(
                discriminator=discriminator, generator=generator, latent_dim=2
            )
            gan.compile(d_optimizer="adam", g_optimizer="adam")
