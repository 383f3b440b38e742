"""Rendering search results for people and other tools (CSV, markdown, YAML)."""
