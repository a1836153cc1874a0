"""Search a GAN's two learning rates and discriminator steps with keras-tuner.

Runs `keras_tuner.RandomSearch` over `keras_ctl.GAN` on the bundled digits,
under `MirroredStrategy`, minimising the generator loss `g_loss`, with the
batch size tuned per replica. Prints every trial and the best one; writes
the tuner's files under `--out`.

Usage:
    python examples/tune_gan.py [--replicas 2] [--trials 4] [--epochs 2] [--out DIR]
"""

import os

from _args import parse_args


def main():
    args = parse_args(
        __doc__,
        replicas=2,
        epochs=2,
        out="runs/tune_gan",
        extra=[("--trials", 4, "number of trials")],
    )
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras_tuner
    import numpy as np

    import keras_ctl
    from keras_ctl import datasets
    from keras_ctl import strategies
    from keras_ctl.demos.tuning import GANHyperModel

    strategy = strategies.local_mirrored_strategy(args.replicas)

    (x_train, _), (x_test, _) = datasets.load("digits")
    images = np.concatenate([x_train, x_test])
    tuner = keras_tuner.RandomSearch(
        GANHyperModel((8, 8, 1), batch_sizes_per_replica=[16, 32]),
        objective=keras_ctl.tuning.objective("g_loss"),
        max_trials=args.trials,
        distribution_strategy=strategy,
        directory=args.out,
        project_name="gan",
        overwrite=True,
        seed=0,
    )
    tuner.search(images, epochs=args.epochs, verbose=0)
    for trial in sorted(tuner.oracle.trials.values(), key=lambda t: int(t.trial_id)):
        values = trial.hyperparameters.values
        print(f"trial {trial.trial_id}: g_loss={trial.score:.4f} {values}")
    best = tuner.oracle.get_best_trials(1)[0]
    values = best.hyperparameters.values
    print(f"best trial {best.trial_id}: g_loss={best.score:.4f} {values}")


if __name__ == "__main__":
    main()
