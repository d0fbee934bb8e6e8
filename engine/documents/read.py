"""Reading a file to attach: every check before anything is attached, each failure one `DocumentError` line.

Order: the file is there and is a file; its size is under MAX_BYTES (checked on its metadata, before a byte is
read, so a 500 MB file costs nothing); then its bytes are read once, hashed, and turned into text: a PDF's text
layer by pypdf (engine/documents/pdf.py), anything else decoded as text. Text decoding is strict: UTF-8 (a
byte-order mark dropped), or UTF-16 when the file starts with its byte-order mark; anything else is refused
naming the first byte that is not UTF-8 and its line, never guessed (a Latin-1 guess would turn a binary or
a Windows-1251 file into plausible-looking garbage the model would read). A file with NUL bytes in its first
8 KB and no UTF-16 mark is binary. The extracted text must be under MAX_CHARS. Either a whole `Attachment`
comes back or an error: nothing is half read.
"""

from __future__ import annotations

import codecs
import hashlib
from pathlib import Path

from engine.documents.attachment import MAX_BYTES, MAX_CHARS, Attachment, DocumentError

SNIFF_BYTES = 8192
MARKDOWN = {".md", ".markdown", ".mdown", ".mkd", ".rst"}
CODE = {".py", ".pyi", ".js", ".mjs", ".ts", ".tsx", ".jsx", ".c", ".h", ".cc", ".cpp", ".hpp", ".cxx", ".rs",
        ".go", ".java", ".kt", ".swift", ".rb", ".php", ".cs", ".sh", ".bash", ".zsh", ".ps1", ".sql", ".html",
        ".htm", ".css", ".scss", ".xml", ".yaml", ".yml", ".toml", ".ini", ".cfg", ".lua", ".r", ".jl", ".m",
        ".scala", ".hs", ".ml", ".ex", ".exs", ".erl", ".clj", ".dart", ".vue", ".svelte", ".tex", ".jinja", ".j2"}
# Magic numbers of common binary files, named so the message says what the file is, not only "binary".
BINARY_MAGIC = ((b"\x89PNG", "a PNG image"), (b"\xff\xd8\xff", "a JPEG image"), (b"GIF8", "a GIF image"),
                (b"PK\x03\x04", "a ZIP archive (or a .docx/.xlsx)"), (b"\x7fELF", "a program (ELF)"),
                (b"\x1f\x8b", "a gzip archive"), (b"GGUF", "a GGUF model file"), (b"MZ", "a Windows program"))


def media_kind_for(name: str) -> str:
    suffix = Path(name).suffix.lower()
    if suffix == ".pdf":
        return "pdf"
    if suffix in MARKDOWN:
        return "markdown"
    if suffix in (".csv", ".tsv"):
        return "csv"
    if suffix in (".json", ".jsonl", ".ndjson"):
        return "json"
    return "code" if suffix in CODE else "text"


def _size_words(size: int) -> str:
    return f"{size / (1024 * 1024):,.1f} MB" if size >= 1024 * 1024 else f"{size:,} bytes"


def read_attachment(path: str | Path, max_bytes: int = MAX_BYTES, max_chars: int = MAX_CHARS) -> Attachment:
    """The file at `path` as an Attachment; DocumentError (one line naming the file) if it cannot be attached."""
    p = Path(path).expanduser()
    name = p.name or str(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        raise DocumentError(f"{name}: no such file (was it moved or deleted?)") from None
    except OSError as e:
        raise DocumentError(f"{name}: cannot be read ({e.strerror or e})") from None
    if p.is_dir():
        raise DocumentError(f"{name}: is a folder; attach the files in it one by one")
    if not p.is_file():
        raise DocumentError(f"{name}: is not a regular file (a device or a pipe)")
    if st.st_size > max_bytes:
        raise DocumentError(f"{name}: is {_size_words(st.st_size)}; attachments are limited to "
                            f"{_size_words(max_bytes)} (attach a part of it)")
    try:
        with p.open("rb") as f:
            data = f.read(max_bytes + 1)  # the file may have grown since its size was read
    except FileNotFoundError:
        raise DocumentError(f"{name}: vanished while it was being read; nothing was attached") from None
    except OSError as e:
        raise DocumentError(f"{name}: cannot be read ({e.strerror or e})") from None
    if len(data) > max_bytes:
        raise DocumentError(f"{name}: grew past {_size_words(max_bytes)} while it was read; attachments are "
                            "limited to that")
    return attachment_from_bytes(name, data, max_chars=max_chars)


def attachment_from_bytes(name: str, data: bytes, max_chars: int = MAX_CHARS) -> Attachment:
    """An Attachment of `data` named `name` (a file dropped or pasted has bytes and a name); DocumentError if not."""
    kind = media_kind_for(name)
    if data.startswith(b"%PDF-") or kind == "pdf":
        from engine.documents.pdf import pdf_text

        text, encoding, kind = pdf_text(name, data), "pdf", "pdf"
    else:
        text, encoding = decode_text(name, data)
    if len(text) > max_chars:
        raise DocumentError(f"{name}: holds {len(text):,} characters of text; attachments are limited to "
                            f"{max_chars:,} (attach a part of it)")
    return Attachment(name=name, size=len(data), media_kind=kind, text=text,
                      sha256=hashlib.sha256(data).hexdigest(), encoding=encoding)


def decode_text(name: str, data: bytes) -> tuple[str, str]:
    """(text, encoding) of a text file's bytes: UTF-8, or UTF-16 with its mark; DocumentError otherwise."""
    for bom, codec in ((codecs.BOM_UTF16_LE, "utf-16-le"), (codecs.BOM_UTF16_BE, "utf-16-be")):
        if data.startswith(bom) and not data.startswith(codecs.BOM_UTF32_LE):
            try:
                return data[len(bom):].decode(codec), codec
            except UnicodeDecodeError as e:
                raise DocumentError(f"{name}: starts with a UTF-16 mark but is not valid UTF-16 "
                                    f"(at byte {e.start + len(bom):,}); save it as UTF-8") from None
    head = data[:SNIFF_BYTES]
    for magic, what in BINARY_MAGIC:
        if head.startswith(magic):
            raise DocumentError(f"{name}: is {what}, not text; only text files and PDFs can be attached")
    if b"\x00" in head:
        raise DocumentError(f"{name}: is a binary file (it has NUL bytes), not text; only text files and PDFs "
                            "can be attached")
    body = data[len(codecs.BOM_UTF8):] if data.startswith(codecs.BOM_UTF8) else data
    try:
        return body.decode("utf-8"), "utf-8"
    except UnicodeDecodeError as e:
        offset = e.start + (len(data) - len(body))
        line = data[:offset].count(b"\n") + 1
        raise DocumentError(f"{name}: is not UTF-8 text (byte 0x{data[offset]:02x} on line {line:,}; perhaps "
                            "Latin-1 or Windows-1252); save it as UTF-8 and attach it again") from None
