"""The launcher's port picker: outside the kernel's range for outgoing connections, never handed out twice
while held (across launchers on one machine), and robust to a damaged registry."""

import json
import pathlib
import socket
import tempfile

from tf_commopt.cluster.layout import _ephemeral_range, _registry_path, pick_ports


def _private_registry(monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return pathlib.Path(_registry_path())


def test_ports_are_free_distinct_and_outside_the_ephemeral_range(monkeypatch, tmp_path):
    _private_registry(monkeypatch, tmp_path)
    lo, hi = _ephemeral_range()
    ports = pick_ports(64)
    assert len(set(ports)) == 64 and not any(lo <= p <= hi for p in ports)
    for p in ports[:8]:
        with socket.socket() as s:
            s.bind(("", p))


def test_held_ports_are_not_handed_out_again_and_expire(monkeypatch, tmp_path):
    reg = _private_registry(monkeypatch, tmp_path)
    first = pick_ports(300)
    second = pick_ports(300)  # without the registry two draws of 300 from ~12k ports almost surely meet
    assert not set(first) & set(second)
    assert set(json.loads(reg.read_text())) == {str(p) for p in first + second}
    pick_ports(1, hold_s=0.0)  # everything older than hold_s is dropped from the registry
    assert len(json.loads(reg.read_text())) == 1


def test_a_damaged_registry_is_started_again(monkeypatch, tmp_path):
    reg = _private_registry(monkeypatch, tmp_path)
    reg.write_text("{not json")
    assert len(pick_ports(3)) == 3 and len(json.loads(reg.read_text())) == 3
    reg.write_text("[1, 2]")
    assert len(pick_ports(2)) == 2 and len(json.loads(reg.read_text())) == 2


def test_none_asked_none_given_and_an_unwritable_registry_still_gives_ports(monkeypatch, tmp_path):
    _private_registry(monkeypatch, tmp_path)
    assert pick_ports(0) == []
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "missing"))  # the lock file cannot be created
    lo, hi = _ephemeral_range()
    ports = pick_ports(3)
    assert len(set(ports)) == 3 and not any(lo <= p <= hi for p in ports)
