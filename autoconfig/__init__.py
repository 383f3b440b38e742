"""autoconfig: predict, then prove, the fastest way to train an LLM on a cluster."""

__version__ = "0.1.0"
