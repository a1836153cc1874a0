import strategies

# Logical CPU devices must exist before TensorFlow initializes its devices.
strategies.configure_logical_cpus()
