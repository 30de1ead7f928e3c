"""helpers.flash.profiling: file descriptor 2 silenced and restored, the peak measured from the
allocator's running total, and a bad argument refused before the profiler starts.

Written for the mutation run (benchmarks/mutation.py, issue 30): each test fails on a planted
one-line bug that test_flash.py lets through.
"""

from __future__ import annotations

import pytest
import torch

from helpers.flash import profiling


@pytest.mark.parametrize("fn, got", [(None, "None (a NoneType)"), (3, "3 (a int)"),
                                     (torch.zeros(()), "tensor(0.) (a Tensor)")])
def test_a_value_that_cannot_be_called_is_refused(fn, got):
    with pytest.raises(TypeError) as error:
        profiling.peak_memory_bytes(fn)
    assert str(error.value) == (f"fn is {got}, expected a function to call with no arguments, "
                                "e.g. lambda: attention(q, k, v)")
