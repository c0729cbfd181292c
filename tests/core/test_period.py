"""The time-based period policy (tf_commopt.core.period): counts from measured step times, exactly."""

import math

import pytest

from tf_commopt.core.interval import first_iteration_interval
from tf_commopt.core.period import TimeBudget, TimePeriod
from tf_commopt.errors import InputError


def brute_force(h, times, min_steps=1, max_steps=None, budget=None, tolerance=0.2):
    """The most steps whose total time fits the budget, by counting one step at a time (a worker within
    ``tolerance`` of the fastest steps at the fastest's pace)."""
    budget = h * min(times) if budget is None else budget
    out = []
    for t in times:
        if t <= min(times) * (1 + tolerance):
            t = min(times)
        n = 0
        while (n + 1) * t <= budget * (1 + 1e-12):
            n += 1
        n = max(min_steps, n)
        out.append(n if max_steps is None else min(max_steps, n))
    return tuple(out)


@pytest.mark.parametrize(
    "h,times",
    [
        (4, [0.01, 0.02]),
        (8, [0.010, 0.020, 0.015, 0.010]),
        (8, [0.013, 0.026, 0.0195, 0.013]),  # 2x and 1.5x of an inexact float
        (16, [0.0031, 0.0062, 0.00465, 0.0031]),
        (5, [0.2, 0.1, 0.7]),
        (1, [0.05, 0.5]),
        (3, [0.1, 0.3]),  # 0.3 / 0.1 is 2.9999999999999996 in floats: still 1 step
    ],
)
def test_counts_are_the_steps_that_fit_the_fastest_workers_budget(h, times):
    policy = TimePeriod(interval=h)
    assert policy.steps(times) == brute_force(h, times)
    assert max(policy.steps(times)) == h  # the fastest worker takes exactly H
    assert policy.budget_s(times) == pytest.approx(h * min(times))


def test_a_worker_k_times_slower_takes_h_over_k_steps():
    assert TimePeriod(interval=16).steps([0.01, 0.02, 0.04, 0.01 * 1.5]) == (16, 8, 4, 10)


@pytest.mark.parametrize("tolerance", [0.0, 0.1, 0.2, 0.5])
def test_workers_within_the_tolerance_of_the_fastest_take_h(tolerance):
    times = [0.010, 0.0104, 0.0109, 0.0119, 0.0121, 0.0149, 0.0151, 0.02]
    got = TimePeriod(interval=10, tolerance=tolerance).steps(times)
    assert got == brute_force(10, times, tolerance=tolerance)
    assert got == tuple(10 if t <= 0.010 * (1 + tolerance) else math.floor(0.1 / t) for t in times)
    # the noise of equal workers (up to 20% here) gives H everywhere with the default: the step rule
    assert TimePeriod(interval=8).steps([0.0100, 0.0117, 0.0108, 0.0119]) == (8, 8, 8, 8)
    assert TimePeriod(interval=8, tolerance=0).steps([0.0100, 0.0117, 0.0108, 0.0119]) == (8, 6, 7, 6)


def test_bounds_fixed_budget_and_determinism():
    assert TimePeriod(interval=4, min_steps=2).steps([0.01, 1.0]) == (4, 2)
    assert TimePeriod(interval=4, max_steps=3).steps([0.01, 0.02]) == (3, 2)
    assert TimePeriod(interval=4, budget=0.1).steps([0.01, 0.03]) == (10, 3)
    assert TimePeriod(interval=4, budget=0.1).steps([0.01, 0.03]) == brute_force(4, [0.01, 0.03], budget=0.1)
    p = TimePeriod(interval=7)
    assert p.steps((0.011, 0.017, 0.023)) == p.steps([0.011, 0.017, 0.023])
    assert TimePeriod(interval=7) == p and hash(p) == hash(TimePeriod(interval=7))


def test_from_auto_takes_autointervals_h_for_the_fastest_worker():
    policy = TimePeriod.from_auto(0.54, [0.1, 0.05, 0.2], target_ratio=0.5, max_interval=64)
    assert policy.interval == first_iteration_interval(0.54, 0.05, 0.5, 64) == 22
    assert policy.steps([0.1, 0.05, 0.2]) == (11, 22, 5)
    assert TimePeriod.from_auto(10.0, [0.001], max_interval=8).interval == 8


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda: TimePeriod(interval=0), "TimePeriod(interval=...): must be an integer >= 1, got 0"),
        (lambda: TimePeriod(min_steps=True), "TimePeriod(min_steps=...): must be an integer >= 1"),
        (lambda: TimePeriod(min_steps=3, max_steps=2), "TimePeriod(max_steps=...): must be >= min_steps"),
        (lambda: TimePeriod(budget=math.inf), "TimePeriod(budget=...): must be a finite number"),
        (lambda: TimePeriod(tolerance=-0.1), "TimePeriod(tolerance=...): must be a finite fraction >= 0"),
        (lambda: TimePeriod(tolerance=math.nan), "TimePeriod(tolerance=...): must be a finite fraction"),
        (lambda: TimeBudget(tolerance="x"), "TimeBudget(tolerance=...): must be a finite fraction >= 0"),
        (lambda: TimePeriod().steps([]), "step_times: must be a non-empty list"),
        (
            lambda: TimePeriod().steps([0.1, 0.0]),
            "step_times[1]: must be a finite number of seconds > 0, got 0.0",
        ),
        (lambda: TimePeriod().steps([0.1, "x"]), "step_times[1]: must be a finite number of seconds > 0"),
        (lambda: TimePeriod().steps(0.1), "step_times: must be a non-empty list"),
        (lambda: TimePeriod.from_auto(-1.0, [0.1]), "t_comm_s must be a finite non-negative"),
    ],
)
def test_bad_input_is_one_line_naming_where(call, message):
    with pytest.raises(InputError) as e:
        call()
    assert str(e.value).startswith(message) and "\n" not in str(e.value)
