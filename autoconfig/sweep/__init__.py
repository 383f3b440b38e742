"""Sweeps: many settings (model x GPU x nodes x ...) searched, and optionally
profiled, in one run directory; and the comparison of two such runs.

``spec`` reads the sweep file, ``run`` executes it setting by setting (each
result written atomically as it finishes, so an interrupted sweep resumes),
``summary`` renders the run's CSV/markdown/JSON, ``compare`` diffs two runs.
"""
