"""What depends on how training is distributed, in one package: the other
modules ask it instead of testing strategy classes.

- `topology`: what a strategy is (replicas, workers, the chief, where the
  variables live);
- `preemption`: a signal as a notice that every worker stops on at the
  same step;
- `chief_writes`: under several workers, the user's files written by the
  chief only;
- `slurm`: the cluster of a Slurm job step, from the variables `srun` sets.

The local cluster launcher is `keras_ctl.launch`; the parameter-server loop
is the engine's (`keras_ctl._engine.parameter_servers`).
"""
