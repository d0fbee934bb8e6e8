"""CI's split of the model work (tests/ci_shard.py): every slow or model test runs in exactly one pass, the fast
tier's other tests and the every_python ones in all, and a mistyped share is an error rather than a quiet empty
run."""

from __future__ import annotations

import pytest
from ci_shard import EVERY_PYTHON_MARKER, SHARD_ENV, deselect_other_shards, parse_shard


class _Item:
    def __init__(self, path: str, *markers: str):
        self.fspath = f"/checkout/tests/{path}"
        self.markers = frozenset(markers)

    def get_closest_marker(self, name):
        return object() if name in self.markers else None

    @property
    def key(self) -> tuple[str, frozenset[str]]:
        return self.fspath, self.markers


class _Config:
    def __init__(self):
        self.deselected: list[_Item] = []
        config = self

        class _Hook:
            @staticmethod
            def pytest_deselected(items):
                config.deselected.extend(items)

        self.hook = _Hook()


LONG = ("engine/test_torch_cache.py", "engine/test_a_long.py", "app/test_b_long.py", "engine/test_c_long.py")
COMPILED = "engine/test_torch_cache.py"


def _suite() -> list[_Item]:
    items = []
    for index in range(40):
        folder = "engine" if index % 2 else "app"
        items += [_Item(f"{folder}/test_slow_{index}.py", "slow") for _ in range(3)]
        items += [_Item(f"{folder}/test_model_{index}.py", "model") for _ in range(2)]
        items.append(_Item(f"{folder}/test_model_{index}.py"))  # the same file's unit test
        items.append(_Item(f"{folder}/test_fast_{index}.py"))
    items += [_Item(path, "slow", "model") for path in LONG]
    items.append(_Item(COMPILED, "slow", EVERY_PYTHON_MARKER))
    return items


def _share(k: int, n: int, monkeypatch) -> list[_Item]:
    monkeypatch.setenv(SHARD_ENV, f"{k}/{n}")
    items = _suite()
    config = _Config()
    deselect_other_shards(config, items, LONG)
    assert {id(i) for i in items}.isdisjoint(id(i) for i in config.deselected)
    assert len(items) + len(config.deselected) == len(_suite())
    return items


@pytest.mark.parametrize("count", [2, 3])
def test_each_slow_or_model_test_runs_in_exactly_one_pass_and_the_rest_in_all(count, monkeypatch):
    shares = [[item.key for item in _share(k, count, monkeypatch)] for k in range(count)]
    for key in {i.key for i in _suite()}:
        path, markers = key
        runs_in = sum(key in share for share in shares)
        if EVERY_PYTHON_MARKER in markers or not markers & {"slow", "model"}:
            assert runs_in == count, key
        else:
            assert runs_in == 1, key
    # the long files are dealt out in turn, so no pass gets all of them
    for share in shares:
        long_here = {p for p, m in share if "slow" in m and any(p.endswith(name) for name in LONG[1:])}
        assert 0 < len(long_here) < len(LONG) - 1


def test_the_compiled_build_runs_in_every_pass_and_its_files_other_slow_tests_in_one(monkeypatch):
    for k in range(2):
        kept = _share(k, 2, monkeypatch)
        assert any(i.fspath.endswith(COMPILED) and EVERY_PYTHON_MARKER in i.markers for i in kept)
    with_other = [k for k in range(2) if any(i.fspath.endswith(COMPILED) and i.markers == {"slow", "model"}
                                             for i in _share(k, 2, monkeypatch))]
    assert len(with_other) == 1


def test_a_files_tests_stay_together(monkeypatch):
    kept = _share(0, 2, monkeypatch)
    split = {i.fspath for i in _suite() if i.markers & {"slow", "model"}}
    kept_paths = {i.fspath for i in kept if i.markers & {"slow", "model"}}
    assert kept_paths and split - kept_paths
    kept_keys = [i.key for i in kept]
    for item in _suite():  # a kept file keeps every one of its split tests
        if item.fspath in kept_paths and item.markers & {"slow", "model"}:
            assert item.key in kept_keys


def test_no_share_set_runs_everything(monkeypatch):
    monkeypatch.delenv(SHARD_ENV, raising=False)
    items = _suite()
    config = _Config()
    deselect_other_shards(config, items, LONG)
    assert len(items) == len(_suite()) and not config.deselected


@pytest.mark.parametrize("text", ["x", "1", "2/2", "-1/2", "0/0", "a/b", "0/2/3"])
def test_a_mistyped_share_is_said(text):
    with pytest.raises(ValueError, match=SHARD_ENV):
        parse_shard(text)


def test_shares_parse():
    assert parse_shard("1/2") == (1, 2)
    assert parse_shard("") is None and parse_shard(None) is None
