"""A green run is one that ran every test it collected.

A test that reaches `os._exit` (or a crash of the interpreter) ends pytest with whatever status
it was given, partway through and without a summary: it happened once, and a run that had
stopped at 22 % passed. So every run here notes the tests it collected and the ones that finished;
a run that finishes fewer than it collected fails, and, when COURSE_TEST_REPORT names a file (as
`course.py test` does), the run writes its counts there at the very end: no file, no finished run.
"""

from __future__ import annotations

import json
import os

import pytest


class EveryTestRan:
    """Counts the collected tests and those that finished (reached their teardown)."""

    def __init__(self) -> None:
        self.collected = 0
        self.finished: set[str] = set()

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.collected = len(session.items)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "teardown":
            self.finished.add(report.nodeid)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if session.config.option.collectonly:  # --collect-only runs nothing, by design
            return
        short = self.collected - len(self.finished)
        if exitstatus == 0 and short > 0:
            print(f"\n{short} of {self.collected} collected tests never finished: the run failed")
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        report = os.environ.get("COURSE_TEST_REPORT")
        if report:
            with open(report, "a", encoding="utf-8") as out:
                out.write(json.dumps({"pid": os.getpid(), "collected": self.collected,
                                      "finished": len(self.finished),
                                      "status": int(session.exitstatus)}) + "\n")


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(EveryTestRan(), "every-test-ran")
