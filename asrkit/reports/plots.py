"""Plot helpers shared by the reports (matplotlib without a display)."""
from __future__ import annotations

import io
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Union

from asrkit.utils import atomic_write

#: marks of significant differences, one per baseline (in the order the baselines are given)
MARKS = ("*", "†", "‡", "§", "¶")


def save_png(fig, path: Union[str, Path], dpi: int = 120) -> Path:
    """Render ``fig`` (a matplotlib Figure, no pyplot state needed) to ``path`` atomically."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    with atomic_write(Path(path), "wb") as f:
        f.write(buf.getvalue())
    return Path(path)


def line_style(i: int) -> dict:
    """Line style of the ``i``-th series, the same in every subplot: tab10 colours, then the
    same colours again with another marker and a dashed line, so 11+ series stay distinct."""
    markers, dashes = "osD^v", ["-", "--", ":", "-."]
    return {"color": f"C{i % 10}", "marker": markers[(i // 10) % len(markers)],
            "linestyle": dashes[(i // 10) % len(dashes)]}


@dataclass
class Series:
    """One line: ``y[k]`` at category ``k`` (``None``: no point), its interval ``[low, high]``
    drawn as an error bar, and a text mark above the bar (e.g. ``*`` for significant)."""

    name: str
    y: list[Optional[float]]
    low: list[Optional[float]] = field(default_factory=list)
    high: list[Optional[float]] = field(default_factory=list)
    marks: list[str] = field(default_factory=list)


@dataclass
class Panel:
    """One subplot: categories on x, one :class:`Series` per experiment."""

    title: str
    categories: list[str]
    series: list[Series]


def error_bar_panels(panels: list[Panel], path: Union[str, Path], xlabel: str,
                     ylabel: str = "WER (%)", note: str = "") -> Optional[Path]:
    """One subplot per panel: each series a line through its points with error bars (points of
    the series side by side, slightly apart, so bars do not hide each other) and its marks above
    the bars; ``note`` under the figure. ``None`` if no panel has a point."""
    from matplotlib.figure import Figure

    panels = [p for p in panels if any(v is not None for s in p.series for v in s.y)]
    if not panels:
        return None
    ncols = min(len(panels), 3)
    nrows = math.ceil(len(panels) / ncols)
    fig = Figure(figsize=(5.2 * ncols, 4.0 * nrows + (0.4 if note else 0)), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax, p in zip(axes, panels):
        n = max(len(p.series), 1)
        width = min(0.6, 0.08 * n)
        top = 1.0
        for i, s in enumerate(p.series):
            dx = (i - (n - 1) / 2) * width / max(n - 1, 1) if n > 1 else 0.0
            pts = [(k + dx, y, (s.low or [None] * len(s.y))[k], (s.high or [None] * len(s.y))[k],
                    (s.marks or [""] * len(s.y))[k]) for k, y in enumerate(s.y) if y is not None]
            if not pts:
                continue
            st = line_style(i)
            xs, ys = [x for x, *_ in pts], [y for _, y, *_ in pts]
            lo = [y - (lw if lw is not None else y) for _, y, lw, _, _ in pts]
            hi = [(hg if hg is not None else y) - y for _, y, _, hg, _ in pts]
            ax.errorbar(xs, ys, yerr=[lo, hi], label=s.name, capsize=2, markersize=4, linewidth=1.2,
                        elinewidth=0.8, **st)
            for x, y, _, hg, mark in pts:
                yt = hg if hg is not None else y
                top = max(top, yt)
                if mark:
                    ax.annotate(mark, (x, yt), xytext=(0, 1), textcoords="offset points", ha="center",
                                va="bottom", fontsize=9, color=st["color"])
        ax.set_xticks(range(len(p.categories)))
        ax.set_xticklabels(p.categories)
        ax.set_xlim(-0.5, len(p.categories) - 0.5)
        ax.set_ylim(-0.03 * top, 1.12 * top)
        ax.set_title(p.title)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="x-small", ncol=2 if len(p.series) > 6 else 1)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    if note:
        fig.supxlabel(note, fontsize="small")
    return save_png(fig, Path(path))
