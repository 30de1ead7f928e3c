"""An nbgrader preprocessor that leaves the instructor's speaker notes out of the release.

The notebooks carry speaker notes for the slides (markdown cells with slide_type "notes", see
CONTRIBUTING, "Slides and speaker notes"); `course.py student` drops them, and so does
`nbgrader generate_assignment` with this step first (nbgrader_config.py puts it there), so both
hand out the same notebook. No note is graded, so autograde never misses one.
"""

from __future__ import annotations

from typing import Any

from nbformat.notebooknode import NotebookNode
from nbgrader.preprocessors import NbGraderPreprocessor


def is_speaker_notes(cell: dict) -> bool:
    """True for a cell of the instructor's speaker notes (RISE's slide_type "notes")."""
    return cell.get("metadata", {}).get("slideshow", {}).get("slide_type") == "notes"


class DropSpeakerNotes(NbGraderPreprocessor):
    """Remove every speaker-notes cell from the notebook."""

    def preprocess(self, nb: NotebookNode, resources: Any) -> tuple[NotebookNode, Any]:
        nb.cells = [cell for cell in nb.cells if not is_speaker_notes(cell)]
        return nb, resources
