import os
import stat

import pytest

from ledgerlm.workspace import (
    MANIFEST,
    Workspace,
    atomic_write_json,
    atomic_write_text,
    content_hash,
    read_json,
)


def test_content_hash_ignores_key_order():
    assert content_hash({"a": 1, "b": 2}) == content_hash({"b": 2, "a": 1})
    assert content_hash({"a": 1}) != content_hash({"a": 2})


def test_atomic_write_leaves_no_temporary(tmp_path):
    target = tmp_path / "x" / "out.json"
    atomic_write_json(target, {"k": 1})
    assert read_json(target) == {"k": 1}
    assert [p.name for p in target.parent.iterdir()] == ["out.json"]


def test_atomic_write_gives_the_usual_permissions(tmp_path):
    old = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "report.html", "<p>")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "report.html").stat().st_mode) == 0o644


def test_building_publishes_only_when_complete(tmp_path):
    ws = Workspace(tmp_path)
    with ws.building("data", "v1") as tmp:
        (tmp / "shard").write_text("x")
        assert not ws.has_version("data", "v1")
        atomic_write_json(tmp / MANIFEST, {"version": "v1"})
    assert ws.has_version("data", "v1")
    assert ws.versions("data") == ["v1"]
    assert ws.resolve_version("data", "v") == "v1"


def test_failed_build_leaves_nothing(tmp_path):
    ws = Workspace(tmp_path)
    with pytest.raises(RuntimeError, match="boom"), ws.building("tokens", "v2") as tmp:
        atomic_write_text(tmp / "half", "written")
        raise RuntimeError("boom")
    assert not ws.has_version("tokens", "v2")
    assert list((tmp_path / "tokens").iterdir()) == []


def test_build_without_manifest_is_refused(tmp_path):
    ws = Workspace(tmp_path)
    with pytest.raises(RuntimeError, match="without a manifest"), ws.building("data", "v3"):
        pass
    assert list((tmp_path / "data").iterdir()) == []


def test_unknown_version_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no data version matches 'zz'"):
        Workspace(tmp_path).resolve_version("data", "zz")
