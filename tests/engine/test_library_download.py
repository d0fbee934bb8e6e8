"""Downloads against a real HTTP server on 127.0.0.1 (tests/download_server.py): resume after a dropped
connection, cancel and resume, checksums (right, wrong, none published), a 404, a server that ignores Range,
and a full disk (a quota through the free-space parameter, and a real 1 MiB tmpfs where mounting is allowed).
"""

from __future__ import annotations

import hashlib
import os
import subprocess

import pytest

from download_server import DownloadServer, Served, closed_port
from engine.library.errors import (
    ChecksumMismatchError,
    DiskFullError,
    DownloadCancelled,
    DownloadError,
    DownloadInterrupted,
)
from engine.library.http_download import download_url
from engine.library.progress import CancelToken

DATA = os.urandom(1_500_000)  # many network reads
PLENTY = lambda _folder: 10**12  # noqa: E731 (free space of a big disk)


@pytest.fixture
def server():
    with DownloadServer() as s:
        yield s


def _get(server, tmp_path, served: Served, **kw):
    server.files["/m.gguf"] = served
    kw.setdefault("free_space", PLENTY)
    return download_url(server.url("/m.gguf"), tmp_path / "m.gguf", **kw)


def test_a_dropped_connection_resumes_with_range_where_it_stopped(server, tmp_path):
    seen = []
    path = _get(server, tmp_path, Served(DATA, drop_after=600_000), progress=seen.append)
    assert path.read_bytes() == DATA
    assert not (tmp_path / "m.gguf.part").exists()
    ranges = [r for _p, r in server.requests]
    assert ranges[0] is None and ranges[1] == f"bytes={600_000}-"
    assert seen[-1].done_bytes == seen[-1].total_bytes == len(DATA)
    done = [p.done_bytes for p in seen]
    assert done == sorted(done) and seen[-1].fraction == 1.0


def test_an_interrupted_download_keeps_its_part_and_the_next_pull_resumes_it(server, tmp_path):
    with pytest.raises(DownloadInterrupted, match="pull again to resume"):
        _get(server, tmp_path, Served(DATA, drop_after=500_000), retries=0)
    assert (tmp_path / "m.gguf.part").stat().st_size == 500_000 and not (tmp_path / "m.gguf").exists()  # every byte received
    path = _get(server, tmp_path, Served(DATA))
    assert path.read_bytes() == DATA
    assert server.requests[-1][1] == "bytes=500000-"


def test_cancel_stops_between_chunks_keeps_the_part_and_a_later_pull_resumes(server, tmp_path):
    cancel = CancelToken()

    def progress(p):
        cancel.cancel()  # at the first report, as a Cancel button would

    with pytest.raises(DownloadCancelled, match="cancelled"):
        _get(server, tmp_path, Served(DATA), progress=progress, cancel=cancel)
    kept = (tmp_path / "m.gguf.part").stat().st_size
    assert 0 < kept < len(DATA)
    assert _get(server, tmp_path, Served(DATA)).read_bytes() == DATA
    assert server.requests[-1][1] == f"bytes={kept}-"


def test_a_wrong_published_checksum_deletes_the_file_and_says_so(server, tmp_path):
    wrong = hashlib.sha256(b"another file").hexdigest()
    with pytest.raises(ChecksumMismatchError, match="damaged") as e:
        _get(server, tmp_path, Served(DATA, publish_sha256=wrong))
    assert wrong[:16] in str(e.value)
    assert not (tmp_path / "m.gguf").exists() and not (tmp_path / "m.gguf.part").exists()


def test_a_checksum_given_by_the_caller_is_checked_even_when_the_server_publishes_none(server, tmp_path):
    right = hashlib.sha256(DATA).hexdigest()
    assert _get(server, tmp_path, Served(DATA, publish_sha256=None), expected_sha256=right).read_bytes() == DATA
    (tmp_path / "m.gguf").unlink()
    with pytest.raises(ChecksumMismatchError):
        _get(server, tmp_path, Served(DATA, publish_sha256=None), expected_sha256="0" * 64)


def test_a_resumed_download_is_checked_over_the_whole_file(server, tmp_path):
    (tmp_path / "m.gguf.part").write_bytes(b"x" * 1000)  # a part from another file: resuming it gives a wrong file
    with pytest.raises(ChecksumMismatchError):
        _get(server, tmp_path, Served(DATA))
    assert server.requests[-1][1] == "bytes=1000-"


def test_a_missing_file_is_one_clear_error(server, tmp_path):
    with pytest.raises(DownloadError, match="HTTP 404") as e:
        download_url(server.url("/nothing.gguf"), tmp_path / "x.gguf", free_space=PLENTY)
    assert "check the address" in str(e.value)
    assert not list(tmp_path.iterdir())


def test_a_server_that_ignores_range_restarts_the_part(server, tmp_path):
    (tmp_path / "m.gguf.part").write_bytes(DATA[:1000])
    assert _get(server, tmp_path, Served(DATA, honour_range=False)).read_bytes() == DATA


def test_a_closed_port_is_one_clear_error_not_a_hang(tmp_path):
    with pytest.raises(DownloadError, match="cannot reach 127.0.0.1"):
        download_url(f"http://127.0.0.1:{closed_port()}/m.gguf", tmp_path / "m.gguf", free_space=PLENTY)


def test_not_enough_free_space_is_said_before_anything_is_written(server, tmp_path):
    with pytest.raises(DiskFullError, match="not enough free space") as e:
        _get(server, tmp_path, Served(DATA), free_space=lambda _f: 1_000_000, reserve_bytes=0)
    assert "1.5 MB" in str(e.value)
    assert not (tmp_path / "m.gguf.part").exists() or (tmp_path / "m.gguf.part").stat().st_size == 0


def test_space_running_out_while_writing_stops_the_download(server, tmp_path, monkeypatch):
    import engine.library.http_download as http_download

    monkeypatch.setattr(http_download, "SPACE_CHECK_EVERY", 256 * 1024)
    calls = []

    def shrinking(_folder):  # another program fills the disk after the download started
        calls.append(1)
        return 10**12 if len(calls) == 1 else 100_000

    with pytest.raises(DiskFullError, match="not enough free space"):
        _get(server, tmp_path, Served(DATA), free_space=shrinking, reserve_bytes=0)
    assert 0 < (tmp_path / "m.gguf.part").stat().st_size < len(DATA)


@pytest.fixture
def tiny_tmpfs(tmp_path):
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.decode().strip()}); the quota tests cover the checks")
    yield mount
    subprocess.run(["umount", str(mount)], check=False)


def test_a_really_full_disk_is_one_clear_error(server, tiny_tmpfs):
    server.files["/m.gguf"] = Served(DATA, chunked=True)  # no size up front: the write itself hits ENOSPC
    with pytest.raises(DiskFullError, match="is full"):
        download_url(server.url("/m.gguf"), tiny_tmpfs / "m.gguf", reserve_bytes=0)
    server.files["/m.gguf"] = Served(DATA)  # with a size, it is refused before writing
    (tiny_tmpfs / "m.gguf.part").unlink()
    with pytest.raises(DiskFullError, match="not enough free space"):
        download_url(server.url("/m.gguf"), tiny_tmpfs / "m.gguf", reserve_bytes=0)
