"""Scoring the training model against published measured runs."""
