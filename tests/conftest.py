import os
import sys
from pathlib import Path

import torch

# Triton reads TRITON_INTERPRET once, when it is first imported (torch.profiler may import it):
# set it here, before any test module, so the kernel tests run interpreted on a CPU-only machine
# whichever module happens to import triton first.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# tqdm's default lock holds a multiprocessing lock, which every process forked after it shares:
# a mutmut worker (benchmarks/mutation.py) stopped while drawing a bar leaves it held, and every
# later worker's bar then waits on it until its timeout. A thread lock is each process's own; and
# no monitor thread, which takes the lock every few seconds, can hold it when a worker is forked.
import threading  # noqa: E402

from tqdm import tqdm  # noqa: E402

tqdm.set_lock(threading.RLock())
tqdm.monitor_interval = 0

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

