"""Every widget the course shows, notebook by notebook: what to move and what must change.

One entry per notebook in notebooks/ (an empty list for a notebook without widgets), and in each
entry one `Widget` per widget view the notebook displays, in the order the notebook displays them.
`tests/browser/test_widget_table.py` fails when a notebook has no entry, or when its stored
widget views or controls differ from its entry, so a new notebook or a new widget cannot slip
past the browser suite.

A widget view is found generically in the browser: every control (slider, text box, dropdown,
checkbox) inside the view is discovered in display order and must match `controls`; each is
moved the way a student would (a slider's handle with the keyboard, a new option in a dropdown,
new text typed into a text box, a click on a checkbox), and after each move the part it drives
(`drives`) must show something new.
"""

from __future__ import annotations

from dataclasses import dataclass

# What a control's ipywidgets model is called in a notebook's saved widget state -> its kind here.
MODEL_KINDS = {
    "IntSliderModel": "slider", "FloatSliderModel": "slider", "FloatLogSliderModel": "slider",
    "SelectionSliderModel": "slider", "IntRangeSliderModel": "slider",
    "FloatRangeSliderModel": "slider", "SelectionRangeSliderModel": "slider",
    "TextModel": "text", "TextareaModel": "text",
    "DropdownModel": "dropdown", "SelectModel": "dropdown", "RadioButtonsModel": "radio",
    "ToggleButtonsModel": "toggle-buttons", "CheckboxModel": "checkbox",
    "ToggleButtonModel": "toggle-button", "IntTextModel": "number", "FloatTextModel": "number",
    "BoundedIntTextModel": "number", "BoundedFloatTextModel": "number", "ButtonModel": "button",
    "ComboboxModel": "text",
}

# The kinds the browser suite knows how to move; any other kind in a notebook fails the table
# test, which then says what to add to tests/browser/lab_page.py.
DRIVABLE = {"slider", "text", "dropdown", "checkbox"}


@dataclass(frozen=True)
class Control:
    kind: str  # "slider", "text", "dropdown" or "checkbox"
    label: str  # its description, as shown next to it
    type_text: str = ""  # for a text box: what the student types


@dataclass(frozen=True)
class Widget:
    controls: tuple[Control, ...]
    # What the controls drive: "figure" (the matplotlib image in an Explorer's Output area),
    # "html" (the content of an HTML widget, e.g. the tokenizer playground's coloured tokens), or
    # "display" for a widget with no controls (a progress bar): it must only draw.
    drives: str


def slider(label: str) -> Control:
    return Control("slider", label)


def dropdown(label: str) -> Control:
    return Control("dropdown", label)


def checkbox(label: str) -> Control:
    return Control("checkbox", label)


def text(label: str, type_text: str) -> Control:
    return Control("text", label, type_text)


WIDGETS: dict[str, list[Widget]] = {
    # The tokenizer playground: a text box above an HTML widget of coloured tokens and ids.
    "01_tokenization": [
        Widget((text("text", "The brave librarian said hello 👋 to Zoë"),), drives="html"),
    ],
    # The positional-encoding explorer.
    "02_embeddings": [
        Widget((slider("d_model"), slider("base"), slider("position")), drives="figure"),
    ],
    # The d_k slider that redraws the attention distribution and the gradient norm.
    "03_attention": [
        Widget((slider("d_k"),), drives="figure"),
    ],
    # The attention-pattern explorer: pattern, query row, causal or not.
    "04_masking": [
        Widget((dropdown("pattern"), slider("query"), checkbox("causal")), drives="figure"),
    ],
    # Attention maps per head, for a chosen sentence.
    "05_multihead_attention": [
        Widget((dropdown("head"), dropdown("sentence")), drives="figure"),
    ],
    "06_layers": [],
    # Training shows a text progress bar (tqdm on stderr) and a live loss plot (a display that
    # updates in place), neither of them a widget.
    "07_gpt": [],
    # The tile-by-tile walk through Algorithm 1: one step slider.
    "08_flash_attention": [
        Widget((slider("step"),), drives="figure"),
    ],
    # RoPE: drag the offset m - n and the position n; the rotated pair and the score redraw.
    "09_modern_decoder": [
        Widget((slider("offset m - n"), slider("position n")), drives="figure"),
    ],
    # Cross-attention maps of the trained translator: pick the test sentence and the head.
    "10_encoders": [
        Widget((dropdown("sentence"), slider("head")), drives="figure"),
    ],
    # The collectives and the parallel schemes run in worker processes; their results come back
    # as printed tables and figures, not widgets.
    "11_distributed": [],
    # MoE: top-k and the capacity factor against each expert's load; sliding windows: the window
    # and the number of local layers per global against the KV cache at 128k tokens.
    "12_frontier_decoder": [
        Widget((slider("top-k"), slider("capacity factor")), drives="figure"),
        Widget((slider("window"), slider("local per global")), drives="figure"),
    ],
    # DPO: move beta; the margin and the KL to the reference (precomputed per beta) redraw.
    "13_post_training": [
        Widget((slider("beta"),), drives="figure"),
    ],
    "14_serving": [
        Widget((slider("temperature"), slider("top_p")), drives="figure"),
    ],
}
