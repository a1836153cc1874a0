"""`keras-ctl tune {classifier,gan}`: a keras-tuner random search."""

import pathlib
from typing import Any

from keras_ctl.cli import common


def run(args):
    strategy = common.make_strategy("auto", args.replicas)  # first
    import keras
    import keras_tuner
    import numpy as np

    from keras_ctl import tuning
    from keras_ctl.demos import models
    from keras_ctl.demos.tuning import GANHyperModel

    (x_train, y_train), (x_test, y_test) = common.load_data(args.dataset)
    shape = x_train.shape[1:]

    class Classifier(tuning.CTLHyperModel):
        def build(self, hp):
            model = models.tutorial_cnn(shape)
            rate = hp.Float("learning_rate", 1e-4, 1e-2, sampling="log")
            model.compile(
                optimizer=keras.optimizers.Adam(rate),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                metrics=["accuracy"],
            )
            return model

    out = pathlib.Path(args.out)
    if args.task == "gan":
        hypermodel = GANHyperModel(shape, batch_sizes_per_replica=[16, 32])
        objective = "g_loss"
        fit_args: tuple[list[Any], dict[str, Any]] = (
            [np.concatenate([x_train, x_test])],
            {},
        )
    else:
        hypermodel, objective = (
            Classifier(batch_sizes_per_replica=[16, 32]),
            "val_accuracy",
        )
        train, validation = common.validation_split(x_train, y_train)
        fit_args = (list(train), {"validation_data": validation})

    class RandomSearch(keras_tuner.RandomSearch):
        def on_trial_end(self, trial):
            super().on_trial_end(trial)
            best = self.oracle.get_best_trials(1)[0]
            print(
                f"trial {int(trial.trial_id) + 1} of {args.trials}: "
                f"{objective}={trial.score:.4f} {trial.hyperparameters.values}; "
                f"best so far: trial {int(best.trial_id) + 1}, "
                f"{objective}={best.score:.4f}",
                flush=True,
            )

    print(f"Searching {args.trials} trials of {args.task}, {args.epochs} epoch(s) each")
    tuner = RandomSearch(
        hypermodel,
        objective=tuning.objective(objective),
        max_trials=args.trials,
        distribution_strategy=strategy,
        directory=str(out),
        project_name=args.task,
        seed=0,
    )
    tuner.search(*fit_args[0], epochs=args.epochs, verbose=0, **fit_args[1])
    best = tuner.oracle.get_best_trials(1)[0]
    print(
        f"best trial {int(best.trial_id) + 1}: {objective}={best.score:.4f} "
        f"{best.hyperparameters.values}"
    )
    common.write_json(
        out / "best_trial.json",
        {
            "trial_id": best.trial_id,
            objective: best.score,
            "hyperparameters": best.hyperparameters.values,
        },
    )
    return 0
