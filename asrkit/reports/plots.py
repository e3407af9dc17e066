"""Plot helpers shared by the reports (matplotlib without a display)."""
from __future__ import annotations

import io
from pathlib import Path
from typing import Union

from asrkit.utils import atomic_write


def save_png(fig, path: Union[str, Path], dpi: int = 120) -> Path:
    """Render ``fig`` (a matplotlib Figure, no pyplot state needed) to ``path`` atomically."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    with atomic_write(Path(path), "wb") as f:
        f.write(buf.getvalue())
    return Path(path)
