"""Schedules as data: exact literal streams for small cases, weight stashing, validation."""

import pytest

from tf_commopt.core.schedule import (
    AllReduce,
    Average,
    Backward,
    Forward,
    LocalStep,
    OptimizerStep,
    RecvAct,
    RecvGrad,
    Schedule,
    SendAct,
    SendGrad,
    combine,
    data_parallel,
    gpipe,
    local_sgd,
    onef1b,
    weight_versions,
)
from tf_commopt.errors import InputError, PlanError

F, B, U = Forward, Backward, OptimizerStep()


def test_gpipe_2_stages_3_microbatches_literal():
    s = gpipe(2, 3)
    assert s.streams == (
        (
            F(0),
            SendAct(0, 1),
            F(1),
            SendAct(1, 1),
            F(2),
            SendAct(2, 1),
            RecvGrad(2, 1),
            B(2),
            RecvGrad(1, 1),
            B(1),
            RecvGrad(0, 1),
            B(0),
            U,
        ),
        (
            RecvAct(0, 0),
            F(0),
            RecvAct(1, 0),
            F(1),
            RecvAct(2, 0),
            F(2),
            B(2),
            SendGrad(2, 0),
            B(1),
            SendGrad(1, 0),
            B(0),
            SendGrad(0, 0),
            U,
        ),
    )
    assert s.synchronous and s.microbatches_per_minibatch == 3


def test_gpipe_middle_stage_relays_both_ways():
    mid = gpipe(3, 1).streams[1]
    assert mid == (RecvAct(0, 0), F(0), SendAct(0, 2), RecvGrad(0, 2), B(0), SendGrad(0, 0), U)


def test_1f1b_3_stages_4_microbatches_literal():
    s = onef1b(3, 4)
    assert s.compact() == [
        "F0 F1 F2 B0 U F3 B1 U B2 U B3 U",
        "F0 F1 B0 U F2 B1 U F3 B2 U B3 U",
        "F0 B0 U F1 B1 U F2 B2 U F3 B3 U",
    ]
    assert s.streams[1] == (
        RecvAct(0, 0),
        F(0),
        SendAct(0, 2),
        RecvAct(1, 0),
        F(1),
        SendAct(1, 2),
        RecvGrad(0, 2),
        B(0),
        SendGrad(0, 0),
        U,
        RecvAct(2, 0),
        F(2),
        SendAct(2, 2),
        RecvGrad(1, 2),
        B(1),
        SendGrad(1, 0),
        U,
        RecvAct(3, 0),
        F(3),
        SendAct(3, 2),
        RecvGrad(2, 2),
        B(2),
        SendGrad(2, 0),
        U,
        RecvGrad(3, 2),
        B(3),
        SendGrad(3, 0),
        U,
    )
    assert not s.synchronous and s.meta["weight_stashing"]


def test_1f1b_weight_stashing_staleness():
    # stage s runs forward i with version max(0, i - (P - s) + 1): staleness P - s - 1 in steady state
    p, n = 4, 9
    versions = weight_versions(onef1b(p, n))
    for s in range(p):
        assert versions[s] == {i: max(0, i - (p - s) + 1) for i in range(n)}


def test_1f1b_flush_literal():
    s = onef1b(3, 4, flush=True)
    assert s.compact() == [
        "F0 F1 F2 B0 F3 B1 B2 B3 U",
        "F0 F1 B0 F2 B1 F3 B2 B3 U",
        "F0 B0 F1 B1 F2 B2 F3 B3 U",
    ]
    assert s.synchronous and s.microbatches_per_minibatch == 4


def test_1f1b_fewer_microbatches_than_stages():
    assert onef1b(3, 1).compact() == ["F0 B0 U", "F0 B0 U", "F0 B0 U"]


def test_data_parallel_and_local_sgd_literal():
    assert data_parallel(2, 2).streams[1] == (F(0), B(0), F(1), B(1), AllReduce("grads", (0, 1)), U)
    assert local_sgd(3, 2).streams[2] == (
        F(0),
        B(0),
        LocalStep(),
        F(1),
        B(1),
        LocalStep(),
        Average("params", (0, 1, 2)),
    )


def test_combine_renumbers_ranks():
    c = combine(
        "hybrid",
        [gpipe(2, 1, optimizer_step=False)] * 2,
        [
            [AllReduce("s0", (0, 2)), U],
            [AllReduce("s1", (1, 3)), U],
            [AllReduce("s0", (0, 2)), U],
            [AllReduce("s1", (1, 3)), U],
        ],
    )
    assert c.streams[2] == (F(0), SendAct(0, 3), RecvGrad(0, 3), B(0), AllReduce("s0", (0, 2)), U)
    assert c.streams[3][0] == RecvAct(0, 2)


def test_bad_schedules_are_rejected():
    with pytest.raises(PlanError, match="unknown instruction"):
        Schedule("x", 1, ((F(0), "jump"),))
    with pytest.raises(PlanError, match="never receives"):
        Schedule("x", 1, ((F(0), SendAct(0, 1)), (F(0),)))
    with pytest.raises(PlanError, match="never sends"):
        Schedule("x", 1, ((F(0),), (RecvGrad(0, 0), F(0))))
    with pytest.raises(PlanError, match="out of range"):
        Schedule("x", 2, ((F(2),),))
    with pytest.raises(PlanError, match="issued"):
        Schedule("x", 1, ((AllReduce("g", (0, 1)), AllReduce("g", (0, 1))), (AllReduce("g", (0, 1)),)))
    with pytest.raises(PlanError, match="bad peer"):
        Schedule("x", 1, ((SendAct(0, 0),),))
    with pytest.raises(InputError, match="num_stages"):
        gpipe(0, 3)
