"""The model library, downloads and server clients against hostile files and servers (issue 36, items 7, 10, 11,
14; issue 37, item 11). Files are made in the test (tests/hostile/library_corpus.py); servers are real HTTP
servers on 127.0.0.1 (tests/download_server.py, tests/remote_server.py).
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from library_corpus import (
    ANSI_NAME,
    deep_json,
    fifo,
    gguf_header,
    lying_gguf_headers,
    sparse_file,
    write_json,
)
from library_layouts import TINY_CONFIG, hf_cache_file, hf_cache_folder_model, lmstudio_model, ollama_model, put_gguf

from engine.library import scan
from engine.library.facts_cache import FactsCache
from engine.library.locations import Location
from engine.library.memory import MachineMemory

ROOT = Path(__file__).resolve().parents[2]
BIG_MACHINE = MachineMemory(total_bytes=64 * 2**30, available_bytes=32 * 2**30)
BACKENDS = {"gguf": "llamacpp", "safetensors": "torch"}


def within(seconds: float, fn, *args, **kw):
    """fn(*args, **kw) on a thread; fails the test when it has not returned after `seconds` (a hang)."""
    box: dict = {}

    def run():
        try:
            box["value"] = fn(*args, **kw)
        except BaseException as e:  # noqa: BLE001 - re-raised below
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"{getattr(fn, '__name__', fn)} still running after {seconds} s"
    if "error" in box:
        raise box["error"]
    return box["value"]


def _scan(locations, tmp_path):
    return scan(locations, cache=FactsCache(tmp_path / "facts.json"), machine=BIG_MACHINE, backends=BACKENDS)


# --- item 7: GGUF headers whose counts lie --------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(lying_gguf_headers()))
def test_a_sparse_64_gb_gguf_with_lying_counts_is_refused_at_once(tmp_path, case):
    path = sparse_file(tmp_path / "liar.gguf", lying_gguf_headers()[case])
    # In a child process: before the fix the header walk takes ~85 minutes, and a thread cannot be stopped.
    code = ("import sys, time; from engine.backends.llamacpp.gguf_header import read_header; "
            "from engine.errors import ModelLoadError\n"
            "t = time.perf_counter()\n"
            "try:\n    read_header(sys.argv[1]); print('read')\n"
            "except ModelLoadError as e:\n    print(f'{time.perf_counter() - t:.3f}', e)\n")
    try:
        out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=30,
                             cwd=ROOT).stdout
    except subprocess.TimeoutExpired:
        pytest.fail(f"reading the header of a sparse 64 GB GGUF ({case}) ran past 30 s")
    seconds, _, message = out.partition(" ")
    assert seconds != "read" and float(seconds) < 1.0, out
    assert str(path) in message and ("corrupt" in message or "truncated" in message), message


@pytest.mark.slow
def test_the_library_lists_a_lying_gguf_as_unreadable_within_a_second(tmp_path):
    folder = tmp_path / "models"
    folder.mkdir()
    sparse_file(folder / "liar.gguf", gguf_header(2**32, 2**32))
    put_gguf(folder / "good.gguf")
    t = time.perf_counter()
    result = within(20, _scan, [Location("folder", folder)], tmp_path)
    assert time.perf_counter() - t < 2.0
    by_name = {e.name: e for e in result.entries}
    assert by_name["good"].facts.architecture == "llama" and not by_name["good"].problem
    assert "corrupt GGUF header" in by_name["liar"].problem and by_name["liar"].fit == "unknown"


def test_a_fifo_named_gguf_is_refused_without_opening_it(tmp_path):
    from engine.backends.llamacpp.gguf_header import read_header
    from engine.errors import ModelLoadError

    path = fifo(tmp_path / "pipe.gguf")
    with pytest.raises(ModelLoadError, match="named pipe"):
        within(5, read_header, path)


# --- item 7: one bad file never stops (or freezes) the listing ------------------------------------------------------


def _hostile_home(home: Path, tiny: Path) -> dict[str, Path]:
    """A home whose stores hold one good model each beside every kind of bad file."""
    ollama = home / ".ollama" / "models"
    ollama_model(ollama, "good", "latest", tiny.read_bytes())
    deep = ollama / "manifests" / "registry.ollama.ai" / "library" / "deep" / "latest"
    deep.parent.mkdir(parents=True)
    deep.write_bytes(b'{"layers": ' + deep_json() + b"}")
    zero = ollama / "manifests" / "registry.ollama.ai" / "library" / "zero" / "latest"
    zero.parent.mkdir(parents=True)
    zero.symlink_to("/dev/zero")

    hub = home / ".cache" / "huggingface" / "hub"
    hf_cache_folder_model(hub, "org/good", "a" * 40)
    hf_cache_file(hub, "org/deep-config", "b" * 40, "config.json", deep_json())
    hf_cache_file(hub, "org/deep-config", "b" * 40, "model.safetensors", b"\0" * 16)
    hf_cache_file(hub, "org/deep-header", "c" * 40, "config.json", json.dumps(TINY_CONFIG).encode())
    header = b'{"w": {"dtype": "F16", "shape": ' + deep_json(50_000) + b', "data_offsets": [0, 0]}}'
    hf_cache_file(hub, "org/deep-header", "c" * 40, "model.safetensors", struct.pack("<Q", len(header)) + header)
    zero_repo = hf_cache_folder_model(hub, "org/zero-config", "d" * 40)
    (zero_repo / "config.json").unlink()
    (zero_repo / "config.json").symlink_to("/dev/zero")
    fifo_repo = hf_cache_folder_model(hub, "org/fifo-ref", "e" * 40)
    ref = fifo_repo.parent.parent / "refs" / "main"
    ref.unlink()
    fifo(ref)

    lmstudio_model(home, "pub", "Good-GGUF", "Good-Q8.gguf", template=tiny)
    odd = home / "jan" / "models"
    odd.mkdir(parents=True)
    fifo(odd / "pipe.gguf")
    put_gguf(odd / f"{ANSI_NAME}.gguf", template=tiny)
    return {"hub": hub, "ollama": ollama}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return put_gguf(tmp_path_factory.mktemp("tiny") / "tiny.gguf", n_ctx=512)


@pytest.mark.slow
def test_a_home_full_of_bad_files_is_listed_whole_with_reasons_and_never_hangs(tmp_path, tiny, monkeypatch):
    home = tmp_path / "home"
    _hostile_home(home, tiny)
    from engine.library import default_locations

    env = {"HOME": str(home), "LOGITLAB_MODELS_DIR": str(home / "logitlab-models")}
    locations = default_locations(home=home, platform="linux", env=env, default_model=False)
    result = within(30, _scan, locations, tmp_path)
    entries = {e.name: e for e in result.entries}
    # The good ones, with their facts.
    for name in ("good:latest", "org/good", "pub/Good-GGUF"):
        assert entries[name].facts.architecture == "llama" and not entries[name].problem, name
    # refs/main as a FIFO: the newest snapshot is listed instead (by its path, since no ref names it).
    assert entries["org/fifo-ref"].facts.parameters > 0
    # The bad ones, each listed with the reason.
    assert "nested 100,001 deep" in entries["deep:latest"].problem
    assert "is a device" in entries["zero:latest"].problem
    assert "config.json is JSON nested" in entries["org/deep-config"].problem
    assert "model.safetensors is JSON nested" in entries["org/deep-header"].problem
    assert "config.json is a device" in entries["org/zero-config"].problem
    assert not any(e.path.name == "pipe.gguf" for e in result.entries)  # a FIFO is not a model file
    # A name with terminal escapes is shown escaped.
    (escaped,) = [e for e in result.entries if "red" in e.name]
    assert "\x1b" not in escaped.name and "\x07" not in escaped.name and "\\x1b[31mred" in escaped.name
    assert escaped.path.name == f"{ANSI_NAME}.gguf" and not escaped.problem  # the file itself still opens


def test_json_depth_is_measured_outside_strings_in_linear_time():
    from engine.library.safe_read import json_depth

    assert json_depth(b'{"a": [1, {"b": "[[[[{{{{"}], "c": "\\"]]]"}') == 3
    assert json_depth(deep_json(1000)) == 1000
    t = time.perf_counter()
    assert json_depth(b'"' + b'\\"' * 2_000_000) == 0  # an unterminated string full of escaped quotes
    assert json_depth(b"[" + b'"a",' * 1_000_000 + b"1]") == 1
    assert time.perf_counter() - t < 2.0


def test_json_depth_agrees_with_the_parsed_document():
    """Oracle: the depth of what json.loads builds, on random documents whose strings hold brackets, quotes and
    backslashes (both the fast route, without escaped quotes, and the regex route)."""
    import random

    from engine.library.safe_read import json_depth

    rng = random.Random(7)

    def build(n):
        if n == 0:
            return rng.choice(["a[b", "c]{", 1, 'q"}', None, "\\", "]]"])
        if rng.random() < 0.5:
            return [build(n - 1) for _ in range(rng.randint(0, 3))]
        return {f"k{i}[": build(n - 1) for i in range(rng.randint(0, 3))}

    def depth(o):
        if isinstance(o, list):
            return 1 + max(map(depth, o), default=0)
        if isinstance(o, dict):
            return 1 + max(map(depth, o.values()), default=0)
        return 0

    for _ in range(500):
        doc = build(rng.randint(0, 7))
        raw = json.dumps(doc).encode()
        assert json_depth(raw) == depth(doc), raw
        plain = json.dumps(doc).replace('\\"', "").encode()  # no escaped quote: the fast route
        try:
            parsed = json.loads(plain)
        except ValueError:
            continue
        assert json_depth(plain) == depth(parsed), plain


@pytest.mark.slow
def test_an_uncreatable_cache_folder_costs_the_cache_not_the_listing(tmp_path, tiny, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("LOGITLAB_CACHE_DIR", str(blocker / "cache"))
    folder = tmp_path / "models"
    put_gguf(folder / "tiny.gguf", template=tiny)
    result = scan([Location("folder", folder)], machine=BIG_MACHINE, backends=BACKENDS)
    assert [e.name for e in result.entries] == ["tiny"] and not result.entries[0].problem


@pytest.mark.slow
def test_the_cli_prints_names_with_terminal_escapes_escaped(tmp_path, tiny, monkeypatch, capsys):
    from engine.__main__ import main

    home = tmp_path / "home"
    folder = tmp_path / "models"
    put_gguf(folder / f"{ANSI_NAME}.gguf", template=tiny)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("LOGITLAB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("LOGITLAB_MODELS_DIR", str(home / "models"))
    monkeypatch.setenv("LOGITLAB_DEFAULT_MODEL", str(tmp_path / "none.gguf"))
    for name in ("HF_HOME", "HF_HUB_CACHE", "XDG_CACHE_HOME", "XDG_DATA_HOME", "OLLAMA_MODELS", "LLAMA_CACHE",
                 "LOGITLAB_MODEL_FOLDERS"):
        monkeypatch.delenv(name, raising=False)
    assert main(["models", "--folder", str(folder)]) == 0
    out, err = capsys.readouterr()
    assert "\\x1b[2J\\x1b[31mred" in out
    assert "\x1b" not in out + err and "\x07" not in out + err


# --- issue 37 item 11: the library's names and counts -----------------------------------------------------------------


def test_lm_studio_models_are_named_publisher_slash_repo(tmp_path, tiny):
    home = tmp_path / "home"
    lmstudio_model(home, "lmstudio-community", "Qwen-GGUF", "model.gguf", template=tiny)
    lmstudio_model(home, "bartowski", "Two-GGUF", "Two-Q4_K_M.gguf", template=tiny)
    lmstudio_model(home, "bartowski", "Two-GGUF", "Two-Q8_0.gguf", template=tiny)
    (home / "jan" / "models" / "tiny-jan").mkdir(parents=True)
    put_gguf(home / "jan" / "models" / "tiny-jan" / "model.gguf", template=tiny)
    result = _scan([Location("lmstudio", home / ".lmstudio" / "models"), Location("jan", home / "jan" / "models")],
                   tmp_path)
    assert sorted(e.name for e in result.entries) == [
        "bartowski/Two-GGUF/Two-Q4_K_M", "bartowski/Two-GGUF/Two-Q8_0", "lmstudio-community/Qwen-GGUF", "tiny-jan"]


# --- item 11: a download is named only when it is verifiably whole ------------------------------------------------

DATA = os.urandom(1_500_000)
PLENTY = lambda _folder: 10**12  # noqa: E731 (free space of a big disk)


@pytest.fixture
def files():
    from download_server import DownloadServer

    with DownloadServer() as s:
        yield s


def _download(server, tmp_path, served, path="/m.gguf", **kw):
    from engine.library.http_download import download_url

    server.files[path] = served
    kw.setdefault("free_space", PLENTY)
    return download_url(server.url(path), tmp_path / "m.gguf", **kw)


def _named(tmp_path) -> bool:
    return (tmp_path / "m.gguf").exists()


def test_a_body_without_length_cut_early_is_resumed_to_the_whole_file(files, tmp_path):
    from download_server import Served

    path = _download(files, tmp_path, Served(DATA, unframed=True, drop_after=600_000, publish_sha256=None))
    assert path.read_bytes() == DATA  # the end of the connection was not taken for the end of the file
    assert ("/m.gguf", "bytes=600000-") in files.requests


def test_a_body_without_length_that_cannot_be_confirmed_is_not_named(files, tmp_path):
    from download_server import Served
    from engine.library.errors import DownloadInterrupted

    served = Served(DATA, unframed=True, drop_after=600_000, publish_sha256=None, honour_range=False)
    with pytest.raises(DownloadInterrupted, match="cannot be known to be whole"):
        _download(files, tmp_path, served, retries=0)
    assert not _named(tmp_path)


def test_a_too_short_content_length_is_caught_and_not_named(files, tmp_path):
    from download_server import Served
    from engine.library.errors import DownloadError

    with pytest.raises(DownloadError, match="disagree") as e:
        _download(files, tmp_path, Served(DATA, content_length=1_000_000, publish_sha256=None))
    assert "1,000,000" in str(e.value) and "1,500,000" in str(e.value)
    assert not _named(tmp_path) and not (tmp_path / "m.gguf.part").exists()


def test_a_resume_answered_with_a_smaller_total_is_not_named(files, tmp_path):
    from download_server import Served
    from engine.library.errors import DownloadError

    served = Served(DATA, drop_after=600_000, publish_sha256=None, total_override=1_000_000)
    with pytest.raises(DownloadError, match="its size was 1,500,000 bytes, now 1,000,000"):
        _download(files, tmp_path, served)
    assert not _named(tmp_path)


def test_a_resume_answered_from_the_wrong_offset_is_never_appended(files, tmp_path):
    from download_server import Served
    from engine.library.errors import DownloadInterrupted

    with pytest.raises(DownloadInterrupted):
        _download(files, tmp_path, Served(DATA, drop_after=600_000, publish_sha256=None), retries=0)
    path = _download(files, tmp_path, Served(DATA, publish_sha256=None, range_start_shift=-100_000))
    assert path.read_bytes() == DATA  # started over instead of appending bytes 500,000.. at 600,000


def test_the_hubs_linked_size_and_etag_are_checked(files, tmp_path):
    import hashlib

    from download_server import Served
    from engine.library.errors import ChecksumMismatchError, DownloadError

    with pytest.raises(DownloadError, match="contradicts itself"):
        _download(files, tmp_path, Served(DATA, publish_sha256=None, extra_headers={"X-Linked-Size": "2000000"}))
    wrong = hashlib.sha256(b"another file").hexdigest()
    with pytest.raises(ChecksumMismatchError):
        _download(files, tmp_path, Served(DATA, publish_sha256=None, extra_headers={"X-Linked-Etag": f'"{wrong}"'}))
    assert not _named(tmp_path)


def test_a_redirect_loop_and_a_redirect_to_a_file_address_are_one_sentence(files, tmp_path, capsys):
    from download_server import Served
    from engine.__main__ import main
    from engine.library.errors import DownloadError, DownloadInterrupted

    with pytest.raises(DownloadError, match="redirects in a loop"):
        _download(files, tmp_path, Served(b"", redirect_to="/m.gguf"))
    with pytest.raises(DownloadError, match="not an http") as e:
        _download(files, tmp_path, Served(b"", redirect_to="file:///etc/passwd"))
    assert not isinstance(e.value, DownloadInterrupted) and "resume" not in str(e.value)
    files.files["/loop.gguf"] = Served(b"", redirect_to="/loop.gguf")
    assert main(["pull", files.url("/loop.gguf")]) == 1
    err = capsys.readouterr().err
    assert "redirects in a loop" in err and "Traceback" not in err


def test_pull_says_an_incomplete_download_failed_and_names_nothing(files, tmp_path, monkeypatch, capsys):
    from download_server import Served
    from engine.__main__ import main

    monkeypatch.setenv("LOGITLAB_MODELS_DIR", str(tmp_path / "models"))
    files.files["/cut.gguf"] = Served(DATA, content_length=700_000, publish_sha256=None)
    assert main(["pull", files.url("/cut.gguf")]) != 0
    out, err = capsys.readouterr()
    assert "downloaded to" not in err and out == ""
    assert not (tmp_path / "models" / "cut.gguf").exists()


# --- issue 37 item 11: a second download with the same file name ------------------------------------------------


def test_a_second_download_with_the_same_name_asks_keeps_both_or_replaces(files, tmp_path):
    from download_server import Served
    from engine.library import pull, url_target
    from engine.library.errors import DownloadError

    models = tmp_path / "models"
    first, second = os.urandom(200_000), os.urandom(300_000)
    files.files["/a/model.gguf"] = Served(first)
    files.files["/b/model.gguf"] = Served(second)
    kw = dict(models_folder=models, free_space=PLENTY)
    assert pull(files.url("/a/model.gguf"), **kw).path == models / "model.gguf"
    assert url_target(files.url("/b/model.gguf"), models) == models / "model.gguf"  # what a window asks about
    with pytest.raises(DownloadError, match="already exists.*--if-exists keep-both"):
        pull(files.url("/b/model.gguf"), **kw)
    assert (models / "model.gguf").read_bytes() == first  # untouched
    kept = pull(files.url("/b/model.gguf"), if_exists="keep-both", **kw).path
    assert kept == models / "model (2).gguf" and kept.read_bytes() == second
    assert (models / "model.gguf").read_bytes() == first
    replaced = pull(files.url("/b/model.gguf"), if_exists="replace", **kw).path
    assert replaced == models / "model.gguf" and replaced.read_bytes() == second


def test_a_file_name_with_control_characters_is_refused(tmp_path):
    from engine.errors import UsageError
    from engine.library import pull

    with pytest.raises(UsageError, match="usable .gguf file name") as e:
        pull("http://127.0.0.1:9/%1b%5b2Jevil.gguf", models_folder=tmp_path)
    assert "\x1b" not in str(e.value)


# --- item 10: a hostile server cannot fill memory or pass impossible numbers off as data --------------------------

PROBS = {"a": 0.5, "b": 0.2, "c": 0.1, "d": 0.05, "e": 0.05, "f": 0.04, "g": 0.03}
PROMPT = "Once upon a time, there was"


@pytest.fixture
def servers():
    from remote_server import FakeServer

    made = []

    def make(handler):
        made.append(FakeServer(handler))
        return made[-1]

    yield make
    for s in made:
        s.close()


def tampered(change, **model_kw):
    """A CharModel server whose answers pass through `change(doc, body)` once `on` is set (after the probe)."""
    import copy

    from remote_server import CharModel

    model = CharModel(PROBS, **model_kw)
    on = threading.Event()

    def changed(doc, body):
        try:
            return change(copy.deepcopy(doc), body)
        except (KeyError, IndexError, TypeError):  # an answer without log-probs (a probe's): as it is
            return doc

    def handler(method, path, body):
        reply = model(method, path, body)
        if on.is_set() and path.endswith("completions"):
            if reply.events:
                reply.events = [changed(e, body) for e in reply.events]
            elif isinstance(reply.body, dict) and "choices" in reply.body:
                reply.body = changed(reply.body, body)
        return reply

    return handler, on


def _first_alternative(doc: dict) -> dict:
    return doc["choices"][0]["logprobs"]["content"][0]["top_logprobs"][0]


def test_an_endless_model_list_is_refused_at_a_size_limit(servers):
    from engine.backends.remote import RemoteBackend
    from engine.backends.remote.bounded import MAX_RESPONSE_BYTES
    from engine.backends.remote.errors import ServerResponseError
    from remote_server import Reply

    server = servers(lambda method, path, body: Reply(endless=b'{"data": [' + b" " * 65536))
    t = time.perf_counter()
    with pytest.raises(ServerResponseError, match=f"more than {MAX_RESPONSE_BYTES // 2**20} MiB"):
        RemoteBackend.connect(server.url)
    assert time.perf_counter() - t < 15


def test_an_endless_streamed_line_is_refused_at_a_size_limit(servers):
    from engine import GenerationRequest
    from engine.backends.remote import RemoteBackend
    from engine.backends.remote.errors import ServerResponseError
    from engine.backends.remote.generate import remote_events
    from remote_server import CharModel, Reply

    model = CharModel(PROBS)
    on = threading.Event()

    def handler(method, path, body):
        if on.is_set() and isinstance(body, dict) and body.get("stream"):
            return Reply(endless=b"data: " + b"x" * 65536)  # one line that never ends
        return model(method, path, body)

    backend = RemoteBackend.connect(servers(handler).url)
    on.set()
    with pytest.raises(ServerResponseError, match="streamed an event longer than 16 MiB"):
        list(remote_events(backend, GenerationRequest(prompt=PROMPT, max_new_tokens=3, server_sampling=True)))
    backend.close()


def test_an_endless_error_body_to_a_stream_is_read_within_a_limit(servers):
    from engine import GenerationRequest
    from engine.backends.remote import RemoteBackend
    from engine.backends.remote.errors import ServerResponseError
    from engine.backends.remote.generate import remote_events
    from remote_server import CharModel, Reply

    model = CharModel(PROBS)
    on = threading.Event()

    def handler(method, path, body):
        if on.is_set() and isinstance(body, dict) and body.get("stream"):
            return Reply(status=500, endless=b'{"error": {"message": "' + b"x" * 65536)
        return model(method, path, body)

    backend = RemoteBackend.connect(servers(handler).url)
    on.set()
    t = time.perf_counter()
    with pytest.raises(ServerResponseError, match="internal error"):
        list(remote_events(backend, GenerationRequest(prompt=PROMPT, max_new_tokens=3, server_sampling=True)))
    backend.close()
    assert time.perf_counter() - t < 15


@pytest.mark.parametrize("tid", [10**9, 2**40, -7, "seven"])
def test_a_token_id_no_vocabulary_has_is_refused_before_any_row_is_allocated(servers, tid):
    import tracemalloc

    from engine.backends.remote import RemoteBackend
    from engine.backends.remote.errors import ServerResponseError

    def change(doc, body):
        _first_alternative(doc)["id"] = tid
        return doc

    handler, on = tampered(change)
    backend = RemoteBackend.connect(servers(handler).url)
    on.set()
    tracemalloc.start()
    try:
        with pytest.raises(ServerResponseError, match="token id") as e:
            backend.forward([ord(c) for c in PROMPT])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        backend.close()
    assert peak < 64 * 2**20  # before: a 4 GB row for id 10^9, "Unable to allocate 4.00 TiB" for 2^40
    assert (f"{tid:,}" if isinstance(tid, int) else repr(tid)) in str(e.value)


@pytest.mark.parametrize("bad, shown", [(50.0, "p = 5.18e+21"), (math.nan, "p = nan"), (math.inf, "p = inf")])
def test_impossible_logprobs_are_refused_with_the_value_shown(servers, bad, shown):
    from engine import GenerationRequest
    from engine.backends.remote import RemoteBackend
    from engine.backends.remote.errors import ServerResponseError
    from engine.backends.remote.generate import remote_events

    def change(doc, body):
        doc["choices"][0]["logprobs"]["content"][0]["top_logprobs"][1]["logprob"] = bad
        return doc

    handler, on = tampered(change)
    backend = RemoteBackend.connect(servers(handler).url)
    on.set()
    got = []
    with pytest.raises(ServerResponseError, match=re.escape(shown)):
        for event in remote_events(backend, GenerationRequest(prompt=PROMPT, max_new_tokens=3, top_n=5,
                                                               server_sampling=True)):
            got.append(event)
    backend.close()
    assert got == []  # nothing shown as if the server's numbers were valid


@pytest.mark.parametrize("bad, shown", [(50.0, "p = 5.18e+21"), (math.nan, "p = nan")])
def test_the_cli_says_what_the_server_sent_in_one_line(servers, capsys, bad, shown):
    from engine.__main__ import main

    def change(doc, body):
        doc["choices"][0]["logprobs"]["content"][0]["logprob"] = bad
        return doc

    handler, on = tampered(change)
    server = servers(handler)
    on.set()  # the probe never streams: only the answer is changed
    code = main(["generate", "--model", server.url, "--prompt", PROMPT, "--server-sampling", "--max-new-tokens", "3"])
    err = capsys.readouterr().err
    assert code != 0 and shown in err and "refused" in err and "Traceback" not in err


@pytest.mark.slow  # seconds on two cores (junit times, 2026-12-04)
def test_more_alternatives_than_asked_for_are_refused(servers, capsys):
    from engine.__main__ import main

    def change(doc, body):
        entry = doc["choices"][0]["logprobs"]["content"][0]
        entry["top_logprobs"] = [{"id": i, "token": f"t{i}", "logprob": -20.0} for i in range(200_000)]
        return doc

    handler, on = tampered(change)
    server = servers(handler)
    on.set()
    code = main(["generate", "--model", server.url, "--prompt", PROMPT, "--server-sampling", "--top-n", "3",
                 "--max-new-tokens", "3"])
    err = capsys.readouterr().err
    assert code != 0 and "200,000 alternatives" in err and "3 were asked" in err and "Traceback" not in err


def test_a_stream_past_max_tokens_is_cut(servers):
    from engine import GenerationRequest
    from engine.backends.remote import RemoteBackend
    from engine.backends.remote.generate import remote_events
    from engine.events import Done, TokenEvent
    from remote_server import CharModel, Reply

    model = CharModel(PROBS)
    on = threading.Event()

    def handler(method, path, body):
        if on.is_set() and isinstance(body, dict) and body.get("stream"):
            return Reply(events=[model.chunk("a", 0)] * 5000)
        return model(method, path, body)

    backend = RemoteBackend.connect(servers(handler).url)
    on.set()
    events = list(remote_events(backend, GenerationRequest(prompt=PROMPT, max_new_tokens=4, server_sampling=True)))
    backend.close()
    tokens = [e for e in events if isinstance(e, TokenEvent)]
    assert len(tokens) <= 4 + 16 and isinstance(events[-1], Done)
    assert "more than the 4 tokens asked for" in events[-1].stats.error


# --- item 14: plain mistakes get one line --------------------------------------------------------------------------


@pytest.mark.parametrize("command", [["score", "--text", "hello there"],
                                     ["compare", "--prompt", "hi", "--settings", "{}", "--settings", '{"temperature": 0}']])
def test_score_and_compare_on_a_server_without_tokenize_say_so(servers, capsys, command):
    from engine.__main__ import main
    from remote_server import CharModel

    model = CharModel(PROBS, tokenize=False)
    server = servers(lambda *a: model(*a))
    code = main([command[0], "--model", server.url, *command[1:]])
    err = capsys.readouterr().err
    assert code != 0 and "tokenize" in err and "Traceback" not in err and "AttributeError" not in err


@pytest.mark.parametrize("password, fragments", [("zq#xk", ["zq", "xk"]), ("zq/xk", ["zq", "xk"]),
                                                 ("zq?xk", ["zq", "xk"]), ("9090/7070", [])])
def test_a_password_with_an_unencoded_slash_or_hash_is_refused_without_showing_it(servers, capsys, password,
                                                                                  fragments):
    from engine.__main__ import main
    from remote_server import CharModel

    model = CharModel(PROBS)
    server = servers(lambda *a: model(*a))
    url = server.url.replace("http://", f"http://bob:{password}@")
    assert main(["info", "--model", url]) == 2
    out, err = capsys.readouterr()
    assert "percent-encoded" in err and "Traceback" not in err
    for secret in (password, "bob", *fragments):
        assert secret not in out + err


def test_an_at_sign_in_a_model_name_is_not_taken_for_credentials():
    from engine.backends.remote.options import parse_spec

    assert parse_spec("http://127.0.0.1:8080/v1#org/model@v2") == ("http://127.0.0.1:8080/v1", "org/model@v2")
    assert parse_spec("http://localhost/v1#m@x") == ("http://localhost/v1", "m@x")


def test_a_hub_file_shorter_than_the_hubs_metadata_is_deleted_not_named(tmp_path, monkeypatch):
    """config.json has no published SHA-256 (the hub keeps small files in git): its size is the only check."""
    from download_server import DownloadServer, add_hub_repo
    from engine.library.errors import DownloadError
    from engine.library.pull import pull
    from library_layouts import safetensors_bytes, tiny_llama_tensors

    config = json.dumps(TINY_CONFIG).encode()
    with DownloadServer() as server:
        monkeypatch.setenv("HF_ENDPOINT", server.base_url)
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        add_hub_repo(server, "org/tiny", {"config.json": config,
                                          "model.safetensors": safetensors_bytes(tiny_llama_tensors())})
        for path, served in server.files.items():
            if path.endswith("/config.json"):
                served.data = config[:40]  # the hub's server sends less than its own metadata lists
        with pytest.raises(DownloadError, match=f"came out 40 bytes long, but the hub lists it at {len(config):,}"):
            pull("org/tiny", cache_dir=tmp_path / "hub", free_space=PLENTY)
    assert not list((tmp_path / "hub").rglob("config.json"))


@pytest.mark.slow
def test_opening_a_lying_sparse_gguf_as_a_model_is_refused_at_once(tmp_path):
    """The llama.cpp backend and the GGUF -> safetensors conversion (torch, MLX) read the header before anything
    else (the conversion used to hash the whole file first)."""
    from engine.errors import ModelLoadError
    from engine.sources.gguf_convert import ensure_converted

    path = sparse_file(tmp_path / "liar.gguf", gguf_header(100, 60_000))
    with pytest.raises(ModelLoadError, match="appears twice"):
        within(10, ensure_converted, path)
    pytest.importorskip("llama_cpp")
    from engine.backends.llamacpp import LlamaCppBackend

    with pytest.raises(ModelLoadError, match="corrupt GGUF header"):
        within(10, LlamaCppBackend, path, spec=str(path), display_name="liar")


def test_a_servers_model_id_with_terminal_escapes_is_shown_escaped(servers, capsys):
    from engine.backends.remote import RemoteBackend
    from remote_server import CharModel, Reply

    model = CharModel(PROBS)
    evil = "\x1b[2J\x1b]0;pwned\x07tiny"

    def handler(method, path, body):
        if path == "/v1/models":
            return Reply({"object": "list", "data": [{"id": evil, "owned_by": "llamacpp"}]})
        return model(method, path, body)

    backend = RemoteBackend.connect(servers(handler).url)
    try:
        assert backend.caps.model == evil  # sent back to the server as it named it
        assert "\x1b" not in backend.info.name and "\\x1b[2J" in backend.info.name
    finally:
        backend.close()


def test_hub_file_names_that_would_drive_a_terminal_or_leave_the_cache_are_left_out(monkeypatch):
    from download_server import DownloadServer, add_hub_repo
    from engine.library.hub_download import repo_files

    with DownloadServer() as server:
        monkeypatch.setenv("HF_ENDPOINT", server.base_url)
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        add_hub_repo(server, "org/odd", {"good-Q4.gguf": b"x", f"{ANSI_NAME}.gguf": b"y", "../up.gguf": b"z",
                                         "a//b.gguf": b"w"})
        names = [f.name for f in repo_files("org/odd").files]
    assert names == ["good-Q4.gguf"]
