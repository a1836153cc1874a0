"""CTLModel.fit vs keras.Model.fit vs hand-written loops, and the all-reduce cost.

The benchmark lives in `keras_ctl.bench` so that `keras-ctl bench` runs it
too; see that module for what is measured and how.

Usage:
    python benchmarks/bench.py [--models mlp,cnn] [--replicas 1,2] [--rounds 5]
                               [--steps 50] [--out DIR]
"""

import sys

from keras_ctl import bench

if __name__ == "__main__":
    sys.exit(bench.main())
