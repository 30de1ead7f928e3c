import os
import sys
from pathlib import Path

import torch

# Triton reads TRITON_INTERPRET once, when it is first imported (torch.profiler may import it):
# set it here, before any test module, so the kernel tests run interpreted on a CPU-only machine
# whichever module happens to import triton first.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Let tests import their small shared module (notebook_tools) by name.
sys.path.insert(0, str(Path(__file__).resolve().parent))


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def scale_workers():
    """Two gloo processes shared by notebook 11's part-two tests (fsdp, pipeline, ring attention):
    starting them (import torch twice) costs more than the tests. A test that makes a worker fail
    stops them; the next `run` starts fresh ones."""
    from helpers.scale.workers import Workers

    pool = Workers(2, timeout=60.0)
    yield pool
    pool.close()
