"""Figure style and the small plotting helpers the notebooks share.

Figures are drawn for a projector: large fonts, thick lines, labelled axes and a title. In a
lecture hall, projector mode (`COURSE_PROJECTOR=1`, or `start(projector=True)` in the set-up)
makes every text at least 18 px on a 1280x720 screen and draws vector figures (SVG), which grow
with the browser's zoom instead of staying a fixed PNG.

    use_course_style, heatmap       the style, and labelled heat maps (attention weights, ...)
    smallest_text_px                the smallest text of a figure as JupyterLab shows it
    draw_losses, LiveLossPlot       training and validation loss against step, drawn once or
                                    redrawn in place by `helpers.training.trainer.Trainer.fit` (notebook 7)
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.text import Text

if TYPE_CHECKING:
    from helpers.training.trainer import History

COURSE_STYLE = {
    "figure.figsize": (7.0, 4.0),
    "figure.dpi": 80,
    "savefig.dpi": 80,
    "font.size": 13,
    "axes.titlesize": 15,
    "axes.labelsize": 13,
    "lines.linewidth": 2.5,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "legend.fontsize": 12,
    "image.cmap": "viridis",
}


PROJECTOR_VARIABLE = "COURSE_PROJECTOR"
# A browser draws an SVG point as 4/3 of a CSS pixel, so 14 pt is 18.7 px at 100 % zoom.
PROJECTOR_STYLE = {**COURSE_STYLE, "font.size": 16, "axes.titlesize": 18, "axes.labelsize": 16,
                   "xtick.labelsize": 14, "ytick.labelsize": 14, "legend.fontsize": 14,
                   "figure.dpi": 96, "savefig.dpi": 192}
MIN_TEXT_PX = 18
# The width of JupyterLab 4's output area in a 1280x720 window with the side panel closed: a
# wider figure is shrunk to it, its text with it.
SCREEN_WIDTH_PX = 1100
PX_PER_INCH, PX_PER_POINT = 96, 96 / 72
_mode = {"projector": False}


def projector_from_environment() -> bool:
    """True when COURSE_PROJECTOR is "1", False when it is unset, empty or "0"."""
    value = os.environ.get(PROJECTOR_VARIABLE, "")
    if value not in ("", "0", "1"):
        raise ValueError(f"{PROJECTOR_VARIABLE}={value!r}, expected 1 (projector mode), 0 or unset")
    return value == "1"


def use_course_style(projector: bool | None = None) -> None:
    """Apply the course's matplotlib settings; projector=True (default: COURSE_PROJECTOR) makes
    every text at least MIN_TEXT_PX pixels on screen and the inline figures vector (SVG)."""
    if projector is None:
        projector = projector_from_environment()
    if not isinstance(projector, bool):
        raise TypeError(f"projector must be True, False or None, got {projector!r}")
    was_projector, _mode["projector"] = _mode["projector"], projector
    matplotlib.rcParams.update(PROJECTOR_STYLE if projector else COURSE_STYLE)
    if not (projector or was_projector):
        return  # the inline backend's own PNG, as the stored outputs were drawn
    try:
        from IPython import get_ipython
        from matplotlib_inline.backend_inline import set_matplotlib_formats
    except ImportError:
        return
    if get_ipython() is not None:
        set_matplotlib_formats("svg" if projector else "png")


def smallest_text_px(fig: matplotlib.figure.Figure, width_px: float = SCREEN_WIDTH_PX) -> float:
    """The height in CSS pixels of the smallest visible text of `fig` as JupyterLab shows it:
    its size in points, 4/3 px each, times the shrink of a figure wider than `width_px`."""
    if width_px <= 0:
        raise ValueError(f"width_px must be positive, got {width_px}")
    fig.canvas.draw()  # tick labels exist only once drawn
    sizes = [text.get_fontsize() for text in fig.findobj(Text) if text.get_visible() and text.get_text()]
    if not sizes:
        raise ValueError("the figure holds no visible text")
    shrink = min(1.0, width_px / (fig.get_figwidth() * PX_PER_INCH))
    return min(sizes) * PX_PER_POINT * shrink


def _as_array(values: torch.Tensor | np.ndarray | Sequence[Sequence[float]]) -> np.ndarray:
    if isinstance(values, torch.Tensor):
        return values.detach().float().cpu().numpy()
    return np.asarray(values, dtype=float)


def heatmap(
    values: torch.Tensor | np.ndarray,
    row_labels: Sequence[str] | None = None,
    col_labels: Sequence[str] | None = None,
    title: str = "",
    xlabel: str = "",
    ylabel: str = "",
    annotate: bool = True,
    ax: plt.Axes | None = None,
    cmap: str = "viridis",
    vmin: float | None = None,
    vmax: float | None = None,
) -> plt.Axes:
    """Draw a 2-D array as a labelled heat map, writing each value in its cell when it is small.

    values: (rows, cols). Labels, when given, must match those sizes.
    """
    array = _as_array(values)
    if array.ndim != 2:
        raise ValueError(f"heatmap: values must be 2-D (rows, cols), got shape {tuple(array.shape)}")
    for name, labels, size in (("row_labels", row_labels, array.shape[0]),
                               ("col_labels", col_labels, array.shape[1])):
        if labels is not None and len(labels) != size:
            raise ValueError(f"heatmap: {name} has {len(labels)} labels, expected {size} "
                             f"for values of shape {tuple(array.shape)}")
    if ax is None:
        _, ax = plt.subplots(figsize=(max(4, 0.6 * array.shape[1] + 2), max(3, 0.5 * array.shape[0] + 1.5)))
    image = ax.imshow(array, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto")
    ax.grid(False)
    ax.figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    if row_labels is not None:
        ax.set_yticks(range(len(row_labels)), labels=row_labels)
    if col_labels is not None:
        ax.set_xticks(range(len(col_labels)), labels=col_labels, rotation=45, ha="right")
    if annotate and array.size <= 144:
        middle = np.nanmean(array) if np.isfinite(array).any() else 0.0
        for (i, j), value in np.ndenumerate(array):
            if not np.isfinite(value):
                continue  # a masked cell (-inf or NaN) is left blank rather than printed as "nan"
            ax.text(j, i, f"{value:.2f}", ha="center", va="center",
                    fontsize=plt.rcParams["legend.fontsize"] if _mode["projector"] else 10,
                    color="white" if value < middle else "black")
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    return ax


def draw_losses(history: History, ax: Any = None, title: str = "Training a GPT on the course corpus") -> Any:
    """Training-batch loss (thin), fixed-batch train and validation loss (thick), against step."""
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(history.steps, history.losses, color="0.75", linewidth=1, label="training batch")
    ax.plot(history.eval_steps, history.train_losses, "o-", label="train (fixed batches)")
    ax.plot(history.eval_steps, history.val_losses, "s-", label="validation")
    ax.set_xlabel("optimiser step")
    ax.set_ylabel("cross-entropy loss (nats)")
    ax.set_title(title)
    ax.legend()
    return ax


class LiveLossPlot:
    """A callback for `Trainer.fit` that redraws the loss curves in place at every evaluation.

    In Jupyter or Colab the figure updates under the cell; elsewhere it is shown once per call.
    """

    def __init__(self, title: str = "Training a GPT on the course corpus") -> None:
        self.title = title
        self.handle: Any = None
        self.redraws = 0

    def __call__(self, history: History) -> None:
        from IPython.display import display

        ax = draw_losses(history, title=self.title)
        if self.handle is None:
            self.handle = display(ax.figure, display_id=True)
        else:
            self.handle.update(ax.figure)
        plt.close(ax.figure)
        self.redraws += 1
