"""`python -m keras_ctl.launch`: the local cluster launcher, `keras_ctl_launch`
under the package's name (see there)."""

import sys

from keras_ctl_launch import SAVED_ON_NOTICE  # noqa: F401
from keras_ctl_launch import free_ports  # noqa: F401
from keras_ctl_launch import launch  # noqa: F401
from keras_ctl_launch import launch_parameter_servers  # noqa: F401
from keras_ctl_launch import main
from keras_ctl_launch import serve  # noqa: F401
from keras_ctl_launch import tf_config  # noqa: F401

if __name__ == "__main__":
    sys.exit(main())
