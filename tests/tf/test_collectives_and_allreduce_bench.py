"""tf_commopt.distribute.collectives (the measured recommendation) and experiments.allreduce_bench's input errors."""

import pytest

from tests.inprocess import run_module, runner_imports


def test_recommended_options_are_one_fused_collective_with_tfs_algorithm_choice():
    import tensorflow as tf
    from tensorflow.python.distribute import collective_util

    from tf_commopt.distribute.collectives import recommended_chunks, recommended_options

    for payload in (0, 407_080, 40_000_000, 10**10):
        opts = recommended_options(payload)
        # CommunicationOptions(...) builds collective_util.Options, what reduce_to(options=...) takes
        assert isinstance(opts, collective_util.Options)
        assert opts.bytes_per_pack == 0 and opts.timeout_seconds is None
        assert opts.implementation == tf.distribute.experimental.CommunicationImplementation.AUTO
        assert recommended_chunks(payload) == 1


@pytest.mark.parametrize("bad", [-1, 1.5, "4MB", None, True])
def test_recommended_options_rejects_bad_payloads(bad):
    from tf_commopt.distribute.collectives import recommended_chunks, recommended_options
    from tf_commopt.errors import InputError

    for fn in (recommended_options, recommended_chunks):
        with pytest.raises(InputError, match="payload_bytes must be an integer >= 0"):
            fn(bad)


def test_setting_parser():
    with runner_imports():  # the bench's absl flags (--workers, ...) apart from other runners'
        from experiments.allreduce_bench import parse_setting, ring_bound_s

        assert parse_setting("auto:64K:8") == {
            "name": "auto:64K:8",
            "impl": "auto",
            "bytes_per_pack": 65536,
            "chunks": 8,
        }
        assert parse_setting("RING:0:1")["impl"] == "ring"
        # 2(N-1) B 8 / R on a shared segment; 2(N-1)/N B 8 / R per link on a switch
        assert ring_bound_s(40e6, 4, 1000, "shared") == pytest.approx(1.92)
        assert ring_bound_s(407_080, 2, 10, "switch") == pytest.approx(0.325664)


@pytest.mark.parametrize(
    "args, where",
    [
        (["--settings=nccl:0:1"], "--settings"),
        (["--settings=auto:4Q:8"], "--settings"),
        (["--settings=auto:0:0"], "--settings"),
        (["--settings=auto:0"], "--settings"),
        (["--workers=1"], "--workers"),
        (["--workers=two"], "--workers"),
        (["--topology=ring"], "--topology"),
        (["--bandwidth_mbit=-5"], "--bandwidth_mbit"),
        (["--megabytes=0"], "--megabytes"),
        (["--repeats=0"], "--repeats"),
        (["--idle_s=-1"], "--idle_s"),
        (["--tbf_burst=-1"], "--tbf_burst"),
        (["--no_such_flag=1"], "no_such_flag"),
        (["stray"], "unexpected argument"),
    ],
)
def test_bad_flags_one_line_exit_2(args, where):
    r = run_module("experiments.allreduce_bench", args)  # in process, TensorFlow blocked meanwhile
    lines = r.err.strip().splitlines()
    assert r.code == 2, r.err
    assert len(lines) == 1 and "allreduce_bench: error: " in lines[0] and where in lines[0], r.err
    assert "Traceback" not in r.err and r.out == ""
