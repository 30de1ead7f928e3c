"""helpers.flash.profiling: file descriptor 2 silenced and restored, the peak measured from the
allocator's running total, and a bad argument refused before the profiler starts.


"""

from __future__ import annotations

import os
import tempfile

import pytest
import torch
import torch._inductor.config  # noqa: F401  (the profiler's first start imports it: paid here)

from helpers.flash import profiling


def test_stderr_goes_to_dev_null_inside_and_comes_back_after():
    with tempfile.TemporaryFile() as sink:
        original = os.dup(2)
        os.dup2(sink.fileno(), 2)  # fd 2 on a file of this test's own, whatever pytest did
        try:
            open_fds = sorted(os.listdir("/proc/self/fd"))
            os.write(2, b"before ")
            with profiling._native_stderr_silenced():
                null, here = os.stat(os.devnull), os.fstat(2)
                assert (here.st_dev, here.st_ino) == (null.st_dev, null.st_ino)
                assert os.write(2, b"lost ") == 5  # opened for writing
            os.write(2, b"after")
            after = os.fstat(2)
            assert (after.st_dev, after.st_ino) == (os.fstat(sink.fileno()).st_dev,
                                                    os.fstat(sink.fileno()).st_ino)
            assert sorted(os.listdir("/proc/self/fd")) == open_fds  # the saved copy is closed
        finally:
            os.dup2(original, 2)
            os.close(original)
        sink.seek(0)
        assert sink.read() == b"before after"


def test_stderr_comes_back_when_the_body_raises():
    before = os.fstat(2)
    with pytest.raises(KeyError), profiling._native_stderr_silenced():
        raise KeyError("inside")
    after = os.fstat(2)
    assert (after.st_dev, after.st_ino) == (before.st_dev, before.st_ino)


def test_peak_is_measured_from_the_total_before_the_first_event(monkeypatch):
    # (time, allocator total after the event, bytes allocated or freed), listed out of time order
    events = [(30, 4_500, -1_500), (10, 5_000, 1_000), (20, 6_000, 1_000)]
    monkeypatch.setattr(profiling, "_allocation_events", lambda prof: list(events))
    # the total was 4_000 before the first event (t=10) and peaked at 6_000
    assert profiling.peak_memory_bytes(lambda: None) == 2_000


def test_events_stamped_the_same_time_keep_the_order_they_were_listed_in(monkeypatch):
    # sorted by time only (a stable sort): the first listed of two simultaneous events is first
    events = [(10, 5_000, 1_000), (10, 4_000, -1_000)]
    monkeypatch.setattr(profiling, "_allocation_events", lambda prof: list(events))
    assert profiling.peak_memory_bytes(lambda: None) == 1_000


def test_peak_of_a_real_call_is_the_largest_tensor_alive_at_once():
    def two_at_once() -> None:
        first = torch.ones(100_000)        # 400 kB
        second = torch.ones(200_000)       # 800 kB, both alive: 1.2 MB
        del first, second
        third = torch.ones(250_000)        # 1 MB alone
        del third

    assert 1_200_000 <= profiling.peak_memory_bytes(two_at_once) < 1_250_000


@pytest.mark.parametrize("fn, got", [(None, "None (a NoneType)"), (3, "3 (a int)"),
                                     (torch.zeros(()), "tensor(0.) (a Tensor)")])
def test_a_value_that_cannot_be_called_is_refused(fn, got):
    with pytest.raises(TypeError) as error:
        profiling.peak_memory_bytes(fn)
    assert str(error.value) == (f"fn is {got}, expected a function to call with no arguments, "
                                "e.g. lambda: attention(q, k, v)")
