"""Figure style and the small plotting helpers the notebooks share.

Figures are drawn for a projector: large fonts, thick lines, labelled axes and a title.

    use_course_style, heatmap       the style, and labelled heat maps (attention weights, ...)
    draw_losses, LiveLossPlot       training and validation loss against step, drawn once or
                                    redrawn in place by `helpers.training.trainer.Trainer.fit` (notebook 7)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import torch

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


def use_course_style() -> None:
    """Apply the course's projector-friendly matplotlib settings."""
    matplotlib.rcParams.update(COURSE_STYLE)


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
            ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=10,
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
