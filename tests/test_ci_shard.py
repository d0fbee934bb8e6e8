"""CI's split of the slow tier (tests/ci_shard.py): every slow test runs in exactly one pass, the fast tier and
the Python-sensitive files in all, and a mistyped share is an error rather than a quiet empty run."""

from __future__ import annotations

import pytest
from ci_shard import EVERY_PYTHON, SHARD_ENV, deselect_other_shards, parse_shard


class _Item:
    def __init__(self, path: str, slow: bool):
        self.fspath = f"/checkout/tests/{path}"
        self.slow = slow

    def get_closest_marker(self, name):
        return object() if name == "slow" and self.slow else None


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


def _suite() -> list[_Item]:
    items = []
    for index in range(40):
        folder = "engine" if index % 2 else "app"
        items += [_Item(f"{folder}/test_slow_{index}.py", slow=True) for _ in range(3)]
        items.append(_Item(f"{folder}/test_fast_{index}.py", slow=False))
    items += [_Item(path, slow=True) for path in LONG]
    items += [_Item(path, slow=True) for path in EVERY_PYTHON]
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
def test_each_slow_test_runs_in_exactly_one_pass_and_the_rest_in_all(count, monkeypatch):
    shares = [[(item.fspath, item.slow) for item in _share(k, count, monkeypatch)] for k in range(count)]
    every = [(i.fspath, i.slow) for i in _suite()]
    for entry in set(every):
        path, slow = entry
        runs_in = sum(entry in share for share in shares)
        if not slow or any(path.endswith("/tests/" + name) for name in EVERY_PYTHON):
            assert runs_in == count, path
        else:
            assert runs_in == 1, path
    # the long files are dealt out in turn, so no pass gets all of them
    for share in shares:
        long_here = {p for p, _ in share if any(p.endswith(name) for name in LONG[1:])}
        assert 0 < len(long_here) < len(LONG) - 1


def test_a_files_tests_stay_together(monkeypatch):
    kept = _share(0, 2, monkeypatch)
    kept_paths = {i.fspath for i in kept if i.slow}
    dropped_paths = {i.fspath for i in _suite() if i.slow} - kept_paths
    assert kept_paths and dropped_paths


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
