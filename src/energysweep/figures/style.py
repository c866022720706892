"""One visual language for every figure: a layout keeps its colour and marker everywhere.

Colour says *which* degrees are parallel (tp alone: blues, pp alone: oranges, dp alone: greens,
mixed layouts: purples/pinks/browns/greys, no parallelism: black) and its shade the world size,
so the mapping depends only on (tp, pp, dp) — never on which layouts a frame happens to hold or
in which order. Backends differ by line style, and invalid points are hollow markers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import matplotlib

matplotlib.use("Agg")  # figures are files; never open a display (CI, Slurm nodes)

from matplotlib import colormaps  # noqa: E402

from energysweep.job.backends import BACKENDS  # noqa: E402
from energysweep.tables.phases import Phase  # noqa: E402

if TYPE_CHECKING:
    from matplotlib.typing import LineStyleType

# Which degrees are > 1 -> (colormap, marker). The empty key is the unparallelized layout.
_FAMILIES = {
    (): (None, "o"),
    ("tp",): ("Blues", "^"),
    ("pp",): ("Oranges", "s"),
    ("dp",): ("Greens", "D"),
    ("tp", "pp"): ("Purples", "P"),
    ("tp", "dp"): ("RdPu", "X"),
    ("pp", "dp"): ("YlOrBr", "h"),
    ("tp", "pp", "dp"): ("Greys", "*"),
}
PHASE_COLOURS = {
    Phase.GENERATE.value: "#4c72b0",
    Phase.PREFILL.value: "#dd8452",
    Phase.TRAIN.value: "#55a868",
}
INVALID_LABEL = "invalid point (hollow; see invalid_reasons)"


@dataclass(frozen=True)
class Style:
    """Matplotlib keyword values for one layout (and backend)."""

    color: str | tuple
    marker: str
    linestyle: LineStyleType = "-"

    def line(self, label: str | None = None) -> dict:
        """Keyword arguments for ``Axes.plot`` / ``Axes.errorbar`` lines."""
        return {
            "color": self.color,
            "marker": self.marker,
            "linestyle": self.linestyle,
            "label": label,
            "markersize": 6,
            "linewidth": 1.5,
        }


def layout_name(tp: int, pp: int, dp: int) -> str:
    """``tp2·pp1·dp1``-style name used in every legend."""
    return f"tp{int(tp)} pp{int(pp)} dp{int(dp)}"


def layout_style(tp: int, pp: int, dp: int, backend: str | None = None) -> Style:
    """The colour and marker of a layout, and the line style of its backend.

    Deterministic in its arguments alone, so a layout is drawn the same in every figure.
    """
    degrees = {"tp": int(tp), "pp": int(pp), "dp": int(dp)}
    family = tuple(k for k in ("tp", "pp", "dp") if degrees[k] > 1)
    cmap_name, marker = _FAMILIES[family]
    if cmap_name is None:
        color: str | tuple = "#222222"
    else:
        world = degrees["tp"] * degrees["pp"] * degrees["dp"]
        # Darker with more ranks; a small tp term separates e.g. tp2pp4 from tp4pp2.
        shade = 0.5 + 0.08 * math.log2(world) + 0.02 * math.log2(degrees["tp"])
        color = colormaps[cmap_name](min(shade, 0.97))
    # Each backend's line style is its registry record's (energysweep.job.backends).
    info = BACKENDS.get(backend or "pytorch")
    linestyle = cast("LineStyleType", info.line_style if info is not None else "-.")
    return Style(color=color, marker=marker, linestyle=linestyle)


def style_of_row(row) -> Style:
    """:func:`layout_style` of a summary row (a mapping with tp, pp, dp and backend)."""
    return layout_style(row["tp"], row["pp"], row["dp"], row.get("backend"))
