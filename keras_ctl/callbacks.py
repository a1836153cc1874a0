"""`BackupAndRestore` with exact mid-epoch resume and multi-worker saving."""

from __future__ import annotations

import json
import os
import shutil
import warnings
from collections.abc import Sequence
from typing import Any

import h5py
import keras

from keras_ctl import _keras
from keras_ctl import strategies
from keras_ctl._engine import parameter_servers
from keras_ctl._engine import random_draws
from keras_ctl._engine import state as engine_state
from keras_ctl._engine.resume import MetricStates
from keras_ctl._engine.resume import ResumePlan
from keras_ctl.distribute import chief_writes
from keras_ctl.distribute import preemption

_WEIGHTS = "latest.weights.h5"
_METADATA = "training_metadata.json"
_PREVIOUS = ".bkp"  # suffix of the previous backup's files (Keras's names)
# The attribute of the weights file that holds the backup's metadata.
_METADATA_ATTRIBUTE = "keras_ctl_training_metadata"

SAVED_ON_NOTICE = preemption.SAVED_ON_NOTICE
# Seconds between a signal and the end of the step that saves on it; past
# them (a hung step, or training ended by an error) the process just ends.
NOTICE_DEADLINE_S = 25.0


class _OtherBatches(ValueError):
    """A mid-epoch backup resumed with another number of batches an epoch:
    its position would point elsewhere in the data."""


class BackupAndRestore(keras.callbacks.Callback):
    """Backs up training state and resumes exactly where a killed run stopped.

    Takes the arguments of `keras.callbacks.BackupAndRestore`, with the same
    defaults, and writes the same files, plus:

    - **Mid-epoch resume.** With `save_freq=N`, a restarted `fit()` of a
      `keras_ctl.CTLModel` skips the batches the killed run had already
      trained on, so it ends with the weights of an uninterrupted run
      (Keras restarts the epoch instead). Arrays (shuffled or not) and
      `tf.data` pipelines whose `shuffle()` draws from the global seed
      (`keras.utils.set_random_seed`) or a seed of its own resume in the
      order of the uninterrupted run: the epochs trained before the backup
      are replayed through the pipeline's shuffle before the first epoch.
      Limits: other data (a Python generator, a `PyDataset`) must come in
      the same order on restart.
    - **Resumed logs.** A mid-epoch backup holds the state of every metric
      and loss tracker (`model.metrics`), so the resumed epoch logs what
      the uninterrupted epoch logs: its progress bar, `History`,
      `CSVLogger` and `TensorBoard` rows.
    - **Every optimizer.** Each optimizer the model lists in
      `optimizers_and_variables()` (both of a `keras_ctl.GAN`) is built
      before a backup loads, so its state is restored too, with a GAN's
      latent random stream.
    - **Multi-worker.** Under `MultiWorkerMirroredStrategy` every worker
      saves (as TensorFlow requires), but only the chief writes to
      `backup_dir`; the others write into a private temporary folder and
      delete it. All workers restore from `backup_dir`, which must be
      shared storage on real clusters. A `keras.callbacks.BackupAndRestore`
      passed to `CTLModel.fit` under several workers is replaced by this
      callback, with the same arguments.
    - **Save on notice.** A preempted machine gets SIGTERM, then SIGKILL
      after a grace period. While `fit()` runs, SIGTERM (and SIGINT if
      listed in `save_on_signals`) lets the step in flight finish, writes a
      backup with the exact position in the epoch, and ends the process
      with exit code `keras_ctl.callbacks.SAVED_ON_NOTICE` (42): a restart
      resumes there and trains only the batches that were left. A second
      signal while saving changes nothing. If no step ends within
      `NOTICE_DEADLINE_S` (25 s) of the signal, the process ends as the
      signal would have ended it. Under several workers, send the signal
      to every worker (`keras-ctl launch` forwards it): the chief's backup
      is the one that counts.
    - **Crash-consistent writes.** A backup's position (epoch, batches
      done) is written inside its weights file, which is written under a
      temporary name and renamed: one rename commits weights and position
      together, so a process killed at any point leaves the last backup
      whole and never pairs new weights with an old position. The
      `training_metadata.json` beside it is a copy, for readers of Keras's
      layout. With `double_checkpoint=True`, a backup that cannot be read
      is replaced by the previous one, with a warning that names both.

    Args:
        backup_dir: Folder for the backup (shared by the workers).
        save_freq: `"epoch"`, or a number of batches between backups.
            Defaults to `"epoch"`.
        double_checkpoint: Keep the previous backup too, to fall back on.
            Defaults to `False`.
        delete_checkpoint: Delete the backup when training ends.
            Defaults to `True`.
        save_on_signals: Signals that save and stop training: names among
            `"SIGTERM"` and `"SIGINT"`, or `()` to let them act as usual.
            Caught only while `fit()` runs, in the main thread. Defaults to
            `("SIGTERM",)`.

    Example:

    ```python
    backup = keras_ctl.callbacks.BackupAndRestore("backup", save_freq=10)
    history = model.fit(x, y, batch_size=64, epochs=2, shuffle=False,
                        callbacks=[backup])  # restarted, it resumes from "backup"
    ```
    """

    def __init__(
        self,
        backup_dir: str | os.PathLike,
        save_freq: str | int = "epoch",
        double_checkpoint: bool = False,
        delete_checkpoint: bool = True,
        save_on_signals: Sequence[str] = ("SIGTERM",),
    ) -> None:
        super().__init__()
        if not backup_dir:
            raise ValueError(
                "Expected a folder for the backup. Received: "
                f"backup_dir={backup_dir!r}."
            )
        if save_freq != "epoch" and (
            isinstance(save_freq, bool)
            or not isinstance(save_freq, int)
            or save_freq < 1
        ):
            raise ValueError(
                "Expected `save_freq` to be 'epoch' or a number of batches >= 1. "
                f"Received: save_freq={save_freq!r}."
            )
        self.backup_dir = str(backup_dir)
        self.save_freq = save_freq
        self.double_checkpoint = double_checkpoint
        self.delete_checkpoint = delete_checkpoint
        self.save_on_signals = preemption.check_signal_names(save_on_signals)
        self._notice = None
        self._epoch = 0
        self._batches_done = 0  # in the current epoch, resumed batches included
        self._since_save = 0
        self._skipped = 0  # batches of the resumed epoch trained before a kill
        self._quiet = None
        self._metric_states = None  # of the resumed epoch, from the backup

    def _path(self, name, previous=False):
        return os.path.join(self.backup_dir, name + (_PREVIOUS if previous else ""))

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._restore_or_fall_back()
        if self.save_on_signals:
            self._notice = preemption.Notice(self.save_on_signals, NOTICE_DEADLINE_S)
            if not self._notice.install():
                warnings.warn(
                    "BackupAndRestore saves on a signal only when `fit()` runs "
                    f"in the main thread. Received: save_on_signals="
                    f"{self.save_on_signals!r} from another thread; the signals "
                    "act as usual.",
                    stacklevel=2,
                )
                self._notice = None

    def _restore_or_fall_back(self):
        try:
            self._restore()
        except _OtherBatches:
            raise
        except (OSError, ValueError) as error:
            previous = self._path(_WEIGHTS, previous=True)
            if not os.path.exists(previous):
                raise self._damaged(error) from error
            warnings.warn(
                f"The latest backup {self._path(_WEIGHTS)} could not be read "
                f"({type(error).__name__}: {error}). Restoring the previous "
                f"backup {previous} instead.",
                stacklevel=2,
            )
            for name in (_WEIGHTS, _METADATA):
                if os.path.exists(self._path(name, previous=True)):
                    _copy_whole(self._path(name, previous=True), self._path(name))
            try:
                self._restore()
            except (OSError, ValueError) as second:
                raise self._damaged(second, "both the latest and the previous ") from (
                    second
                )

    def _damaged(self, error, which="the "):
        """The error for a backup that cannot be read: where, what, and the
        two ways on (nothing is deleted here)."""
        return ValueError(
            f"Cannot resume from the backup in {self.backup_dir}: {which}backup "
            f"cannot be read ({type(error).__name__}: {error}). Delete that "
            "folder to start training over, or pass another `backup_dir` (the "
            "CLI: another --out) to keep it and start a new run."
        )

    def _restore(self):
        if not os.path.exists(self._path(_WEIGHTS)):
            return
        if not self.model.built:
            raise ValueError(
                "BackupAndRestore restores into a built model. Received: an "
                f"unbuilt model {self.model.name!r}. Build it first, e.g. by "
                "calling it on a batch or starting it with `keras.Input`."
            )
        metadata = self._position()
        steps = self.params.get("steps") if self.params else None
        if metadata is not None:
            self._check_same_batches(metadata, steps)
        _build_optimizers(self.model)
        self.model.load_weights(self._path(_WEIGHTS))
        if metadata is None:
            return
        self._warn_if_random_on_another_count(metadata.get("replicas"))
        self._epoch = metadata["epoch"]
        self._skipped = metadata.get("batches_done", 0)
        if steps and self._skipped >= steps:
            # Killed after the backup of an epoch's last batch, before the
            # epoch's end: the next epoch starts (an epoch of no batch
            # would have no metric results, and fail).
            self._epoch, self._skipped = self._epoch + 1, 0
        _keras.set_initial_epoch(self.model, self._epoch)
        engine = engine_state.of(self.model)
        if engine.accumulation is not None:
            engine.accumulation.load_from_optimizer(
                metadata.get("accumulated_examples", 0)
            )
        if not engine_state.kept_for(self.model):
            return  # a plain `keras.Model` neither replays nor skips
        engine.epochs_to_replay = self._epoch
        if self._skipped:
            engine.resume_plan = ResumePlan(self._skipped, steps)
            self._metric_states = MetricStates(metadata.get("metrics", {}))

    def _position(self):
        """The backup's metadata (its position), or `None` for a backup of
        Keras's own callback written without one."""
        metadata = _metadata_inside(self._path(_WEIGHTS))
        if metadata is None and os.path.exists(self._path(_METADATA)):
            # A backup of Keras's own callback: its position is beside it.
            with open(self._path(_METADATA)) as f:
                metadata = json.load(f)
        return metadata

    def _check_same_batches(self, metadata, steps):
        """A mid-epoch backup's position counts batches: in batches of
        another size it would point elsewhere in the data (checked before
        anything is loaded)."""
        done = metadata.get("batches_done", 0)
        saved = metadata.get("batches_per_epoch")
        if not done or None in (saved, steps) or saved == steps:
            return
        raise _OtherBatches(
            f"Cannot resume the backup in {self.backup_dir} exactly: it was "
            f"written {done} batches into an epoch of {saved} batches, "
            f"and this run's epoch has {steps}, so its global batch differs "
            "(for example a pipeline that batches `per_replica * "
            "num_replicas_in_sync`, or another `batch_size`). Pass the global "
            f"batch of the run that wrote it (an epoch of {saved} batches) to "
            "resume it, or delete the folder (or pass another `backup_dir`) "
            "to start over. The backup is left as it was."
        )

    def _warn_if_random_on_another_count(self, saved_replicas):
        """A model whose replicas draw their own random numbers
        (`random_draws="per_replica"`, or the default under XLA) trains
        otherwise on another replica count."""
        replicas = self.model.distribute_strategy.num_replicas_in_sync
        if saved_replicas in (None, replicas) or not _draws_random(self.model):
            return
        if random_draws.as_one_device(self.model):
            return
        warnings.warn(
            f"The backup in {self.backup_dir} was written on {saved_replicas} "
            f"replica(s); this run has {replicas}. The model draws random "
            "numbers (a seed generator: Dropout, random augmentation, a "
            "GAN's latents), and each replica draws its own, so the resumed "
            "run will differ from the run the backup's topology would have "
            f"finished. Resume on {saved_replicas} replica(s) to continue it "
            'exactly, or compile with `random_draws="as_one_device"` (each '
            "example's numbers one device's, on any replica count).",
            stacklevel=2,
        )

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._epoch = epoch
        self._batches_done = self._skipped
        if self._metric_states is not None:
            # After Keras reset them for the epoch.
            self._metric_states.restore(
                self.model.metrics, self.model.distribute_strategy
            )
        if self._skipped:
            # The resumed epoch ends `_skipped` batches early, on purpose.
            self._quiet = warnings.catch_warnings()
            self._quiet.__enter__()
            warnings.filterwarnings("ignore", message=_keras.RAN_OUT_OF_DATA)

    def on_train_batch_end(
        self, batch: int, logs: dict[str, Any] | None = None
    ) -> None:
        if self._metric_states is not None:
            self._add_to_first_batch(logs)
        done = self._skipped + batch + 1
        self._since_save += done - self._batches_done
        self._batches_done = done
        if self.save_freq != "epoch" and self._since_save >= self.save_freq:
            self._save()
        if self._notice is not None and self._notice_taken():
            self._stop_on_notice()

    def _add_to_first_batch(self, logs):
        """The saved state of metrics the first step built joins their
        state, and this batch's `logs` (seen by the callbacks after this
        one)."""
        states, self._metric_states = self._metric_states, None
        strategy = self.model.distribute_strategy
        if states.add_to_first_batch(self.model.metrics, strategy) and logs:
            results = self.model.get_metrics_result()
            logs.update({name: results[name] for name in logs if name in results})

    def _notice_taken(self):
        """One process stops at once; workers stop after the step through
        which they shared the notice (a step all of them ran)."""
        if strategies.worker_count(self.model.distribute_strategy) > 1:
            return preemption.agreed()
        return self._notice.received is not None

    def _stop_on_notice(self):
        """Saves the exact position (unless just saved) and ends the process."""
        if self._since_save:
            self._save()
        self._notice.uninstall()
        raise SystemExit(SAVED_ON_NOTICE)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if self._quiet is not None:
            self._quiet.__exit__(None, None, None)
            self._quiet = None
        self._skipped = 0
        self._epoch, self._batches_done = epoch + 1, 0
        if self.save_freq == "epoch":
            self._save()

    def _save(self):
        self._since_save = 0
        strategy = self.model.distribute_strategy
        if strategies.is_parameter_server(strategy):
            # Steps in flight on the workers would change what is saved.
            parameter_servers.coordinator(strategy).join()
        metadata = {
            "epoch": self._epoch,
            "batches_done": self._batches_done,
            "replicas": strategy.num_replicas_in_sync,
            "batches_per_epoch": self.params.get("steps") if self.params else None,
        }
        if self._batches_done:
            # Read on every worker (a collective), kept by the chief.
            metadata["metrics"] = MetricStates.read(self.model.metrics)
        accumulation = engine_state.of(self.model).accumulation
        if accumulation is not None:
            # Mid-way through accumulating: the partial sums are saved too.
            metadata["accumulated_examples"] = accumulation.save_into_optimizer()
        if not strategies.is_chief(strategy):
            # Every worker takes part in saving; only the chief's files stay.
            with chief_writes.path_for_this_worker(_WEIGHTS, strategy) as path:
                self.model.save_weights(path)
            return
        os.makedirs(self.backup_dir, exist_ok=True)
        # Weights and position in one file, written, then renamed: a crash
        # at any point leaves the last backup whole.
        temporary = self._path("saving.weights.h5")
        self.model.save_weights(temporary)
        with h5py.File(temporary, "a") as f:
            f.attrs[_METADATA_ATTRIBUTE] = json.dumps(metadata)
        if self.double_checkpoint:
            for name in (_WEIGHTS, _METADATA):
                if os.path.exists(self._path(name)):
                    _copy_whole(self._path(name), self._path(name, previous=True))
        os.replace(temporary, self._path(_WEIGHTS))
        with open(self._path(_METADATA) + ".saving", "w") as f:
            json.dump(metadata, f)
        os.replace(self._path(_METADATA) + ".saving", self._path(_METADATA))

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        if self._notice is not None:
            self._notice.uninstall()
            self._notice = None
        chief = strategies.is_chief(self.model.distribute_strategy)
        if self.delete_checkpoint and chief:
            shutil.rmtree(self.backup_dir, ignore_errors=True)


def _metadata_inside(weights_path):
    """The position saved inside a backup's weights file, or `None` for a
    file written without one (by Keras's own callback)."""
    with h5py.File(weights_path, "r") as f:
        stamped = f.attrs.get(_METADATA_ATTRIBUTE)
    return None if stamped is None else json.loads(stamped)


def _copy_whole(source, target):
    """Copies `source` to `target` through a temporary name: `target` is
    the old file or the new one, whole, at every moment."""
    temporary = target + ".saving"
    shutil.copy(source, temporary)
    os.replace(temporary, target)


def _build_optimizers(model):
    """Creates every optimizer's variables so that a backup loads into them."""
    if hasattr(model, "build_optimizers"):  # a CTLModel: each optimizer
        model.build_optimizers()
    elif model.optimizer is not None and not model.optimizer.built:
        with model.distribute_strategy.scope():
            model.optimizer.build(model.trainable_variables)


def _draws_random(model):
    """Whether `model` or a layer of it holds a `keras.random.SeedGenerator`."""
    return any(
        isinstance(value, keras.random.SeedGenerator)
        for layer in [model, *_keras.all_layers(model)]
        for value in vars(layer).values()
    )
