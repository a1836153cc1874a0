"""One process of a distributed keras-tuner search (chief or worker).

Usage: KERASTUNER_TUNER_ID=chief|tunerN python tune_child.py DIRECTORY
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import keras_tuner  # noqa: E402
from tuning_cases import Classifier  # noqa: E402
from tuning_cases import classifier_data  # noqa: E402

import keras_ctl  # noqa: E402


class CountingTuner(keras_tuner.RandomSearch):
    trials_run = 0

    def run_trial(self, trial, *args, **kwargs):
        CountingTuner.trials_run += 1
        return super().run_trial(trial, *args, **kwargs)


(x, y), (x_val, y_val) = classifier_data()
tuner = CountingTuner(
    Classifier(),
    objective="val_accuracy",
    max_trials=4,
    directory=sys.argv[1],
    project_name="distributed",
    seed=5,
)
tuner.search(x, y, epochs=1, batch_size=16, validation_data=(x_val, y_val), verbose=0)
if os.environ["KERASTUNER_TUNER_ID"] != "chief":
    print(f"TRIALS RUN:{CountingTuner.trials_run}", flush=True)
    best = tuner.get_best_models(1)[0] if CountingTuner.trials_run else None
    assert best is None or isinstance(best, keras_ctl.CTLModel)
del keras
