"""nbgrader's settings for grading this course (read by every `nbgrader` command run here).

    nbgrader generate_assignment week1      # from grading/source/week1/*.ipynb (instructor's notebooks)
    nbgrader autograde week1                # grading/submitted/STUDENT/week1/*.ipynb
    nbgrader generate_feedback week1

The course folder is grading/ beside this file (git ignores it: it holds students' work). The
kernels that grade import the course's `helpers` package from this repository, whether or not it
is installed, and draw the hidden tests' inputs from COURSE_HIDDEN_SEED: set it to a number of your
own (export COURSE_HIDDEN_SEED=...) so that no student can know the hidden inputs in advance.
"""

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)
# The hidden tests refuse a `helpers` imported from anywhere else (a submission that brings its own).
os.environ["COURSE_HELPERS"] = str(HERE / "helpers")

c = get_config()  # noqa: F821 - nbgrader defines it when it reads this file
c.CourseDirectory.root = str(HERE / "grading")
c.CourseDirectory.course_id = "transformer-course"
# nbgrader's default of 30 s per cell is 0.4 s above notebook 7's training cell on a 2-core laptop:
# 180 s leaves room for a slow grading machine. A cell past it is interrupted and graded as failed.
c.Execute.timeout = 180
c.Execute.interrupt_on_timeout = True
# A submission whose kernel dies is graded (the checks that ran before the death), not dropped.
sys.path.insert(0, str(HERE / "tools"))
from nbgrader.converters.autograde import Autograde  # noqa: E402 - after the path above
from nbgrader.preprocessors import Execute  # noqa: E402
from nbgrader_execute import SurvivingExecute  # noqa: E402

c.Autograde.autograde_preprocessors = [SurvivingExecute if step is Execute else step
                                       for step in Autograde.class_traits()["autograde_preprocessors"].default()]
# The release leaves out the speaker notes of the slides, as `course.py student` does.
from nbgrader.converters.generate_assignment import GenerateAssignment  # noqa: E402
from nbgrader_notes import DropSpeakerNotes  # noqa: E402

c.GenerateAssignment.preprocessors = [
    DropSpeakerNotes, *GenerateAssignment.class_traits()["preprocessors"].default()]
