"""nbgrader's Execute preprocessor, made to grade a submission whose kernel dies.

nbgrader's own gives up on a notebook whose kernel dies (an answer that calls os._exit, runs out
of memory or crashes the interpreter): the submission gets no grade at all and `nbgrader
autograde` exits with an error. Here the cells that ran keep their outputs, and every code cell
the dead kernel never ran gets an error output saying so, so the submission is graded: the points
of the checks that passed before the death, none after. nbgrader_config.py puts it in place.
"""

from __future__ import annotations

from typing import Any

from nbclient.exceptions import DeadKernelError
from nbformat.notebooknode import NotebookNode
from nbgrader.preprocessors import Execute

NOT_RUN = "the kernel died before this cell ran (the code above ended the Python process), so it scores 0"


class SurvivingExecute(Execute):
    """Execute, but a dead kernel fails the cells it did not run instead of the whole submission."""

    def preprocess(self, nb: NotebookNode, resources: Any = None, km: Any = None) -> tuple[NotebookNode, Any]:
        try:
            return super().preprocess(nb, resources, km)
        except DeadKernelError:
            self.log.warning("The kernel died: the cells it did not run are graded as failed.")
            for cell in nb.cells:
                if cell.cell_type == "code" and cell.get("execution_count") is None:
                    cell.outputs = [NotebookNode(output_type="error", ename="KernelDied", evalue=NOT_RUN,
                                                 traceback=[f"KernelDied: {NOT_RUN}"])]
            return nb, resources
