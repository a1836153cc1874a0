"""A keras-tuner hypermodel of the demo GAN (needs keras-tuner)."""

import keras

from keras_ctl.demos import models
from keras_ctl.gan import GAN
from keras_ctl.tuning import CTLHyperModel


class GANHyperModel(CTLHyperModel):
    """Searches the `models.gan_models` DCGAN: two learning rates and `d_steps`.

    Args:
        image_shape: Shape of one image, e.g. `(8, 8, 1)`.
        latent_dim: Size of the latent vectors. Defaults to `32`.
        **kwargs: `CTLHyperModel` options (`batch_sizes_per_replica`).
    """

    def __init__(self, image_shape, latent_dim=32, **kwargs):
        super().__init__(**kwargs)
        self.image_shape = tuple(image_shape)
        self.latent_dim = latent_dim

    def build(self, hp):
        discriminator, generator = models.gan_models(self.image_shape, self.latent_dim)
        gan = GAN(
            discriminator=discriminator,
            generator=generator,
            latent_dim=self.latent_dim,
            d_steps=hp.Int("d_steps", 1, 2),
            seed=0,
        )
        learning_rates = {
            name: hp.Float(f"{name}_learning_rate", 1e-4, 3e-3, sampling="log")
            for name in ("d", "g")
        }
        gan.compile(
            d_optimizer=keras.optimizers.Adam(learning_rates["d"], beta_1=0.5),
            g_optimizer=keras.optimizers.Adam(learning_rates["g"], beta_1=0.5),
        )
        return gan
