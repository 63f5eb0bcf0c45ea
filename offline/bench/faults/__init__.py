"""Faults under load: Redis killed, broken bundles pushed, soaks, training killed, retraining rolled out."""
