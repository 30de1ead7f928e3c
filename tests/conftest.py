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
