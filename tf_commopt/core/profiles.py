"""Read and write cost-graph profiles: PipeDream ``graph.txt`` and our lossless JSON.

Example:
    >>> from tf_commopt.core.profiles import load_profile, bundled_profile_path
    >>> g = load_profile(bundled_profile_path("pipedream/vgg16"))
    >>> len(g), round(g.total_ms(), 1) > 0
    (41, True)
    >>> h = load_profile("h200/resnet50")          # fp32 defaults + kinds fp32, tf32, bf16
    >>> sorted(h.kinds)
    ['bf16', 'fp32', 'tf32']

PipeDream format (msr-fiddle/pipedream ``graph/graph.py``), one line per node then one per edge::

    node77 -- BatchNorm2d(512) -- forward_compute_time=1.236, backward_compute_time=1.442, activation_size=205520896.000, parameter_size=4096.000
    \tnode76 -- node77

``activation_size`` may be a list ``[a; b; c]`` (a node with several outputs): we store its sum (as
PipeDream's optimizer does), so writing such a file back gives the summed value. Our JSON format
(``tf_commopt.CostGraph/1``) keeps everything: node order, labels, edges and per-kind costs; floats
are written with ``repr`` so a round trip is exact. Every error names ``file:line``.
"""

from __future__ import annotations

import json
import os
import re
from typing import Dict, List, Optional, Tuple

from tf_commopt.core.costgraph import CostGraph, Node
from tf_commopt.errors import GraphError, InputError

__all__ = [
    "load_profile",
    "read_pipedream",
    "write_pipedream",
    "read_json",
    "write_json",
    "bundled_profile_path",
    "bundled_profiles",
    "H200_MODES",
]

JSON_FORMAT = "tf_commopt.CostGraph/1"
H200_MODES = ("fp32", "tf32", "bf16")
_DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "profiles")
_KEYS = ("forward_compute_time", "backward_compute_time", "activation_size", "parameter_size")


# ----------------------------------------------------------------------------- bundled
def bundled_profiles() -> List[str]:
    """Names accepted by :func:`bundled_profile_path`, e.g. ``pipedream/resnet50``, ``h200/vgg16.bf16``."""
    out = []
    for sub in ("pipedream", "h200"):
        d = os.path.join(_DATA, sub)
        if not os.path.isdir(d):
            continue
        for f in sorted(os.listdir(d)):
            if f.endswith(".graph.txt"):
                stem = f[: -len(".graph.txt")]
                out.append(f"{sub}/{stem[:-4] if stem.endswith('.b32') else stem}")
    return out


def bundled_profile_path(name: str) -> str:
    """Path of a bundled profile: ``"pipedream/resnet50"``, ``"h200/resnet50.fp32"`` (``.b32`` optional).

    ``"h200/resnet50"`` (no mode) gives the fp32 file. Raises InputError listing the known names.
    """
    sub, _, rest = str(name).partition("/")
    candidates = []
    if sub == "pipedream":
        candidates = [f"{rest}.graph.txt"]
    elif sub == "h200":
        base = rest if any(rest.endswith(f".{m}") or f".{m}." in rest for m in H200_MODES) else f"{rest}.fp32"
        candidates = [f"{base}.graph.txt", f"{base}.b32.graph.txt"]
    for c in candidates:
        p = os.path.join(_DATA, sub, c)
        if rest and os.path.isfile(p):
            return p
    raise InputError(f"unknown bundled profile {name!r}; known: {', '.join(bundled_profiles())}")


def _h200_all_kinds(model: str) -> CostGraph:
    graphs = {m: read_pipedream(bundled_profile_path(f"h200/{model}.{m}")) for m in H200_MODES}
    g = graphs["fp32"]
    for m, gm in graphs.items():
        if set(gm.nodes) != set(g.nodes):
            raise GraphError(f"h200/{model}.{m} has other node ids than fp32")
        g.add_kind(m, {n: (gm[n].forward_ms, gm[n].backward_ms) for n in gm.nodes})
    g.name = f"h200/{model}"
    return g


def load_profile(path: str) -> CostGraph:
    """Load a CostGraph from a file (PipeDream graph.txt or our JSON, auto-detected) or a bundled name.

    A bundled ``h200/<model>`` without a mode loads fp32 as default costs plus kinds fp32/tf32/bf16.
    """
    if not os.path.exists(path):
        if (
            isinstance(path, str)
            and path.startswith("h200/")
            and not any(path.endswith(f".{m}") for m in H200_MODES)
        ):
            return _h200_all_kinds(path[len("h200/") :])
        if isinstance(path, str) and path.split("/")[0] in ("pipedream", "h200"):
            path = bundled_profile_path(path)
        else:
            raise InputError("no such file", where=str(path))
    try:
        with open(path, encoding="utf-8") as f:
            head = f.read(4096).lstrip()
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"cannot read profile: {e}", where=path) from None
    if head.startswith("{"):
        return read_json(path)
    return read_pipedream(path)


# ----------------------------------------------------------------------------- PipeDream
def _parse_size(text: str, where: str) -> float:
    t = text.strip()
    if t.startswith("[") and t.endswith("]"):
        parts = [p for p in t[1:-1].split(";") if p.strip()]
        return float(sum(_parse_float(p, where) for p in parts))
    return _parse_float(t, where)


def _parse_float(text: str, where: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise GraphError(f"not a number: {text.strip()!r}", where=where) from None


def read_pipedream(path: str) -> CostGraph:
    """Read a PipeDream ``graph.txt`` profile. Errors name ``path:line``."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"cannot read profile: {e}", where=path) from None
    nodes: List[Node] = []
    edges: List[Tuple[str, str]] = []
    sources: Dict[str, str] = {}
    for i, raw in enumerate(lines, 1):
        where = f"{path}:{i}"
        if not raw.strip():
            continue
        if raw[0] in "\t ":
            parts = raw.strip().split(" -- ")
            if len(parts) != 2 or not all(p.strip() for p in parts):
                raise GraphError(f"edge line must be 'nodeA -- nodeB', got {raw.strip()!r}", where=where)
            a, b = parts[0].strip(), parts[1].strip()
            edges.append((a, b))
            sources.setdefault(f"{a}->{b}", where)
            continue
        first = raw.find(" -- ")
        last = raw.rfind(" -- ")
        if first < 0 or last == first:
            raise GraphError(
                f"node line must be 'name -- description -- key=value, ...', got {raw[:60]!r}", where=where
            )
        name, label, attrs = raw[:first].strip(), raw[first + 4 : last].strip(), raw[last + 4 :]
        vals: Dict[str, float] = {}
        for item in re.split(r",\s*(?=[A-Za-z_]+=)", attrs.strip()):
            k, eq, v = item.partition("=")
            k = k.strip()
            if not eq:
                raise GraphError(f"expected key=value, got {item.strip()!r}", where=where)
            if k in vals:
                raise GraphError(f"duplicate key {k!r}", where=where)
            vals[k] = _parse_size(v, f"{where}: {k}")
        missing = [k for k in _KEYS if k not in vals]
        if missing:
            raise GraphError(f"node {name!r} lacks {', '.join(missing)}", where=where)
        if name in sources:
            raise GraphError(f"duplicate node name {name!r} (first at {sources[name]})", where=where)
        sources[name] = where
        nodes.append(
            Node(
                name,
                vals["forward_compute_time"],
                vals["backward_compute_time"],
                param_bytes=vals["parameter_size"],
                activation_bytes=vals["activation_size"],
                label=label,
            )
        )
    if not nodes:
        raise GraphError("empty graph: no node lines", where=path)
    name = os.path.basename(path)
    for suffix in (".graph.txt", ".txt"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    return CostGraph(nodes, edges, name=name, sources=sources)


def write_pipedream(graph: CostGraph, path: str, kind: Optional[str] = None) -> None:
    """Write ``graph`` as a PipeDream ``graph.txt`` (costs of device kind ``kind`` if given).

    Floats are written with ``repr`` so reading back gives the same numbers. Labels lose newlines
    and `` -- `` separators.
    """
    out = []
    for n in graph.nodes.values():
        label = " ".join((n.label or "-").split()).replace(" -- ", " - ")
        out.append(
            f"{n.name} -- {label} -- forward_compute_time={graph.forward_ms(n.name, kind)!r}, "
            f"backward_compute_time={graph.backward_ms(n.name, kind)!r}, "
            f"activation_size={float(n.activation_bytes)!r}, parameter_size={float(n.param_bytes)!r}"
        )
    for a, b in graph.edges:
        out.append(f"\t{a} -- {b}")
    _atomic_write(path, "\n".join(out) + "\n")


# ----------------------------------------------------------------------------- JSON
def write_json(graph: CostGraph, path: str) -> None:
    """Write ``graph`` in our lossless JSON format (one node / edge / kind entry per line)."""
    lines = [
        "{",
        f' "format": {json.dumps(JSON_FORMAT)},',
        f' "name": {json.dumps(graph.name)},',
        ' "nodes": [',
    ]
    nodes = list(graph.nodes.values())
    for i, n in enumerate(nodes):
        d = {
            "name": n.name,
            "forward_ms": n.forward_ms,
            "backward_ms": n.backward_ms,
            "param_bytes": n.param_bytes,
            "activation_bytes": n.activation_bytes,
            "label": n.label,
        }
        lines.append("  " + json.dumps(d) + ("," if i < len(nodes) - 1 else ""))
    lines.append(" ],")
    lines.append(' "edges": [')
    edges = list(graph.edges)
    for i, e in enumerate(edges):
        lines.append("  " + json.dumps(list(e)) + ("," if i < len(edges) - 1 else ""))
    lines.append(" ],")
    lines.append(' "kinds": {')
    kinds = graph.kinds
    for i, k in enumerate(kinds):
        table = {n: [graph.forward_ms(n, k), graph.backward_ms(n, k)] for n in graph.nodes}
        lines.append(f"  {json.dumps(k)}: " + json.dumps(table) + ("," if i < len(kinds) - 1 else ""))
    lines.append(" }")
    lines.append("}")
    _atomic_write(path, "\n".join(lines) + "\n")


class _JsonSource:
    """A JSON profile's text: parsed, and searched for the line a node, edge or key is on."""

    def __init__(self, path: str):
        self.path = path
        try:
            with open(path, encoding="utf-8") as f:
                self.text = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise InputError(f"cannot read profile: {e}", where=path) from None
        self.lines = self.text.splitlines()

    def parse(self) -> dict:
        """The top-level object, checked to carry our format tag."""
        path = self.path
        try:
            d = json.loads(self.text)
        except json.JSONDecodeError as e:
            raise GraphError(
                f"invalid JSON (column {e.colno}): {e.msg}", where=f"{path}:{e.lineno}"
            ) from None
        except RecursionError:
            raise GraphError("invalid JSON: nested too deeply", where=path) from None
        if not isinstance(d, dict):
            raise GraphError("expected a JSON object", where=f"{path}:1")
        if d.get("format") != JSON_FORMAT:
            raise GraphError(f"format must be {JSON_FORMAT!r}, got {d.get('format')!r}", where=f"{path}:1")
        return d

    def where(self, needle: str) -> str:
        """``path:line`` of the first line containing ``needle`` (line 1 if none does)."""
        for i, ln in enumerate(self.lines, 1):
            if needle in ln:
                return f"{self.path}:{i}"
        return f"{self.path}:1"


_NODE_FIELDS = {"name", "forward_ms", "backward_ms", "param_bytes", "activation_bytes", "label"}


def _json_nodes(src: _JsonSource, raw_nodes: object) -> Tuple[List[Node], Dict[str, str]]:
    """The nodes of a JSON profile and where each is (``name -> path:line``)."""
    if not isinstance(raw_nodes, list):
        raise GraphError("'nodes' must be a list", where=src.where('"nodes"'))
    if not raw_nodes:
        raise GraphError("empty graph: no nodes", where=src.where('"nodes"'))
    nodes, sources = [], {}
    for i, rn in enumerate(raw_nodes):
        name = rn.get("name") if isinstance(rn, dict) else None
        where = src.where(json.dumps({"name": name})[:-1]) if isinstance(name, str) else f"{src.path}:1"
        if not isinstance(rn, dict) or not isinstance(name, str):
            raise GraphError(f"nodes[{i}] must be an object with a string 'name'", where=where)
        unknown = set(rn) - _NODE_FIELDS
        if unknown:
            raise GraphError(f"node {name!r}: unknown field(s) {sorted(unknown)}", where=where)
        for k in ("forward_ms", "backward_ms"):
            if k not in rn:
                raise GraphError(f"node {name!r} lacks {k!r}", where=where)
        if name in sources:
            raise GraphError(f"duplicate node name {name!r}", where=where)
        sources[name] = where
        nodes.append(
            Node(
                name,
                rn["forward_ms"],
                rn["backward_ms"],
                rn.get("param_bytes", 0.0),
                rn.get("activation_bytes", 0.0),
                str(rn.get("label", "")),
            )
        )
    return nodes, sources


def _json_edges(src: _JsonSource, raw_edges: object, sources: Dict[str, str]) -> List[Tuple[str, str]]:
    """The edges of a JSON profile; adds ``"a->b" -> path:line`` to ``sources``."""
    if not isinstance(raw_edges, list):
        raise GraphError("'edges' must be a list", where=src.where('"edges"'))
    edges = []
    for e in raw_edges:
        if not (isinstance(e, list) and len(e) == 2 and all(isinstance(x, str) for x in e)):
            raise GraphError(f"edge must be [producer, consumer], got {e!r}", where=src.where(json.dumps(e)))
        edges.append((e[0], e[1]))
        sources.setdefault(f"{e[0]}->{e[1]}", src.where(json.dumps(e)))
    return edges


def _json_kinds(src: _JsonSource, kinds: object, g: CostGraph) -> None:
    """Add the per-kind costs of a JSON profile to ``g``."""
    if not isinstance(kinds, dict):
        raise GraphError("'kinds' must be an object", where=src.where('"kinds"'))
    for k, table in kinds.items():
        where = src.where(json.dumps(k) + ":")
        if not isinstance(table, dict):
            raise GraphError(f"kind {k!r} must map node -> [forward_ms, backward_ms]", where=where)
        costs = {}
        for n, fb in table.items():
            if not (isinstance(fb, list) and len(fb) == 2):
                raise GraphError(f"kind {k!r} node {n!r}: expected [forward_ms, backward_ms]", where=where)
            costs[n] = (fb[0], fb[1])
        try:
            g.add_kind(k, costs)
        except GraphError as e:
            raise GraphError(str(e), where=where) from None


def read_json(path: str) -> CostGraph:
    """Read our JSON format. Errors name ``path:line`` (of the node or edge where known).

    Example:
        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "g.json")
        >>> write_json(load_profile("pipedream/vgg16"), p)
        >>> len(read_json(p))
        41
    """
    src = _JsonSource(path)
    d = src.parse()
    nodes, sources = _json_nodes(src, d.get("nodes"))
    edges = _json_edges(src, d.get("edges", []), sources)
    g = CostGraph(nodes, edges, name=str(d.get("name", "")), sources=sources)
    _json_kinds(src, d.get("kinds", {}), g)
    return g


def _atomic_write(path: str, text: str) -> None:
    d = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(d, f".{os.path.basename(path)}.tmp{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)
