"""mentor.lab.host_calls on hand-made traces, against mentor.lab.trace.host_time on random ones, and on a real
H200 trace of tests/data."""

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mentor.lab.host_calls import CallTime, api_calls, api_calls_table
from mentor.lab.trace import LAUNCH_CALLS, Event, Trace, host_time, load_trace

DATA = Path(__file__).parent / "data"


def _trace(*calls, ranges=((0.0, 100.0),)):
    events = [Event("update", "user_annotation", s, d, 1, 1) for s, d in ranges]
    events += [Event(name, "cuda_runtime", s, d, 1, tid) for name, s, d, tid in calls]
    return Trace(sorted(events, key=lambda e: e.start))


def test_sums_per_name_per_range_with_the_longest_call():
    t = _trace(("cudaLaunchKernel", 10, 7, 1), ("cudaLaunchKernel", 30, 50, 1), ("cudaMemsetAsync", 90, 3, 1),
               ("cudaLaunchKernel", 210, 11, 1), ranges=((0, 100), (200, 100)))
    assert api_calls(t, "update") == [CallTime("cudaLaunchKernel", 1.5, 34.0, 50.0),
                                      CallTime("cudaMemsetAsync", 0.5, 1.5, 3.0)]


def test_only_calls_that_start_inside_a_range_on_its_thread_count():
    t = _trace(("cudaLaunchKernel", -1, 5, 1),  # starts before the range
               ("cudaLaunchKernel", 0, 2, 1),  # at its start: inside
               ("cudaLaunchKernel", 99, 40, 1),  # starts inside, ends after: all of it counts
               ("cudaLaunchKernel", 100, 9, 1),  # at its end: outside
               ("cudaLaunchKernel", 50, 8, 2))  # another thread
    assert api_calls(t, "update") == [CallTime("cudaLaunchKernel", 2.0, 42.0, 40.0)]
    other_process = Trace([Event("update", "user_annotation", 0, 100, 1, 1),
                           Event("cudaLaunchKernel", "cuda_runtime", 5, 5, 2, 1)])
    assert api_calls(other_process, "update") == []


def test_gpu_events_and_driver_calls_are_told_apart():
    t = Trace([Event("update", "user_annotation", 0, 100, 1, 1),
               Event("update", "kernel", 0, 100, 0, 7),  # a kernel of the same name is not a range
               Event("cuLaunchKernel", "cuda_driver", 10, 4, 1, 1),
               Event("void k()", "kernel", 12, 3, 0, 7)])
    assert api_calls(t, "update") == [CallTime("cuLaunchKernel", 1.0, 4.0, 4.0)]


def test_equal_times_keep_alphabetical_order():
    t = _trace(("cudaStreamIsCapturing", 1, 2, 1), ("cudaGetDevice", 5, 2, 1), ("cudaLaunchKernel", 9, 3, 1))
    assert [c.name for c in api_calls(t, "update")] == ["cudaLaunchKernel", "cudaGetDevice", "cudaStreamIsCapturing"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["cudaLaunchKernel", "cudaMemsetAsync", "cudaStreamSynchronize",
                                           "cuLaunchKernel", "cudaMemcpyAsync"]),
                          st.integers(-20, 260), st.integers(0, 300), st.integers(1, 2)), max_size=25))
def test_the_calls_add_up_to_what_host_time_puts_in_api_calls(calls):
    """Every API call in a range is a wait, a launch or another call for host_time: the per-name sums agree."""
    t = _trace(*calls, ranges=((0, 100), (150, 100)))
    rows = api_calls(t, "update")
    h = host_time(t, "update")
    assert math.isclose(sum(c.us for c in rows), h.wait_us + h.launch_us + h.other_api_us, abs_tol=1e-9)
    # host_time counts a launch long enough to be a wait as a wait, never the other way round
    assert h.launches <= sum(c.calls for c in rows if c.name in LAUNCH_CALLS) + 1e-9
    assert [c.us for c in rows] == sorted((c.us for c in rows), reverse=True)


def test_on_a_real_trace_the_optimizer_steps_launches_agree_with_host_time():
    t = load_trace(DATA / "optimized.json.gz")
    rows = api_calls(t, "Optimizer.step#SGD.step")
    h = host_time(t, "Optimizer.step#SGD.step")
    launches = sum(c.calls for c in rows if c.name in LAUNCH_CALLS)
    assert launches > 0
    assert math.isclose(sum(c.us for c in rows), h.wait_us + h.launch_us + h.other_api_us, rel_tol=1e-9)
    assert all(c.longest_us * c.calls >= c.us - 1e-9 for c in rows)


def test_bad_input_is_named():
    with pytest.raises(TypeError, match="trace must be a mentor.lab.trace.Trace"):
        api_calls("trace.json", "update")
    with pytest.raises(ValueError, match=r"no range named 'missing'.*record_function\('missing'\)"):
        api_calls(_trace(), "missing")
    for top in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="top must be an int >= 1"):
            api_calls_table([], top=top)


def test_the_table_shows_the_first_rows_and_shortens_long_names():
    rows = [CallTime("cudaLaunchKernelExC_with_a_very_long_name", 3.0, 12.25, 5.0),
            CallTime("cudaMemsetAsync", 1.0, 2.0, 2.0)]
    assert api_calls_table(rows, top=1).splitlines() == [
        "call                         per range   µs per range   longest µs",
        "cudaLaunchKernelExC_with_a…        3.0           12.2          5.0",
    ]
    assert api_calls_table(rows).splitlines()[2] == (
        "cudaMemsetAsync                    1.0            2.0          2.0")


def test_boundaries_the_first_mutation_run_left_open():
    """A call shorter than 1 µs is its own longest; the table shows 5 names by default; a name of 27 characters
    fits whole and one of 28 is cut."""
    t = _trace(("cudaGetDevice", 3, 0.25, 1), ("cudaGetDevice", 9, 0.5, 1))
    assert api_calls(t, "update") == [CallTime("cudaGetDevice", 2.0, 0.75, 0.5)]
    rows = [CallTime(f"call{k}", 1.0, 10.0 - k, 1.0) for k in range(6)]
    assert len(api_calls_table(rows).splitlines()) == 1 + 5
    fits, cut = "c" * 27, "c" * 28
    lines = api_calls_table([CallTime(fits, 1.0, 2.0, 2.0), CallTime(cut, 1.0, 1.0, 1.0)]).splitlines()
    assert lines[1].startswith(fits + " ") and lines[2].startswith("c" * 26 + "… ")
    with pytest.raises(TypeError, match=r"not str\.$"):
        api_calls("trace.json", "update")
