"""restored_environ / restore_environ put os.environ back: changed, added and removed variables."""

import os

from hybridflow.utils.environ import restore_environ, restored_environ, snapshot_environ


def test_whole_environment_comes_back(monkeypatch):
    monkeypatch.setenv("HF_TEST_KEPT", "before")
    monkeypatch.delenv("HF_TEST_ADDED", raising=False)
    with restored_environ():
        os.environ["HF_TEST_KEPT"] = "changed"
        os.environ["HF_TEST_ADDED"] = "new"
        del os.environ["HF_TEST_KEPT"]
    assert os.environ["HF_TEST_KEPT"] == "before" and "HF_TEST_ADDED" not in os.environ


def test_only_the_named_keys_come_back(monkeypatch):
    monkeypatch.delenv("HF_TEST_NAMED", raising=False)
    monkeypatch.setenv("HF_TEST_OTHER", "x")
    snap = snapshot_environ(["HF_TEST_NAMED", "HF_TEST_OTHER"])
    assert snap == {"HF_TEST_NAMED": None, "HF_TEST_OTHER": "x"}
    os.environ["HF_TEST_NAMED"] = "set"
    os.environ["HF_TEST_OTHER"] = "y"
    os.environ["HF_TEST_UNNAMED"] = "stays"
    try:
        restore_environ(snap)
        assert "HF_TEST_NAMED" not in os.environ and os.environ["HF_TEST_OTHER"] == "x"
        assert os.environ["HF_TEST_UNNAMED"] == "stays"  # not in the snapshot, not dropped
    finally:
        os.environ.pop("HF_TEST_UNNAMED", None)
