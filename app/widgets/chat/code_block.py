"""Code in a rendered answer: a framed background, syntax highlighting (Pygments) and a Copy button per block.

Qt's Markdown importer turns a fenced block into plain monospace lines
(`BlockCodeFence`, `BlockCodeLanguage`). `decorate_code_blocks` replaces each
run of such lines with a frame (background and border from the Pygments
style) holding a header line, where the Copy button sits, and the code,
coloured by Pygments' lexer for the fence's language. Only text and
character formats are made: nothing of the model's text becomes markup.
`CopyButtons` keeps one button per block over the text, where the layout
puts the block's header.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import lru_cache

from pygments.lexer import Lexer
from pygments.lexers import get_lexer_by_name
from pygments.style import StyleMeta
from pygments.styles import get_style_by_name
from pygments.token import Token, _TokenType
from pygments.util import ClassNotFound
from PySide6.QtCore import QObject, QTimer
from PySide6.QtGui import (
    QBrush,
    QColor,
    QFont,
    QFontDatabase,
    QGuiApplication,
    QTextBlock,
    QTextBlockFormat,
    QTextCharFormat,
    QTextCursor,
    QTextDocument,
    QTextFormat,
    QTextFrame,
    QTextFrameFormat,
)
from PySide6.QtWidgets import QTextEdit, QToolButton

log = logging.getLogger(__name__)

LIGHT_STYLE, DARK_STYLE = "default", "github-dark"
MAX_HIGHLIGHT_CHARS = 60_000  # past this a block is shown uncoloured: lexing it would stall the UI thread
FRAME_PADDING = 6
COPIED_MS = 1500


@dataclass(frozen=True)
class CodeBlock:
    """One decorated block: its frame in the document, its language ("" when the fence names none) and its code."""

    frame: QTextFrame
    language: str
    code: str


def is_code(block: QTextBlock) -> bool:
    fmt = block.blockFormat()
    return fmt.hasProperty(QTextFormat.Property.BlockCodeFence) or fmt.nonBreakableLines()


@lru_cache(maxsize=64)
def lexer_for(language: str) -> Lexer | None:
    """Pygments' lexer for a fence's language ("py", "c++", "js"…), None when it knows none."""
    name = language.strip().split()[0].lower() if language.strip() else ""
    if not name:
        return None
    try:
        # Keep the text exactly as given: indices must match the document's.
        return get_lexer_by_name(name, stripnl=False, stripall=False, ensurenl=False)
    except ClassNotFound:
        return None


@lru_cache(maxsize=2)
def _style(dark: bool) -> StyleMeta:
    return get_style_by_name(DARK_STYLE if dark else LIGHT_STYLE)


@lru_cache(maxsize=512)
def _token_format(dark: bool, ttype: _TokenType) -> QTextCharFormat:
    spec = _style(dark).style_for_token(ttype)
    fmt = QTextCharFormat()
    if spec["color"]:
        fmt.setForeground(QColor("#" + spec["color"]))
    if spec["bold"]:
        fmt.setFontWeight(QFont.Weight.Bold)
    if spec["italic"]:
        fmt.setFontItalic(True)
    return fmt


def highlight_spans(code: str, language: str, dark: bool) -> list[tuple[int, int, QTextCharFormat]]:
    """(start, length, format) for the coloured runs of `code`; none for an unknown language or a huge block."""
    lexer = lexer_for(language)
    if lexer is None or len(code) > MAX_HIGHLIGHT_CHARS:
        return []
    spans = []
    try:
        for start, ttype, value in lexer.get_tokens_unprocessed(code):
            fmt = _token_format(dark, ttype)
            if value and fmt.properties():
                spans.append((start, len(value), fmt))
    except Exception as e:  # noqa: BLE001 - a lexer bug must not lose the answer: it is shown uncoloured
        log.warning("highlighting %s failed: %s", language, e)
        return []
    return spans


def code_colors(dark: bool) -> tuple[QColor, QColor]:
    """(background, text) of code blocks in this scheme."""
    style = _style(dark)
    text = style.style_for_token(Token.Text)["color"]
    return QColor(style.background_color), QColor("#" + text) if text else QColor("#1f2328")


def decorate_code_blocks(doc: QTextDocument, dark: bool, header_color: QColor) -> list[CodeBlock]:
    """Frame, colour and head every code block of a document Qt made from Markdown; returns them in order."""
    groups: list[tuple[QTextBlock, QTextBlock]] = []
    block, first = doc.begin(), None
    while block.isValid():
        if is_code(block):
            first = first or block
            last = block
        elif first is not None:
            groups.append((first, last))
            first = None
        block = block.next()
    if first is not None:
        groups.append((first, last))
    if not groups:
        return []
    background, text_color = code_colors(dark)
    mono = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont)
    out = []
    cursor = QTextCursor(doc)
    cursor.beginEditBlock()
    for first, last in reversed(groups):  # from the end: earlier positions stay valid
        out.append(_decorate(cursor, first, last, background, text_color, header_color, mono, dark))
    cursor.endEditBlock()
    return out[::-1]


def _decorate(cursor: QTextCursor, first: QTextBlock, last: QTextBlock, background: QColor, text_color: QColor,
              header_color: QColor, mono: QFont, dark: bool) -> CodeBlock:
    lines, block = [], first
    while True:
        lines.append(block.text())
        if block == last:
            break
        block = block.next()
    code = "\n".join(lines)
    language = str(first.blockFormat().property(QTextFormat.Property.BlockCodeLanguage) or "")
    indent = first.blockFormat().indent()
    cursor.setPosition(first.position())
    cursor.setPosition(last.position() + last.length() - 1, QTextCursor.MoveMode.KeepAnchor)
    cursor.removeSelectedText()

    frame_fmt = QTextFrameFormat()
    frame_fmt.setBackground(background)
    frame_fmt.setBorder(1)
    frame_fmt.setBorderBrush(QBrush(header_color))
    frame_fmt.setBorderStyle(QTextFrameFormat.BorderStyle.BorderStyle_Solid)
    frame_fmt.setPadding(FRAME_PADDING)
    frame_fmt.setTopMargin(4)
    frame_fmt.setBottomMargin(4)
    frame_fmt.setLeftMargin(indent * cursor.document().indentWidth())
    frame = cursor.insertFrame(frame_fmt)

    header = QTextCharFormat()
    header.setFont(QGuiApplication.font())
    header.setFontPointSize(max(6.0, QGuiApplication.font().pointSizeF() * 0.85))
    header.setForeground(header_color)
    head_fmt = QTextBlockFormat()
    head_fmt.setBottomMargin(2)
    cursor.setBlockFormat(head_fmt)
    cursor.insertText(language.split()[0] if language.strip() else "code", header)

    # A long line wraps inside the frame: one that widened it would run past the answer's column,
    # clipped with the Copy button (the answer does not scroll sideways).
    line_fmt = QTextBlockFormat()
    plain = QTextCharFormat()
    plain.setFont(mono)
    plain.setFontFixedPitch(True)
    plain.setForeground(text_color)
    cursor.insertBlock(line_fmt, plain)
    start = cursor.position()
    cursor.insertText(code, plain)  # "\n" becomes a new block with the same formats
    for offset, length, fmt in highlight_spans(code, language, dark):
        cursor.setPosition(start + offset)
        cursor.setPosition(start + offset + length, QTextCursor.MoveMode.KeepAnchor)
        cursor.mergeCharFormat(fmt)
    _hide_empty_neighbours(frame)
    return CodeBlock(frame, language, code)


def _hide_empty_neighbours(frame: QTextFrame) -> None:
    """The empty lines the frame leaves before and after it take no room (the frame has its margins)."""
    doc = frame.document()
    for pos in (frame.firstPosition() - 1, frame.lastPosition() + 1):
        block = doc.findBlock(pos)
        if block.isValid() and not block.text() and block.position() not in range(frame.firstPosition(), frame.lastPosition() + 1):
            fmt = block.blockFormat()
            fmt.setLineHeight(0, QTextBlockFormat.LineHeightTypes.FixedHeight.value)
            fmt.setTopMargin(0)
            fmt.setBottomMargin(0)
            QTextCursor(block).setBlockFormat(fmt)


class CopyButtons(QObject):
    """A Copy button over each code block's header line, kept in place as the text lays out again."""

    def __init__(self, view: QTextEdit):
        super().__init__(view)
        self._view = view
        self._buttons: list[QToolButton] = []
        self._blocks: list[CodeBlock] = []

    @property
    def buttons(self) -> list[QToolButton]:
        return self._buttons[: len(self._blocks)]

    def show_for(self, blocks: list[CodeBlock]) -> None:
        self._blocks = list(blocks)
        while len(self._buttons) < len(blocks):
            self._buttons.append(self._make_button(len(self._buttons)))
        for i, button in enumerate(self._buttons):
            button.setVisible(i < len(blocks))
        self.reposition()

    def _make_button(self, i: int) -> QToolButton:
        b = QToolButton(self._view.viewport())
        b.setText("Copy")
        b.setToolTip("Copy this code")
        b.setAccessibleName("Copy code")
        b.setAutoRaise(True)
        b.clicked.connect(lambda: self._copy(i))
        return b

    def _copy(self, i: int) -> None:
        if i >= len(self._blocks):
            return
        QGuiApplication.clipboard().setText(self._blocks[i].code)
        button = self._buttons[i]
        button.setText("Copied")
        QTimer.singleShot(COPIED_MS, button, lambda: button.setText("Copy"))  # not after the button is gone

    def reposition(self) -> None:
        layout = self._view.document().documentLayout()
        dx = self._view.horizontalScrollBar().value()
        dy = self._view.verticalScrollBar().value()
        for block, button in zip(self._blocks, self._buttons):
            rect = layout.frameBoundingRect(block.frame)
            button.adjustSize()
            right = min(int(rect.right()), self._view.viewport().width() - 1)
            x = right - button.width() - 3 - dx
            y = int(rect.top()) + 3 - dy
            button.move(max(0, x), max(0, y))
            button.raise_()

