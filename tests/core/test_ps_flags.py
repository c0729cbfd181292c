"""What a parameter-server cluster refuses from the runner's flags: one line naming the flag."""

import pytest

from experiments.config import Config
from experiments.ps_train import _interval_and_correction
from tf_commopt.errors import InputError


@pytest.mark.parametrize(
    "field,value",
    [
        ("warmup_steps", 2),
        ("overlap", True),
        ("average_optimizer_state", True),
        ("step_times", True),
        ("eval_every", 5),
        ("backup_every", 3),
    ],
)
def test_a_flag_without_meaning_on_a_ps_cluster_is_refused_by_name(field, value):
    with pytest.raises(InputError) as e:
        _interval_and_correction(Config(strategy="skip_correct", **{field: value}))
    assert e.value.where == f"--{field}" and "\n" not in str(e.value)


def test_the_plain_run_is_accepted():
    assert _interval_and_correction(Config(strategy="skip_correct", interval=8)) == (8, "auto")
