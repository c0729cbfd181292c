import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tf_commopt.core.tfconfig import parse_tf_config, tf_config_from_env
from tf_commopt.errors import InputError

GOOD = {
    "cluster": {"chief": ["h:1"], "worker": ["h:2", "h:3"], "ps": ["h:4"]},
    "task": {"type": "ps", "index": 0},
}


def test_good_config():
    c = parse_tf_config(json.dumps(GOOD))
    assert (c.num_workers, c.num_ps, c.has_chief, c.is_chief, c.address) == (2, 1, True, False, "h:4")
    assert tf_config_from_env({}) is None
    assert tf_config_from_env({"TF_CONFIG": json.dumps(GOOD)}).task_type == "ps"


@pytest.mark.parametrize(
    "mutate,match",
    [
        (lambda d: d.pop("task"), "missing 'task'"),
        (lambda d: d["task"].update(index=5), "task.index 5 out of range"),
        (lambda d: d["task"].update(index="a"), "not an integer"),
        (lambda d: d["task"].update(type="boss"), "task.type 'boss'"),
        (lambda d: d["cluster"].update(worker=["h:2", "h:2"]), "duplicate address 'h:2'"),
        (lambda d: d["cluster"].update(boss=["h:9"]), "unknown task type 'boss'"),
        (lambda d: d["cluster"].update(worker=["nohostport"]), "not 'host:port'"),
        (lambda d: d["cluster"].update(worker=["h:99999"]), "no valid port"),
        (lambda d: d["cluster"].update(chief=["h:1", "h:5"]), "exactly one task"),
        (lambda d: d.update(cluster={}), "missing or empty 'cluster'"),
    ],
)
def test_bad_configs_give_one_line(mutate, match):
    d = json.loads(json.dumps(GOOD))
    mutate(d)
    with pytest.raises(InputError, match=match) as e:
        parse_tf_config(json.dumps(d))
    assert "\n" not in str(e.value) and str(e.value).startswith("TF_CONFIG: ")


def test_task_type_missing_from_cluster():
    with pytest.raises(InputError, match="no entry in cluster"):
        parse_tf_config('{"cluster": {"worker": ["h:1"]}, "task": {"type": "ps", "index": 0}}')


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.text(max_size=80),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.text(max_size=8),
            lambda c: (
                st.lists(c, max_size=3)
                | st.dictionaries(
                    st.sampled_from(["cluster", "task", "type", "index", "worker", "ps", "chief", "x"]),
                    c,
                    max_size=4,
                )
            ),
            max_leaves=12,
        ).map(json.dumps),
    )
)
def test_fuzz_returns_config_or_our_error(text):
    try:
        c = parse_tf_config(text)
    except InputError as e:
        assert "\n" not in str(e)
    else:
        assert c.address in c.cluster[c.task_type]
