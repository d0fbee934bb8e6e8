"""What an attached file is once read: its name, size, kind, text, and the SHA-256 of its bytes."""

from __future__ import annotations

from dataclasses import dataclass

# A file larger than this is refused before it is read (a 500 MB log would fill memory and no context holds it).
MAX_BYTES = 20 * 1024 * 1024
# Text longer than this is refused after extraction (a small PDF can hold megabytes of text): about 250,000
# tokens, past any context the default models have, and the token count of it alone would take seconds.
MAX_CHARS = 1_000_000

# The kinds an attachment can be; the window's chip and the fence's language come from it.
MEDIA_KINDS = ("text", "markdown", "code", "csv", "json", "pdf")


class DocumentError(ValueError):
    """A file that cannot be attached, said in one line that names the file and what to do."""


@dataclass(frozen=True)
class Attachment:
    """One attached file. Content-addressed: `sha256` is of the file's bytes as read (a PDF's, not its text's),
    so the same file attached twice, or on two branches of a chat, is one stored document."""

    name: str  # the file's name without its folder: what the model and the chip see
    size: int  # bytes of the file
    media_kind: str  # one of MEDIA_KINDS
    text: str  # what the model reads (a PDF's extracted text)
    sha256: str  # hex digest of the file's bytes
    encoding: str = "utf-8"  # how the bytes were decoded ("pdf" for a PDF's extracted text)

    def __post_init__(self) -> None:
        if self.media_kind not in MEDIA_KINDS:
            raise ValueError(f"unknown media kind {self.media_kind!r}")

    def size_text(self) -> str:
        """'812 B', '14.2 KB', '3.1 MB': the chip's size."""
        if self.size < 1024:
            return f"{self.size} B"
        if self.size < 1024 * 1024:
            return f"{self.size / 1024:.1f} KB"
        return f"{self.size / (1024 * 1024):.1f} MB"

    def to_dict(self) -> dict:
        return {"name": self.name, "size": self.size, "media_kind": self.media_kind, "text": self.text,
                "sha256": self.sha256, "encoding": self.encoding}

    @classmethod
    def from_dict(cls, data: dict) -> Attachment:
        return cls(name=str(data["name"]), size=int(data["size"]), media_kind=str(data["media_kind"]),
                   text=str(data["text"]), sha256=str(data["sha256"]), encoding=str(data.get("encoding", "utf-8")))
