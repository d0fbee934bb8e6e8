"""Settings given on the command line or in a file: each mistake is one message that names it (issue 20 item 23)."""

from __future__ import annotations

import pytest

from engine.cli.experiments import load_settings
from engine.sampling.settings import SamplerSettings


def test_a_binary_settings_file_is_named(tmp_path):
    path = tmp_path / "settings.json"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe")
    with pytest.raises(ValueError, match="settings file .*settings.json is not UTF-8 text") as info:
        load_settings(str(path))
    assert "codec" not in str(info.value)


def test_an_order_given_as_one_string_is_not_spelled_out(tmp_path):
    path = tmp_path / "order.json"
    path.write_text('{"order": "top_k"}')
    with pytest.raises(ValueError, match=r"order must be a list of stage names.*got 'top_k'") as info:
        load_settings(str(path))
    assert "'t', 'o'" not in str(info.value) and "order.json" in str(info.value)
    with pytest.raises(ValueError, match="order must be a list of stage names"):
        SamplerSettings(order="top_k")
    assert SamplerSettings(order=["top_k", "temperature"]).order == ("top_k", "temperature")


@pytest.mark.parametrize("as_file", [True, False])
def test_a_json_list_is_not_a_missing_file(tmp_path, as_file):
    arg = "[]"
    if as_file:
        (tmp_path / "list.json").write_text("[]")
        arg = str(tmp_path / "list.json")
    with pytest.raises(ValueError, match="must be a JSON object of sampler fields.*it holds list") as info:
        load_settings(arg)
    assert "not found" not in str(info.value)
