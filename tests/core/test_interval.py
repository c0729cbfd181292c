import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tf_commopt.core.interval import (
    AdaCommPolicy,
    FirstIterationPolicy,
    GridSearchPolicy,
    TrialResult,
    agree_on_timings,
    first_iteration_interval,
    validate_interval,
)
from tf_commopt.errors import InputError


@pytest.mark.parametrize("bad", [0, -3, 1.5, "x", "", None, True, "0"])
def test_validate_interval_rejects(bad):
    with pytest.raises(InputError, match="interval"):
        validate_interval(bad)


def test_validate_interval_accepts_numeric_strings():
    assert validate_interval("8") == 8


@given(st.floats(0, 100), st.floats(1e-6, 100), st.floats(0.1, 10), st.integers(1, 512))
def test_first_iteration_rule_matches_closed_form(t_comm, t_comp, ratio, cap):
    h = first_iteration_interval(t_comm, t_comp, ratio, cap)
    exact = t_comm / (ratio * t_comp)
    assert 1 <= h <= cap
    if 1 <= exact <= cap - 1:
        assert abs(h - exact) <= 0.5 + 1e-9
    # per-epoch comm/comp ratio under the chosen H is as close to the target as any integer H allows
    if 1.5 <= exact <= cap - 1:

        def err(k):
            return abs(t_comm / k - ratio * t_comp)

        assert err(h) <= min(err(h - 1), err(h + 1)) * (1 + 1e-9) + 1e-12 or abs(h - exact) <= 0.5


def test_first_iteration_policy_is_fixed_after_choice():
    p = FirstIterationPolicy(max_interval=32)
    assert p.interval == 1
    assert p.choose(0.54, 0.05, overhead_s=0.6) == 11
    assert p.choose(10.0, 0.001) == 11  # fixed afterwards
    assert p.overhead_s == pytest.approx(0.6)


def test_agreement_gives_every_worker_the_same_h():
    timings = [(0.5, 0.05), (0.7, 0.04), (0.6, 0.06)]
    mean = agree_on_timings(timings)
    hs = {FirstIterationPolicy().choose(*mean) for _ in timings}
    assert hs == {first_iteration_interval(0.6, 0.05)} == {12}


def test_adacomm_follows_paddle_rule():
    p = AdaCommPolicy(initial_interval=8, max_interval=16)
    assert p.on_sync(4.0, 0.1) == 8
    # ceil(sqrt(0.1 * 1.0 / (0.1 * 4.0) * 8)) = ceil(sqrt(2)) = 2
    assert p.on_sync(1.0, 0.1) == 2
    # lr decayed 10x: ceil(sqrt(0.1*1/(0.01*4)*8)) = ceil(sqrt(20)) = 5
    assert p.on_sync(1.0, 0.01) == 5
    assert p.on_sync(1e9, 0.01) == 16
    assert p.history == [8, 2, 5, 16]
    with pytest.raises(InputError):
        p.on_sync(math.nan, 0.1)


def test_grid_search_picks_best_rate_and_counts_overhead():
    g = GridSearchPolicy(candidates=(1, 2, 4, 8))
    # decrease 0.4 per trial, time shrinks with h until 4 then flat: h=4 and 8 tie on rate -> smaller h
    walls = {1: 2.0, 2: 1.0, 4: 0.5, 8: 0.5}
    h = g.run(lambda k: TrialResult(k, 3.0, 2.6, walls[k]))
    assert h == 4
    assert g.overhead_s == pytest.approx(4.0)


# ---- AutoInterval: the policy object of SkipCorrectStrategy(interval=...) (no TensorFlow) -----------------
def test_auto_interval_defaults_are_the_auto_keywords_defaults():
    from tf_commopt.distribute.interval_policy import AutoInterval, resolve_interval

    p = AutoInterval()
    assert (p.target_ratio, p.max_interval, p.warmup_steps, p.probe_interval, p.measure_syncs) == (
        1.0,
        256,
        2,
        16,
        3,
    )
    assert resolve_interval("auto") == p and resolve_interval("8") == 8


def test_auto_interval_is_frozen():
    import dataclasses

    from tf_commopt.distribute.interval_policy import AutoInterval

    with pytest.raises(dataclasses.FrozenInstanceError):
        AutoInterval().max_interval = 3


@pytest.mark.parametrize(
    "field,bad",
    [
        ("target_ratio", 0),
        ("target_ratio", "x"),
        ("max_interval", 0),
        ("warmup_steps", 0),
        ("probe_interval", 1.5),
        ("measure_syncs", True),
    ],
)
def test_auto_interval_fields_are_checked(field, bad):
    from tf_commopt.distribute.interval_policy import AutoInterval

    with pytest.raises(InputError) as e:
        AutoInterval(**{field: bad})
    assert str(e.value).startswith(f"AutoInterval({field}=...)") and "\n" not in str(e.value)


@given(st.floats(0, 100), st.floats(1e-6, 100), st.floats(0.1, 10), st.integers(1, 512), st.booleans())
def test_auto_interval_choose_is_the_closed_form(t_comm, t_comp, ratio, cap, overlap):
    from tf_commopt.distribute.interval_policy import AutoInterval

    exact = t_comm / (ratio * t_comp)
    want = math.ceil(exact) if overlap else math.floor(exact + 0.5)
    h = AutoInterval(target_ratio=ratio, max_interval=cap).choose(t_comm, t_comp, overlap=overlap)
    # up to float rounding at a half (round) or an integer (ceil) boundary
    assert h == min(max(want, 1), cap) or abs(exact - round(exact)) < 1e-9 or abs(exact % 1 - 0.5) < 1e-9


def test_shorthand_keywords_build_the_policy_and_refuse_to_mix():
    from tf_commopt.distribute.interval_policy import AutoInterval, resolve_interval

    got = resolve_interval("auto", {"max_interval": 8, "auto_probe_interval": 4, "target_ratio": None})
    assert got == AutoInterval(max_interval=8, probe_interval=4)
    assert resolve_interval(4, {"max_interval": 8}) == 4  # unused with a fixed H
    with pytest.raises(InputError, match=r"^S\(interval=...\): give max_interval inside AutoInterval"):
        resolve_interval(AutoInterval(), {"max_interval": 8}, owner="S")
    with pytest.raises(InputError, match=r"^S\(auto_measure_syncs=...\): must be an integer >= 1"):
        resolve_interval("auto", {"auto_measure_syncs": 0}, owner="S")


def test_interval_policy_examples_hold_and_need_no_tensorflow():
    import doctest

    from tests.inprocess import fresh_imports
    from tf_commopt.distribute import interval_policy

    assert doctest.testmod(interval_policy, optionflags=doctest.ELLIPSIS).failed == 0
    with fresh_imports():  # BlockedImport if the policy reaches for TensorFlow
        import tf_commopt.distribute.interval_policy as p

        p.AutoInterval()
