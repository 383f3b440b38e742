"""The base-config stage: from a compute/time budget or a named model to the
model shape and its training hyper-parameters (each value with its source)."""
