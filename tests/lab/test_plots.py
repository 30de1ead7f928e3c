"""Projector mode (helpers.lab.plots): every text of a course figure reaches 18 px on a 1280x720
screen, and the switch refuses a value it does not know."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pytest
import torch

from helpers.lab import plots


@pytest.fixture(autouse=True)
def course_style_after():
    yield
    plots.use_course_style(projector=False)


def labelled_figure() -> plt.Figure:
    fig, ax = plt.subplots()
    ax.plot([0, 1, 2], [2, 1, 3], label="validation")
    ax.set(title="Training a GPT", xlabel="optimiser step", ylabel="loss")
    ax.legend()
    return fig


@pytest.mark.parametrize(("projector", "readable"), [(True, True), (False, False)])
def test_projector_mode_makes_every_text_of_a_figure_at_least_18_px(projector, readable):
    plots.use_course_style(projector=projector)
    fig = labelled_figure()
    assert (plots.smallest_text_px(fig) >= plots.MIN_TEXT_PX) == readable
    plt.close(fig)


def test_a_heat_map_of_attention_with_token_labels_is_readable_in_projector_mode():
    plots.use_course_style(projector=True)
    tokens = ["I", "like", "to", "eat", "soup", "."]
    ax = plots.heatmap(torch.softmax(torch.randn(6, 6), -1), tokens, tokens, title="weights",
                       xlabel="key", ylabel="query")
    assert plots.smallest_text_px(ax.figure) >= plots.MIN_TEXT_PX
    plt.close(ax.figure)


def test_a_figure_wider_than_the_screen_is_shrunk_and_its_text_with_it():
    plots.use_course_style(projector=True)
    fig = labelled_figure()
    fitting = plots.smallest_text_px(fig)
    fig.set_figwidth(22)  # 2112 px: JupyterLab shows it at 1100 px
    assert plots.smallest_text_px(fig) == pytest.approx(fitting * 1100 / 2112)
    plt.close(fig)


def test_the_environment_variable_switches_projector_mode_and_a_bad_value_is_named(monkeypatch):
    monkeypatch.setenv("COURSE_PROJECTOR", "1")
    assert plots.projector_from_environment() is True
    monkeypatch.setenv("COURSE_PROJECTOR", "yes")
    with pytest.raises(ValueError, match=r"COURSE_PROJECTOR='yes', expected 1 \(projector mode\), 0 or unset"):
        plots.use_course_style()
    with pytest.raises(TypeError, match=r"projector must be True, False or None, got 'on'"):
        plots.use_course_style(projector="on")
    with pytest.raises(ValueError, match=r"width_px must be positive, got 0"):
        plots.smallest_text_px(labelled_figure(), width_px=0)
