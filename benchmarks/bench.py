"""CTLModel.fit vs keras.Model.fit vs hand-written loops, and the all-reduce cost.

The benchmark is `keras-ctl bench`; see `keras_ctl/cli/bench.py` for what is
measured and how.

Usage:
    python benchmarks/bench.py [--models mlp,cnn] [--replicas 1,2] [--rounds 5]
                               [--steps 50] [--out DIR]
"""

import sys

import keras_ctl_cli

if __name__ == "__main__":
    sys.exit(keras_ctl_cli.main(["bench", *sys.argv[1:]]))
