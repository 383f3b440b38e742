"""Inference prediction: serving plans, their memory and latency (sibling of training)."""
