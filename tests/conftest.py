import devices

# Logical CPU devices must exist before TensorFlow initializes its devices.
devices.configure_logical_cpus()
