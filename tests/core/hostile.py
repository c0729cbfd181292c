"""What the hostile-input tests share: the one-line error check, file writing, PipeDream node lines and
a hypothesis strategy that mutates one value of a JSON document (test helpers, not collected)."""

import json

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from tf_commopt.errors import TfCommoptError

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


def one_line_error(fn, *args, **kwargs):
    """Call fn; return its value, or None after checking a raised error is ours and one line."""
    try:
        return fn(*args, **kwargs)
    except TfCommoptError as e:
        msg = str(e)
        assert msg and "\n" not in msg and "\r" not in msg, repr(msg)
        return None


def write_file(tmp_path, name, data):
    p = tmp_path / name
    (p.write_bytes if isinstance(data, bytes) else p.write_text)(data)
    return str(p)


def node_line(name, f="1.0", b="2.0", a="8.0", p="4.0", label="Linear(4)"):
    return (
        f"{name} -- {label} -- forward_compute_time={f}, backward_compute_time={b}, "
        f"activation_size={a}, parameter_size={p}"
    )


GOOD_PD = "\n".join([node_line("n0"), node_line("n1"), node_line("n2"), "\tn0 -- n1", "\tn1 -- n2"]) + "\n"


json_leaf = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**20), 10**400), st.floats(), st.text(max_size=6)
)
json_any = st.recursive(
    json_leaf,
    lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(st.text(max_size=5), c, max_size=3)),
    max_leaves=8,
)


def mutations(d):
    """Hypothesis strategy: d with one value replaced (or deleted) at a random path."""
    paths = []

    def walk(x, p):
        paths.append(p)
        if isinstance(x, dict):
            for k, v in x.items():
                walk(v, p + (k,))
        elif isinstance(x, list):
            for i, v in enumerate(x):
                walk(v, p + (i,))

    walk(d, ())

    def apply(path, value, delete):
        out = json.loads(json.dumps(d))
        if not path:
            return value
        parent = out
        for k in path[:-1]:
            parent = parent[k]
        if delete:
            del parent[path[-1]]
        else:
            parent[path[-1]] = value
        return out

    return st.builds(apply, st.sampled_from(paths[1:] + [()]), json_any, st.booleans())
