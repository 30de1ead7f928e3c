"""Explorer redraws its figure when a control moves, and says clearly when misused."""

from __future__ import annotations

import ipywidgets as widgets
import matplotlib.pyplot as plt
import pytest

from helpers.lab.widgets import Explorer


def draw_line(slope: float, label: str) -> dict:
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, slope], label=label)
    plt.close(fig)
    return {"slope": slope, "label": label}


def test_moving_a_control_redraws_with_the_new_value():
    explorer = Explorer(draw_line, slope=widgets.FloatSlider(value=1.0, min=0, max=5),
                        label=widgets.Text(value="a"))
    assert explorer.last == {"slope": 1.0, "label": "a"} and explorer.redraws == 1
    assert explorer.set(slope=2.5) == {"slope": 2.5, "label": "a"}
    assert explorer.set(label="b")["label"] == "b"
    assert explorer.redraws == 3
    assert isinstance(explorer.widget(), widgets.VBox)


def test_reset_returns_every_control_to_its_start_so_a_check_can_run_twice():
    explorer = Explorer(draw_line, slope=widgets.FloatSlider(value=1.0, min=0, max=5),
                        label=widgets.Text(value="a"))
    assert explorer.reset() == {"slope": 1.0, "label": "a"} and explorer.redraws == 1  # nothing moved
    for _ in range(2):  # a check cell run twice sees the same change both times
        first = explorer.reset()
        moved = explorer.set(slope=2.5, label="b")
        assert first == {"slope": 1.0, "label": "a"} and moved == {"slope": 2.5, "label": "b"}


def test_unknown_controls_and_no_controls_are_errors():
    explorer = Explorer(draw_line, slope=widgets.FloatSlider(value=1.0), label=widgets.Text(value="a"))
    with pytest.raises(KeyError, match="no control named"):
        explorer.set(colour="red")
    with pytest.raises(ValueError, match="at least one control"):
        Explorer(draw_line)
