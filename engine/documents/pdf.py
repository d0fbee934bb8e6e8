"""A PDF's text layer, by pypdf (pure Python, BSD, kept up by its maintainers; no system library).

Pages are joined by a blank line. A PDF whose pages have no text at all (a scan: images of pages) is refused
in words, as is one that is encrypted with a password or that pypdf cannot parse: attaching no text, or a
broken half of it, would have the model answer about nothing.
"""

from __future__ import annotations

import io
import logging

from engine.documents.attachment import DocumentError


def pdf_text(name: str, data: bytes) -> str:
    """The text of every page of the PDF `data`; DocumentError for an encrypted, malformed or text-less PDF."""
    try:
        from pypdf import PdfReader
        from pypdf.errors import DependencyError, FileNotDecryptedError, PdfReadError
    except ImportError:  # pragma: no cover - pypdf is a plain dependency (pyproject.toml)
        raise DocumentError(f"{name}: reading PDFs needs the pypdf package (pip install pypdf)") from None
    # pypdf logs each repaired cross-reference table as a warning; a repaired file that reads is no news.
    logging.getLogger("pypdf").setLevel(logging.ERROR)
    try:
        reader = PdfReader(io.BytesIO(data), strict=False)
        if reader.is_encrypted:
            try:
                opened = reader.decrypt("")  # many PDFs are "encrypted" with an empty password, to forbid copying
            except DependencyError:
                raise DocumentError(f"{name}: is an encrypted PDF (AES) and reading it needs the `cryptography` "
                                    "package; or save an unencrypted copy") from None
            if not opened:
                raise DocumentError(f"{name}: is an encrypted PDF with a password; save an unencrypted copy "
                                    "to attach it")
        pages = [page.extract_text() or "" for page in reader.pages]
    except DocumentError:
        raise
    except FileNotDecryptedError:
        raise DocumentError(f"{name}: is an encrypted PDF with a password; save an unencrypted copy") from None
    except (PdfReadError, Exception) as e:  # noqa: BLE001 - a malformed file raises from deep inside the parser
        why = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
        raise DocumentError(f"{name}: is not a readable PDF ({why})") from None
    if not pages:
        raise DocumentError(f"{name}: is a PDF with no pages")
    text = "\n\n".join(page.strip() for page in pages)
    if not text.strip():
        raise DocumentError(f"{name}: has no text layer ({len(pages)} page{'s' if len(pages) != 1 else ''} of "
                            "images only: a scanned PDF?); run it through OCR first")
    return text
