"""Shared types and catalogs: model shapes, hardware, plans, collective costs.

Every stage (base config, training, inference, validation, profiling) builds on
these; nothing here imports a stage.
"""
