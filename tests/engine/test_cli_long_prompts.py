"""Long prompts through every entry point, bad bytes in chat, custom-code folders and hub revisions.

On the tiny random Llama (context 512): a prompt that does not fit gets the
engine's context-length error before any forward pass, in the CLI (file,
stdin, chat, batch) and in the research API.
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest

from engine import cli
from engine.errors import ContextLengthError, RemoteCodeRefusedError

LONG = "word " * 40_000  # ~40k tokens: far past the tiny model's 512


def error_lines(capsys) -> list[str]:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return [ln for ln in err.splitlines() if ln.startswith("error:")]


def tiny_args(folder: Path) -> list[str]:
    return ["--model", str(folder), "--backend", "torch", "--max-new-tokens", "4"]


def stdin_bytes(monkeypatch, data: bytes) -> None:
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))


def test_long_prompt_file_gets_the_context_length_error(tiny_llama_folder, tmp_path, capsys):
    prompt = tmp_path / "long.txt"
    prompt.write_text(LONG, encoding="utf-8")
    code = cli.main(["generate", "--prompt-file", str(prompt), *tiny_args(tiny_llama_folder)])
    [line] = error_lines(capsys)
    assert code == 2 and "model's context length is 512" in line


def test_long_prompt_on_stdin_gets_the_context_length_error_also_with_beams(tiny_llama_folder, monkeypatch, capsys):
    stdin_bytes(monkeypatch, LONG.encode())
    code = cli.main(["generate", "--prompt", "-", "--num-beams", "2", *tiny_args(tiny_llama_folder)])
    [line] = error_lines(capsys)
    assert code == 2 and "context length is 512" in line


def test_chat_skips_a_line_of_invalid_utf8_and_survives_a_long_system_prompt(tiny_llama_folder, tmp_path,
                                                                             monkeypatch, capsys):
    stdin_bytes(monkeypatch, b"caf\xe9 in latin-1\nhello\n/set system \n/set max_new_tokens 0\nhello again\n/quit\n")
    system = tmp_path / "system.txt"
    system.write_text(LONG, encoding="utf-8")
    code = cli.main(["chat", "--system-file", str(system), "--temperature", "0", *tiny_args(tiny_llama_folder)])
    out = capsys.readouterr()
    errors = [ln for ln in out.err.splitlines() if ln.startswith("error:")]
    assert code == 0 and "Traceback" not in out.err
    assert len(errors) == 3
    assert "not valid UTF-8 (byte 0xe9 at character 4)" in errors[0]
    assert "context length is 512" in errors[1]  # the long system prompt; the session goes on
    assert "max_new_tokens must be at least 1, got 0" in errors[2]
    assert out.out.count("assistant> ") == 2  # "hello" (refused, too long) and "hello again" (answered)
    assert out.err.count(" tokens, ") == 1  # the answer after `/set system` cleared the long system prompt


def test_batch_writes_an_error_record_for_a_prompt_too_long_and_runs_the_others(tiny_llama_folder, tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(f"hello there\n{'word ' * 3000}\nthe cat sat\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    code = cli.main(["batch", "--input", str(prompts), "--output", str(out), *tiny_args(tiny_llama_folder)])
    records = [json.loads(line) for line in out.read_text().splitlines()]
    [summary] = error_lines(capsys)
    assert code == 1 and "1 of 3 prompts did not run" in summary
    assert [r["prompt"] for r in records] == ["hello there", "word " * 3000, "the cat sat"]
    assert "context length is 512" in records[1]["error"] and "token_ids" not in records[1]
    for r in (records[0], records[2]):
        assert "error" not in r and 1 <= len(r["token_ids"]) == len(r["logprobs"]) <= 4


def test_research_api_checks_every_prompt_before_any_forward(tiny_torch):
    from engine.research import LanguageModel

    lm = LanguageModel(tiny_torch)
    short, long = [1, 2, 3], list(range(5, 600))
    try:
        with pytest.raises(ContextLengthError, match="prompt 1: the prompt has 595 tokens"):
            lm.generate([short, long], max_new_tokens=4)
        with pytest.raises(ContextLengthError, match="context length is 512"):
            lm.beam_search(long, num_beams=2, max_new_tokens=4)
        with pytest.raises(ContextLengthError):
            lm.beam_search(list(range(5, 510)), num_beams=2, max_new_tokens=8)  # fits alone, not with 8 new
        with pytest.raises(ContextLengthError):
            lm.next_token_logprobs_sync(long)
        with pytest.raises(ContextLengthError):
            lm.batch_sample([short, long], max_tokens=2)
        assert lm.forward_calls == 0  # refused before the model ran at all
        assert lm.generate([short], max_new_tokens=2).shape == (1, 5)
    finally:
        lm._executor.shutdown(wait=True)


def custom_code_folder(tmp_path: Path, tiny_llama_folder: Path, model_type: str) -> Path:
    folder = tmp_path / "custom-model"
    shutil.copytree(tiny_llama_folder, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(model_type=model_type, auto_map={"AutoConfig": "configuration_my.MyConfig",
                                                "AutoModelForCausalLM": "modeling_my.MyForCausalLM"})
    (folder / "config.json").write_text(json.dumps(cfg))
    (folder / "modeling_my.py").write_text("raise SystemExit('this code must not run')\n")
    (folder / "configuration_my.py").write_text("raise SystemExit('this code must not run')\n")
    return folder


def test_custom_code_folder_is_refused_in_our_words(tiny_llama_folder, tmp_path, capsys):
    from engine.open_model import load_model

    folder = custom_code_folder(tmp_path, tiny_llama_folder, "my_own_arch")
    with pytest.raises(RemoteCodeRefusedError) as caught:
        load_model(str(folder), backend="torch")
    assert caught.value.files == ("configuration_my.py", "modeling_my.py")
    code = cli.main(["info", "--model", str(folder), "--backend", "torch"])
    [line] = error_lines(capsys)
    assert code == 2 and "configuration_my.py, modeling_my.py" in line and "--trust-remote-code" in line
    assert "hf.co" not in line and "trust_remote_code=True" not in line


def test_auto_map_on_an_architecture_transformers_implements_loads_with_the_library_code(tiny_llama_folder, tmp_path):
    from engine.open_model import load_model
    from engine.sources.remote_code import custom_code_files, needs_remote_code

    folder = custom_code_folder(tmp_path, tiny_llama_folder, "llama")
    assert custom_code_files(folder) == ("configuration_my.py", "modeling_my.py")
    assert needs_remote_code(folder) == ()
    backend = load_model(str(folder), backend="torch")  # the folder's files would raise SystemExit if they ran
    try:
        assert backend.info.architecture == "LlamaForCausalLM"
    finally:
        backend.close()


def test_hub_id_records_the_commit_it_was_loaded_at(tiny_llama_folder, tmp_path, monkeypatch):
    """A hub id served from the local HF cache (no network): ModelInfo.revision is the snapshot's commit."""
    import huggingface_hub.constants

    from engine.open_model import load_model

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--logitlab-test--tiny-llama"
    shutil.copytree(tiny_llama_folder, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    backend = load_model("logitlab-test/tiny-llama", backend="torch")
    try:
        assert backend.info.revision == commit
        assert f"revision:       {commit}" in backend.info.summary_lines()
    finally:
        backend.close()


def test_custom_code_runs_when_allowed(tiny_llama_folder, tmp_path, monkeypatch, capsys):
    """--trust-remote-code really loads the folder's own classes (a Llama subclass here)."""
    import transformers.dynamic_module_utils as dynamic

    monkeypatch.setattr(dynamic, "HF_MODULES_CACHE", str(tmp_path / "modules"))  # not the user's cache
    folder = custom_code_folder(tmp_path, tiny_llama_folder, "logitlab_test_llama")
    (folder / "configuration_my.py").write_text(
        "from transformers import LlamaConfig\n\n\nclass MyConfig(LlamaConfig):\n    model_type = 'logitlab_test_llama'\n"
    )
    (folder / "modeling_my.py").write_text(
        "from transformers import LlamaForCausalLM\n\nfrom .configuration_my import MyConfig\n\n\n"
        "class MyForCausalLM(LlamaForCausalLM):\n    config_class = MyConfig\n"
    )
    code = cli.main(["info", "--model", str(folder), "--backend", "torch", "--trust-remote-code"])
    out = capsys.readouterr().out
    assert code == 0 and "context length: 512" in out
    assert list((tmp_path / "modules").rglob("modeling_my.py"))  # transformers imported the folder's module
