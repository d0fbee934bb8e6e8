"""`python -m app.tools.attachment_shots WIDTHxHEIGHT OUT.png`: the window with an attached PDF, as it opens on
a screen of that size (docs/documents.md's pictures).

As app/tools/screen_size_shots.py (its offscreen screen, a temporary data dir, the default model): a question
sent with a two-page PDF attached and answered, and a second file on the composer, not yet sent, so both kinds
of chip and the context label's "+ N attached" show:

    python -m app.tools.attachment_shots 1440x900 docs/documents-1440x900.png
    python -m app.tools.attachment_shots 1024x700 docs/documents-1024x700.png
"""

from __future__ import annotations

import asyncio
import io
import logging
import sys
import tempfile
from pathlib import Path

from app.tools.screen_size_shots import _settle, run_at_size, save_window

log = logging.getLogger(__name__)

PAGES = ["Zorbia: a short report\nZorbia is a small country between two rivers.\nThe capital of Zorbia is Quellton.",
         "Trade\nZorbia sells wool, cheese and clocks.\nIts clocks are known for their green faces."]
QUESTION = "What is the capital of Zorbia, according to the report?"


def sample_pdf(pages: list[str]) -> bytes:
    """A small PDF with a text layer (Helvetica), one page per item, lines split on newlines."""
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>",
               f"<< /Type /Pages /Kids [{' '.join(f'{3 + 2 * i} 0 R' for i in range(len(pages)))}] "
               f"/Count {len(pages)} >>".encode()]
    font = 3 + 2 * len(pages)
    for i, page in enumerate(pages):
        lines = [ln.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)") for ln in page.split("\n")]
        stream = "\n".join(["BT", "/F1 12 Tf", "14 TL", "72 720 Td"] + [f"({ln}) Tj T*" for ln in lines] + ["ET"])
        objects.append(f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents {4 + 2 * i} 0 R "
                       f"/Resources << /Font << /F1 {font} 0 R >> >> >>".encode())
        objects.append(b"<< /Length %d >>\nstream\n%s\nendstream" % (len(stream), stream.encode("latin-1")))
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    out, offsets = io.BytesIO(), []
    out.write(b"%PDF-1.4\n")
    for number, body in enumerate(objects, start=1):
        offsets.append(out.tell())
        out.write(b"%d 0 obj\n%s\nendobj\n" % (number, body))
    xref = out.tell()
    out.write(b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1))
    out.write(b"".join(b"%010d 00000 n \n" % off for off in offsets))
    out.write(b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref))
    return out.getvalue()


async def _shoot(out: Path) -> None:
    from app.lifecycle import close_session, open_session

    folder = Path(tempfile.mkdtemp(prefix="logitlab-attach-"))
    report = folder / "zorbia-report.pdf"
    report.write_bytes(sample_pdf(PAGES))
    notes = folder / "notes.md"
    notes.write_text("# Notes\n\n- ask about the clocks\n- and the rivers\n")
    session = open_session("light")
    window = session.window
    try:
        window.start(None, None)
        await window.host.wait_engine()
        window.settings.apply_preset("Balanced")
        window.settings.update_sampler(seed=7, temperature=0.0)
        window.settings.set_max_new_tokens(48)
        conv = window.library.new()  # the conversation the question is sent in
        composer = window.chat.composer
        if not composer.attach_file(str(report)):
            raise RuntimeError(composer.attach_error.text())
        composer.edit.setPlainText(QUESTION)
        composer.submit()
        for _ in range(600):  # the answer: at most a minute on two busy cores
            await asyncio.sleep(0.1)
            path = conv.path()
            if len(path) == 2 and not path[-1].generating and not window.controller.busy:
                break
        composer.attach_file(str(notes))
        window.view_options.set_heatmap(True)
        window.status.clearMessage()
        await _settle(1.0)
        save_window(window, out)
    finally:
        await close_session(session)


def main(argv: list[str]) -> int:
    return run_at_size(argv, _shoot)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
