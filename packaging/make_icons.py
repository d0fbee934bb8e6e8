"""Render `resources/logitlab.svg` into the icons each platform's package needs.

Qt's SVG renderer draws the PNGs (no Inkscape or librsvg needed, and the
same renderer the window uses, so the icon looks the same everywhere);
Pillow packs them into a Windows `.ico` and a macOS `.icns`. Runs headless
(`QT_QPA_PLATFORM=offscreen` unless a platform is set).

    python packaging/make_icons.py [OUT_DIR]     # default: build/icons

Writes `logitlab-<size>.png` (16 … 1024), `logitlab.png` (256, the Linux
icon), `logitlab.ico` and `logitlab.icns`. Files newer than the SVG are kept.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SVG = ROOT / "resources" / "logitlab.svg"
DEFAULT_OUT = ROOT / "build" / "icons"
PNG_SIZES = (16, 24, 32, 48, 64, 128, 256, 512, 1024)
ICO_SIZES = (16, 24, 32, 48, 64, 128, 256)  # Windows uses 16-48 in lists and the task bar, 256 in Explorer
ICNS_SIZES = (16, 32, 64, 128, 256, 512, 1024)  # Pillow picks the icns slots (incl. @2x) from these
LINUX_SIZE = 256
OUTPUTS = ("logitlab.png", "logitlab.ico", "logitlab.icns")


def render_pngs(svg: Path, out: Path, sizes: tuple[int, ...] = PNG_SIZES) -> dict[int, Path]:
    """Draw `svg` at each size into `out/logitlab-<size>.png` with Qt; returns {size: path}."""
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import QRectF, Qt
    from PySide6.QtGui import QGuiApplication, QImage, QPainter
    from PySide6.QtSvg import QSvgRenderer

    _app = QGuiApplication.instance() or QGuiApplication([sys.argv[0]])  # QPainter on QImage needs one
    renderer = QSvgRenderer(str(svg))
    if not renderer.isValid():
        raise ValueError(f"{svg} is not an SVG Qt can render")
    paths = {}
    for size in sizes:
        image = QImage(size, size, QImage.Format.Format_ARGB32_Premultiplied)
        image.fill(Qt.GlobalColor.transparent)
        painter = QPainter(image)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        painter.setRenderHint(QPainter.RenderHint.SmoothPixmapTransform)
        renderer.render(painter, QRectF(0, 0, size, size))
        painter.end()
        path = out / f"logitlab-{size}.png"
        if not image.save(str(path), "PNG"):
            raise OSError(f"could not write {path}")
        paths[size] = path
    return paths


def pack_icons(pngs: dict[int, Path], out: Path) -> list[Path]:
    """Build `logitlab.ico`, `logitlab.icns` and `logitlab.png` from the rendered PNGs with Pillow."""
    from PIL import Image

    largest = Image.open(pngs[max(pngs)]).convert("RGBA")
    ico = out / "logitlab.ico"
    # Each size from its own rendering (sharper than letting Pillow downscale the largest one).
    ico_images = [Image.open(pngs[s]).convert("RGBA") for s in ICO_SIZES]
    ico_images[-1].save(ico, format="ICO", sizes=[(s, s) for s in ICO_SIZES], append_images=ico_images[:-1])
    icns = out / "logitlab.icns"
    largest.save(icns, format="ICNS", append_images=[Image.open(pngs[s]).convert("RGBA") for s in ICNS_SIZES[:-1]])
    linux = out / "logitlab.png"
    Image.open(pngs[LINUX_SIZE]).save(linux, format="PNG")
    return [linux, ico, icns]


def ensure_icons(out: Path = DEFAULT_OUT, svg: Path = SVG) -> dict[str, Path]:
    """Make the icons unless up to date; returns {"png": ..., "ico": ..., "icns": ...}."""
    out.mkdir(parents=True, exist_ok=True)
    targets = {name.rsplit(".", 1)[1]: out / name for name in OUTPUTS}
    fresh = all(p.is_file() and p.stat().st_mtime >= svg.stat().st_mtime for p in targets.values())
    if not fresh:
        pack_icons(render_pngs(svg, out), out)
    return targets


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    out = Path(args[0]) if args else DEFAULT_OUT
    for kind, path in ensure_icons(out).items():
        print(f"{kind:5} {path} ({path.stat().st_size:,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
