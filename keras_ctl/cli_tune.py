"""`keras-ctl tune {classifier,gan}`: a keras-tuner random search."""

import pathlib

from keras_ctl import cli


def run(args):
    strategy = cli.make_strategy("mirrored", args.replicas)  # before TF starts
    import keras
    import keras_tuner
    import numpy as np

    import keras_ctl
    from keras_ctl import tuning
    from keras_ctl import zoo

    (x_train, y_train), (x_test, y_test) = cli.load_data(args.dataset)
    shape = x_train.shape[1:]

    class Classifier(keras_ctl.CTLHyperModel):
        def build(self, hp):
            model = zoo.tutorial_cnn(shape)
            rate = hp.Float("learning_rate", 1e-4, 1e-2, sampling="log")
            model.compile(
                optimizer=keras.optimizers.Adam(rate),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                metrics=["accuracy"],
            )
            return model

    out = pathlib.Path(args.out)
    if args.task == "gan":
        hypermodel = tuning.GANHyperModel(shape, batch_sizes_per_replica=[16, 32])
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
        objective=keras_ctl.tuning.objective(objective),
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
    cli.write_json(
        out / "best_trial.json",
        {
            "trial_id": best.trial_id,
            objective: best.score,
            "hyperparameters": best.hyperparameters.values,
        },
    )
    return 0
