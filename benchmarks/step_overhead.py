"""Steps per second of CTLModel.fit, keras.Model.fit and a hand-written loop.

The benchmark lives in `keras_ctl.bench` so that `keras-ctl bench` runs it
too; see that module for what is measured and how.

Usage:
    python benchmarks/step_overhead.py [--rounds 5] [--steps 100] [--out FILE]
"""

import sys

from keras_ctl import bench

if __name__ == "__main__":
    sys.exit(bench.main())
