"""tools/slide_marks.py: the slide boundaries it proposes from the headings, and what it leaves alone."""

from __future__ import annotations

import sys

import pytest
from notebook_tools import ROOT

sys.path.insert(0, str(ROOT / "tools"))
from slide_marks import mark  # noqa: E402

SOURCE = """# %% [markdown]
# # 3. A title

# %% [setup]

# %%
import torch

# %% [markdown]
# Some prose, then a section starts inside the cell.
#
# ## 1. A section (core)

# %% [markdown]
# More prose.
#
# ### A stop

# %% [markdown] slideshow={"slide_type": "notes"}
# Ask the room.

# %% [markdown] slideshow={"slide_type": "skip"}
# ## Chosen by hand
"""


def test_headings_start_slides_prose_subslides_and_code_fragments():
    headers = [line for line in mark(SOURCE).splitlines() if line.startswith("# %%")]
    assert headers == ['# %% [markdown] slideshow={"slide_type": "slide"}', "# %% [setup]",
                       '# %% slideshow={"slide_type": "fragment"}',
                       '# %% [markdown] slideshow={"slide_type": "slide"}',
                       '# %% [markdown] slideshow={"slide_type": "subslide"}',
                       '# %% [markdown] slideshow={"slide_type": "notes"}',
                       '# %% [markdown] slideshow={"slide_type": "skip"}']


def test_marking_twice_changes_nothing_more_and_keeps_every_other_line():
    once = mark(SOURCE)
    assert mark(once) == once
    assert [line for line in once.splitlines() if not line.startswith("# %%")] == [
        line for line in SOURCE.splitlines() if not line.startswith("# %%")]


def test_mark_refuses_what_is_not_a_source():
    with pytest.raises(TypeError, match="text is bytes, expected a notebook source"):
        mark(SOURCE.encode())
