"""`BackupAndRestore` with exact mid-epoch resume and multi-worker saving."""

import json
import os
import shutil
import warnings

import keras

from keras_ctl import strategies


class BackupAndRestore(keras.callbacks.BackupAndRestore):
    """Backs up training state and resumes exactly where a killed run stopped.

    A drop-in for `keras.callbacks.BackupAndRestore` with three additions:

    - **Mid-epoch resume.** With `save_freq=N`, a restarted `fit()` of a
      `keras_ctl.CTLModel` skips the batches the killed run had already
      trained on, so it ends with the weights of an uninterrupted run
      (Keras restarts the epoch instead). Limits: the data must come in the
      same order on restart (`shuffle=False`, or a `tf.data` pipeline with a
      fixed shuffle seed); metrics of the resumed epoch average only the
      batches trained after the restart.
    - **Multi-worker.** Under `MultiWorkerMirroredStrategy` every worker
      saves (as TensorFlow requires), but only the chief writes to
      `backup_dir`; the others write to a temporary sibling folder
      (`<backup_dir>_workertemp_<i>`) and delete it.
      All workers restore from `backup_dir`, which must be shared storage
      on real clusters.
    - **Corrupted backups.** If the latest backup cannot be read, the
      previous one is restored with a warning that names both.

    The backup holds everything `model.save_weights()` saves: the weights,
    every optimizer's state (both of a `keras_ctl.GAN`) and a GAN's latent
    random stream.

    Args:
        backup_dir: Folder for the backup (shared by the workers).
        save_freq: `"epoch"`, or a number of batches between backups.
            Defaults to `"epoch"`.
        double_checkpoint: Keep the previous backup too, to fall back on.
            Defaults to `True`.
        delete_checkpoint: Delete the backup when training ends.
            Defaults to `True`.

    Example:

    ```python
    model.fit(x, y, epochs=10, shuffle=False,
              callbacks=[keras_ctl.callbacks.BackupAndRestore("backup", save_freq=50)])
    ```
    """

    def __init__(
        self,
        backup_dir,
        save_freq="epoch",
        double_checkpoint=True,
        delete_checkpoint=True,
    ):
        if not backup_dir:
            raise ValueError(
                "Expected a folder for the backup. Received: "
                f"backup_dir={backup_dir!r}."
            )
        super().__init__(
            backup_dir,
            save_freq=save_freq,
            double_checkpoint=double_checkpoint,
            delete_checkpoint=delete_checkpoint,
        )

    def on_train_begin(self, logs=None):
        try:
            self._load_model()
        except (OSError, ValueError) as error:
            if not os.path.exists(self._prev_weights_path):
                raise
            warnings.warn(
                f"The latest backup {self._weights_path} could not be read "
                f"({type(error).__name__}: {error}). Restoring the previous "
                f"backup {self._prev_weights_path} instead.",
                stacklevel=2,
            )
            shutil.copy(self._prev_weights_path, self._weights_path)
            if os.path.exists(self._prev_training_metadata_path):
                shutil.copy(
                    self._prev_training_metadata_path, self._training_metadata_path
                )
            self._load_model()

    def _load_model(self):
        _build_optimizers(self.model)
        super()._load_model()
        self._skipped = 0
        if os.path.exists(self._training_metadata_path):
            with open(self._training_metadata_path) as f:
                self._skipped = json.load(f).get("batches_done", 0)
        if self._skipped:
            # The step function skips what the killed run already trained on.
            steps = self.params.get("steps") if self.params else None
            self.model._ctl_resume = {
                "skip": self._skipped,
                "left": None if steps is None else steps - self._skipped,
            }

    def _save_model(self):
        if not strategies.is_chief(self.model.distribute_strategy):
            # Every worker takes part in saving; only the chief's files stay.
            # A sibling folder: the chief may delete `backup_dir` meanwhile.
            folder = os.path.normpath(self.backup_dir)
            temporary = f"{folder}_workertemp_{_task_index()}"
            os.makedirs(temporary, exist_ok=True)
            try:
                self.model.save_weights(os.path.join(temporary, "latest.weights.h5"))
            finally:
                shutil.rmtree(temporary, ignore_errors=True)
            return
        # Other workers may create the folder at the same moment.
        os.makedirs(self.backup_dir, exist_ok=True)
        super()._save_model()
        with open(self._training_metadata_path) as f:
            metadata = json.load(f)
        metadata["batches_done"] = self._batches_done
        with open(self._training_metadata_path, "w") as f:
            json.dump(metadata, f)

    def on_epoch_begin(self, epoch, logs=None):
        self._batches_done = 0
        if getattr(self, "_skipped", 0):
            # The resumed epoch runs out of data `_skipped` batches early.
            warnings.filterwarnings("ignore", message=_RAN_OUT_OF_DATA)

    def on_epoch_end(self, epoch, logs=None):
        if getattr(self, "_skipped", 0):
            self._skipped = 0
            _remove_filter(_RAN_OUT_OF_DATA)
        self._batches_done = 0
        super().on_epoch_end(epoch, logs)

    def on_train_batch_end(self, batch, logs=None):
        self._batches_done = self._skipped + batch + 1
        super().on_train_batch_end(batch, logs)

    def on_train_end(self, logs=None):
        chief = strategies.is_chief(self.model.distribute_strategy)
        if self.delete_checkpoint and chief:
            shutil.rmtree(self.backup_dir, ignore_errors=True)


_RAN_OUT_OF_DATA = "Your input ran out of data"


def _remove_filter(message):
    warnings.filters[:] = [
        f
        for f in warnings.filters
        if not (f[1] is not None and f[1].pattern == message)
    ]


def _build_optimizers(model):
    """Creates every optimizer's variables so that a backup can load into them."""
    pairs = [(model.optimizer, model.trainable_variables)]
    if hasattr(model, "_optimizers_and_models"):  # a keras_ctl.GAN
        pairs = [
            (opt, m.trainable_variables) for opt, m in model._optimizers_and_models()
        ]
    for optimizer, variables in pairs:
        if optimizer is not None and not optimizer.built:
            with model.distribute_strategy.scope():
                optimizer.build(variables)


def _task_index():
    config = json.loads(os.environ.get("TF_CONFIG", "{}"))
    return config.get("task", {}).get("index", 0)
