"""Train a DCGAN on the bundled 8x8 digits with keras_ctl.GAN.

The Keras guide's GAN step: discriminator on real + generated
images with noisy labels, then generator against "all real" labels, two Adam
optimizers, under `MirroredStrategy`. After every epoch it writes a 4x4 grid
of samples from fixed latent vectors to `--out/samples_epoch_NNN.png`, and at
the end `history.json` (`d_loss`, `g_loss`) and `gan.keras`.

Usage:
    python examples/dcgan_digits.py [--replicas 2] [--epochs 30] [--out DIR]
"""

import json
import os
import pathlib

from _args import parse_args


def build_models(latent_dim):
    from keras_ctl.demos import models as zoo

    return zoo.gan_models((8, 8, 1), latent_dim)


def main():
    args = parse_args(
        __doc__,
        replicas=2,
        epochs=30,
        out="runs/dcgan_digits",
        extra=[
            ("--batch-size", 32, "per replica"),
            ("--latent-dim", 32, "size of the latent vectors"),
            ("--d-steps", 1, "discriminator steps per generator step"),
        ],
    )
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import numpy as np

    import keras_ctl
    from keras_ctl import datasets
    from keras_ctl import strategies
    from keras_ctl.demos import plots

    strategy = strategies.local_mirrored_strategy(args.replicas)
    (x_train, _), (x_test, _) = datasets.load("digits")
    images = np.concatenate([x_train, x_test])
    keras.utils.set_random_seed(0)
    with strategy.scope():
        discriminator, generator = build_models(args.latent_dim)
        gan = keras_ctl.GAN(
            discriminator=discriminator,
            generator=generator,
            latent_dim=args.latent_dim,
            d_steps=args.d_steps,
            seed=0,
        )
        gan.compile(
            d_optimizer=keras.optimizers.Adam(1e-3, beta_1=0.5),
            g_optimizer=keras.optimizers.Adam(1e-3, beta_1=0.5),
            loss_fn=keras.losses.BinaryCrossentropy(from_logits=True),
        )
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    fixed = (
        np.random.default_rng(0).normal(size=(16, args.latent_dim)).astype("float32")
    )
    history = gan.fit(
        images,
        batch_size=args.batch_size * strategy.num_replicas_in_sync,
        epochs=args.epochs,
        callbacks=[plots.image_grid_callback(out, fixed)],
        verbose=2,
    )
    (out / "history.json").write_text(json.dumps(history.history, indent=2))
    gan.save(out / "gan.keras")
    print(f"Wrote {args.epochs} sample grids, history.json and gan.keras to {out}")


if __name__ == "__main__":
    main()
