"""Real profiling runs: the spec of a run, the megatron-core worker, launching and results.

Nothing here imports torch or megatron-core at import time; only
``autoconfig.profiling.worker`` does, lazily inside its functions.
"""
