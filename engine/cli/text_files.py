"""Text the user hands the CLI (arguments, files, standard input), decoded strictly as UTF-8.

A bad byte is reported where it is, in one `UsageError` line naming the option; the command checks
(`engine.cli.input`) and the sampler options (`engine.cli.sampling_args`) both read text through here.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import BinaryIO

from engine.errors import UsageError


def bad_utf8(text: str) -> str | None:
    """None if `text` is valid UTF-8 text; else where it is not, e.g. "byte 0xff at character 3"."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = text[e.start]
        # Python decodes undecodable argv/stdin bytes to U+DC80..U+DCFF (surrogateescape): recover the byte.
        what = f"byte 0x{ord(bad) - 0xDC00:02x}" if 0xDC80 <= ord(bad) <= 0xDCFF else f"character U+{ord(bad):04X}"
        return f"{what} at character {e.start + 1}"
    return None


def decode_utf8(data: bytes, source: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise UsageError(f"{source} is not valid UTF-8 (byte 0x{data[e.start]:02x} on line {line}); save it as UTF-8") from None


def read_text_file(path: str, option: str) -> str:
    """The whole of a UTF-8 text file named by `option`; UsageError if it is missing, a folder or unreadable."""
    p = Path(path).expanduser()
    if p.is_dir():
        raise UsageError(f"{option} {path}: is a folder, not a text file")
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise UsageError(f"{option} {path}: no such file") from None
    except OSError as e:
        raise UsageError(f"{option} {path}: cannot be read ({e.strerror or e})") from None
    return decode_utf8(data, f"{option} {path}")


def read_stdin(stdin: BinaryIO | None, option: str) -> str:
    stream = stdin if stdin is not None else getattr(sys.stdin, "buffer", None)
    if stream is None:  # stdin replaced by a text stream (tests, embedding): already decoded
        text = sys.stdin.read()
        if where := bad_utf8(text):
            raise UsageError(f"{option} -: standard input is not valid UTF-8 ({where})")
        return text
    return decode_utf8(stream.read(), f"{option} -: standard input")
