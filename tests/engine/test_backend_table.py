"""One table of backends (issue 44 item 3): `engine.backends.select.BACKEND_TABLE` is where a backend's name, how it
opens, what it refuses, whether users see it and its line of help live; every engine reader of those facts reads it.

The test walks the table's rows and checks each reader: the names `load_model` and `choose_backend` take, the CLI's
`--backend` choices and help, its refusals of --offload, --device and llama.cpp's runtime settings, what a planned
load resolves without loading, and the memory estimate's float weights. (The window's pickers: the app's test
tests/app/test_window_reads_the_registry.py.)
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from engine.backends import select
from engine.backends.select import BACKEND_ROWS, BACKEND_TABLE, BACKENDS, BackendRow
from engine.cli.input import UsageError, check_device, check_offload, planned_backend
from engine.cli.main import build_parser
from engine.runtime_settings import RuntimeSettings

ROOT = Path(__file__).resolve().parents[2]


def _backend_action(command: str = "generate") -> argparse.Action:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return next(a for a in sub.choices[command]._actions if "--backend" in a.option_strings)


def test_the_table_has_every_backend_once_and_auto_is_no_row():
    names = [row.name for row in BACKEND_TABLE]
    assert len(names) == len(set(names)) and select.AUTO not in names
    assert BACKENDS == (select.AUTO, *names)
    assert tuple(BACKEND_ROWS) == tuple(names)
    assert select.USER_BACKENDS == select.user_backends()
    assert [n for n in select.USER_BACKENDS if n != select.AUTO] == [r.name for r in BACKEND_TABLE if r.user_facing]
    assert "mock" in names and "mock" not in select.USER_BACKENDS  # the mock is for tests: no user picks it


@pytest.mark.parametrize("row", BACKEND_TABLE, ids=lambda r: r.name)
def test_every_row_names_a_module_that_exists_and_a_line_of_help(row: BackendRow):
    assert row.description and "\n" not in row.description and row.opens in ("spec", "folder", "nothing")
    # Where its class lives, found without importing it (torch, mlx and llama_cpp load only when a model opens).
    relative = Path(*row.module.split("."))
    assert (ROOT / relative.with_suffix(".py")).is_file() or (ROOT / relative / "__init__.py").is_file(), row.module
    assert set(row.runtime_settings) <= set(RuntimeSettings.names())


@pytest.mark.parametrize("row", BACKEND_TABLE, ids=lambda r: r.name)
def test_every_refusal_the_loader_and_the_cli_make_is_the_rows(row: BackendRow):
    assert select.offload_refusal(row.name) == row.offload_refusal
    assert (select.device_refusal(row.name) is None) == row.takes_device == select.checks_torch_device(row.name)
    if not row.takes_device:
        assert row.device_instead in (select.device_refusal(row.name) or "")
    assert select.runtime_refusal(row.name, list(row.runtime_settings)) is None
    refused = [n for n in RuntimeSettings.names() if n not in row.runtime_settings]
    if refused:
        assert refused[0] in (select.runtime_refusal(row.name, refused) or "")
    assert select.weighs_parameters_in_float32(row.name) == row.float32_weights
    assert select.opens_spec_directly(row.name) == (row.opens == "spec")
    assert select.opens_nothing(row.name) == (row.opens == "nothing")
    # The command line says the row's words, as one line of usage error.
    offload = argparse.Namespace(offload="auto")
    if row.offload_refusal is None:
        check_offload(offload, row.name)
    else:
        with pytest.raises(UsageError, match=row.offload_refusal):
            check_offload(offload, row.name)
    device = argparse.Namespace(device="cpu")
    if row.takes_device:
        check_device(device, row.name)
    else:
        with pytest.raises(UsageError) as refused_device:
            check_device(device, row.name)
        assert row.name in str(refused_device.value) and row.device_instead in str(refused_device.value)


def test_nothing_is_refused_for_a_backend_not_known_yet():
    assert select.offload_refusal(None) is None and select.device_refusal(None) is None
    assert select.offload_refusal(select.AUTO) is None and select.device_refusal(select.AUTO) is None


@pytest.mark.parametrize("command", ["generate", "chat", "serve", "info"])
def test_the_clis_backend_choices_and_help_are_the_tables(command: str):
    action = _backend_action(command)
    assert tuple(action.choices or ()) == select.USER_BACKENDS and action.default == select.AUTO
    for row in BACKEND_TABLE:
        assert (row.description in (action.help or "")) == row.user_facing, row.name
    assert select.AUTO_HELP in (action.help or "")


def test_the_cli_refuses_a_backend_users_do_not_see_and_plans_the_mock_without_a_model():
    with pytest.raises(SystemExit):
        build_parser().parse_args(["generate", "--prompt", "x", "--backend", "mock"])
    for row in BACKEND_TABLE:
        if row.opens == "nothing":  # no spec to resolve: planned as itself, whatever --model says
            args = argparse.Namespace(backend=row.name, model="/no/such/model")
            assert planned_backend(args) == row.name


def test_backend_help_lists_the_names_it_is_given_in_order_one_line_each():
    names = select.user_backends(every_distribution=True)
    lines = select.backend_help("\n", names).splitlines()
    assert [line.split(":", 1)[0] for line in lines] == list(names)
    assert all(BACKEND_ROWS[n].every_distribution for n in names if n != select.AUTO)
    assert "remote" not in names  # a server reports only its top N log-probs: Compare models cannot use it

