"""`keras-ctl tune {classifier,gan}`: a keras-tuner random search."""

import pathlib

from keras_ctl.cli import common


def run(args):
    strategy = common.make_strategy("mirrored", args.replicas)  # first
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
        fit_args = ([np.concatenate([x_train, x_test])], {})
    else:
        hypermodel, objective = (
            Classifier(batch_sizes_per_replica=[16, 32]),
            "val_accuracy",
        )
        fit_args = ([x_train, y_train], {"validation_data": (x_test, y_test)})
    tuner = keras_tuner.RandomSearch(
        hypermodel,
        objective=tuning.objective(objective),
        max_trials=args.trials,
        distribution_strategy=strategy,
        directory=str(out),
        project_name=args.task,
        seed=0,
    )
    tuner.search(*fit_args[0], epochs=args.epochs, verbose=0, **fit_args[1])
    trials = sorted(tuner.oracle.trials.values(), key=lambda t: int(t.trial_id))
    for trial in trials:
        print(
            f"trial {trial.trial_id}: {objective}={trial.score:.4f} "
            f"{trial.hyperparameters.values}"
        )
    best = tuner.oracle.get_best_trials(1)[0]
    print(
        f"best trial {best.trial_id}: {objective}={best.score:.4f} "
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
