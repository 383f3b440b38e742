"""Figures for the report PNGs: matplotlib's ``Figure`` on an Agg canvas.

Never ``pyplot``: its backend machinery costs half a second a command and
keeps every figure in a global registry until closed. matplotlib is imported
on the first figure, so a command that draws none never loads it.
"""

from pathlib import Path

from autoconfig.atomic import make_parent, write_target


def subplots(*args, **kwargs):
    """``(figure, axes)`` as ``pyplot.subplots`` gives them, drawn by Agg."""
    from matplotlib.figure import Figure
    fig = Figure(figsize=kwargs.pop("figsize", None))
    return fig, fig.subplots(*args, **kwargs)


def save(fig, path: Path, dpi: int = 100, tight: bool = True) -> Path:
    """Save atomically (a temporary name, then a rename); ``tight`` crops the
    margins to the drawn content (a measuring pass)."""
    path = write_target(path)
    make_parent(path)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=dpi, bbox_inches="tight" if tight else None)
    tmp.replace(path)
    return path
