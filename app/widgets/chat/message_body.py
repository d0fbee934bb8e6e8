"""The text of one message: plain (user), Markdown (assistant), or tokens coloured by a metric.

Built for streaming. Tokens are appended at the end of the document (cheap:
no re-layout of what is above). Markdown cannot be parsed piecewise, so while
an answer streams the new text is appended plainly and the whole message is
re-rendered as Markdown at most every `_md_interval_ms` (which adapts to how
long a render takes), and once more when the answer ends: a 4,000-token
answer does not re-parse its Markdown per token.

Code blocks get a background, Pygments colours and a Copy button
(`code_block`). In the token view a line breaks only between tokens, never
inside one ("<h" / "2>"): a zero-width space joins tokens; inside a token
spaces are no-break spaces and a word joiner holds every other break
opportunity shut (copying gives the tokens' own text back).

Only what can be read is drawn: a message longer than `TEXT_PAGE_CHARS`
characters (or `TOKEN_PAGE` tokens in the token view) shows its beginning
and a "Show more" link that draws the next page (an answer streaming in is
drawn as it comes, up to `STREAM_PAGES` pages), a single token is shown
cut to `TOKEN_CHARS` characters, and a run of text with nowhere to break a
line gets a zero-width break every `BREAK_EVERY` characters. Qt lays out a
line without break opportunities in time quadratic in its length: an 800k
character answer without a space froze the window 14 s, a 5 MB token for
over 13 minutes.

A model's text is shown as text: Markdown without raw HTML (a `<div>` in an
answer is a tag written out, not markup that swallows the rest), no resource
is ever loaded (an image path names a local file), and a link opens only as
http(s), after the user has seen its address (`model_links`).
"""

from __future__ import annotations

import bisect
import math
import re
import time
from collections.abc import Sequence

from engine import TokenEvent
from PySide6.QtCore import QEvent, QMimeData, QPoint, QPointF, QSizeF, Qt, QTextBoundaryFinder, QTimer, QUrl, Signal
from PySide6.QtGui import QColor, QFont, QMouseEvent, QPalette, QResizeEvent, QTextCharFormat, QTextCursor, QTextDocument
from PySide6.QtWidgets import QFrame, QSizePolicy, QTextBrowser, QTextEdit, QToolTip, QWidget

from app.theme import is_dark
from app.widgets.chat.code_block import CodeBlock, CopyButtons, decorate_code_blocks
from app.widgets.fmt import completed_character, finished_characters, token_label, token_tooltip
from app.widgets.heat import confidence, heat_color
from app.widgets.chat.model_links import link_tooltip, offer_to_open

EOS_MARK = "⟨eos⟩"
STEP_BACK_COLOR = "#d9822b"  # the wavy underline of a token where a banned string made the answer step back
TEXT_PAGE_CHARS = 20_000  # characters of a plain or Markdown message drawn per page
TOKEN_PAGE = 2_000  # tokens drawn per page in the token view
STREAM_PAGES = 10  # an answer streaming in stays drawn whole up to this many pages (then "Show more")
TOKEN_CHARS = 200  # a token longer than this shows its beginning and how long it is
BREAK_EVERY = 200  # characters without a break opportunity before a zero-width break is put in
MORE_HREF = "logitlab-show:more"  # the "Show more" link's address (never opened: it draws the next page)
MD_MIN_INTERVAL_MS = 250
MD_MAX_INTERVAL_MS = 1000
# GitHub's dialect, but HTML in the text stays text: a model's "<div>" or "vector<int>" is not markup.
MD_FEATURES = QTextDocument.MarkdownFeature.MarkdownDialectGitHub | QTextDocument.MarkdownFeature.MarkdownNoHTML


BETWEEN_TOKENS = "\u200b"  # zero-width space: a line may break here, between two tokens
INSIDE_TOKEN = "\u2060"  # word joiner: a line may not break here, inside a token
# A space in a token is shown as a no-break space: a line may break before " the" (after the
# zero-width space) but not inside it, which a plain space would allow (the break goes after spaces).
NO_BREAK_SPACE = "\u00a0"
_LAYOUT_CHARS = str.maketrans({BETWEEN_TOKENS: None, INSIDE_TOKEN: None, NO_BREAK_SPACE: " "})
_LONG_RUN = re.compile(r"\S{%d,}" % (BREAK_EVERY + 1))
_FENCE = re.compile(r" {0,3}(`{3,}|~{3,})")  # a Markdown code fence opening or closing a block


def breakable(text: str) -> str:
    """`text` with a zero-width space every `BREAK_EVERY` characters of a run without whitespace, so a line
    can break there (a 800k-character run cost Qt 14 s to lay out; cut in pieces it is linear). Code blocks and
    addresses are left whole: their text is copied and followed as it is (a page of them lays out in well
    under a second)."""
    if len(text) <= BREAK_EVERY or not _LONG_RUN.search(text):
        return text

    def cut(m: re.Match) -> str:
        run = m.group(0)
        if "://" in run:
            return run
        return BETWEEN_TOKENS.join(run[i : i + BREAK_EVERY] for i in range(0, len(run), BREAK_EVERY))

    out, fence = [], ""
    for line in text.splitlines(keepends=True):
        opener = _FENCE.match(line)
        if opener and (not fence or opener.group(1).startswith(fence)):
            fence = "" if fence else opener.group(1)
            out.append(line)
        else:
            out.append(line if fence else _LONG_RUN.sub(cut, line))
    return "".join(out)


def elided(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, saying how long it was."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text):,} characters)"


def display_text(ev: TokenEvent) -> str:
    """What a token looks like in the token view: newlines get a visible ↵, EOS a marker."""
    if ev.special:
        return EOS_MARK
    text = token_label(ev.token_text, ev.token_bytes) or "∅"  # a piece of a character shows its bytes
    return elided(text, TOKEN_CHARS).replace("\n", "↵\n")


def unbreakable(text: str) -> str:
    """`text` with a word joiner at each place a line could break inside it (after a space, between
    ideographs, after a slash…), so a token stays on one line. Line ends (↵) still end lines."""
    if len(text) < 2 or (text.isascii() and text.isalnum()):  # no break inside "hello"; there is in "世界"
        return text
    text = text.replace(" ", NO_BREAK_SPACE)
    finder = QTextBoundaryFinder(QTextBoundaryFinder.BoundaryType.Line, text)
    out, last = [], 0
    pos = finder.toNextBoundary()
    while 0 < pos < len(text):
        if text[pos - 1] != "\n":
            out.append(text[last:pos])
            out.append(INSIDE_TOKEN)
            last = pos
        pos = finder.toNextBoundary()
    out.append(text[last:])
    return "".join(out)


def without_layout_chars(text: str) -> str:
    """The token view's text as the tokens spell it (the joiners that steer line breaks removed)."""
    return text.translate(_LAYOUT_CHARS)


class MessageBody(QTextBrowser):
    """Read-only, grows to fit its text (the chat view scrolls, not each message)."""

    token_clicked = Signal(int)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        # Links never navigate by themselves (a file: or relative link would replace the answer with a
        # local file; others would go straight to the OS): `_on_anchor_clicked` decides.
        self.setOpenLinks(False)
        self.setOpenExternalLinks(False)
        self.anchorClicked.connect(self._on_anchor_clicked)
        self.highlighted.connect(self._on_link_hovered)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setFocusPolicy(Qt.FocusPolicy.ClickFocus)
        self.viewport().setMouseTracking(True)
        # Opaque: a streamed token then repaints only this text, not every ancestor behind it
        # (a transparent body made the message, the column and the scroll area repaint per token).
        self.viewport().setAutoFillBackground(True)
        self.set_background_role(QPalette.ColorRole.Window)
        self.document().setDocumentMargin(2)
        self.document().documentLayout().documentSizeChanged.connect(self._fit_height)
        self.setFixedHeight(self.fontMetrics().lineSpacing() + 8)

        self.mode = "plain"  # plain | markdown | tokens
        self._heat_mode = "probability"
        self._dark = False
        self.steering_kl: Sequence[float] | None = None  # per answer token, for the "steering" colouring
        self._tokens: list[TokenEvent] = []  # every token given; the first len(_starts) are drawn
        self._starts: list[int] = []  # document position where token i begins
        self._limit = 0  # characters (plain, Markdown) or tokens drawn; more after "Show more"
        self._more_at: int | None = None  # document position of the "Show more" line, when there is one
        self._selected: int | None = None
        self._hovered: int | None = None
        self._text = ""  # everything shown in plain/markdown mode
        self._byte_run = b""  # bytes of the partial-character tokens since the last whole character
        self._md_interval_ms = MD_MIN_INTERVAL_MS
        self._md_stale = False  # text appended plainly since the last Markdown render
        self._md_timer = QTimer(self)
        self._md_timer.setSingleShot(True)
        self._md_timer.timeout.connect(self._render_markdown)
        self.markdown_renders = 0  # for tests and the benchmark
        self.code_blocks: list[CodeBlock] = []  # the rendered Markdown's code blocks, in order
        self.copy_buttons = CopyButtons(self)

    def set_background_role(self, role: QPalette.ColorRole) -> None:
        """The palette colour behind the text (the window's, or the user bubble's); follows theme changes."""
        self.viewport().setBackgroundRole(role)

    # -- whole-message rendering -----------------------------------------------------------

    def show_plain(self, text: str) -> None:
        self._reset("plain")
        self._text = text
        self._render_plain()

    def _render_plain(self) -> None:
        self._more_at = None
        self.setPlainText(breakable(self._text[: self._limit]))
        self._show_more_line()

    def show_markdown(self, text: str) -> None:
        self._reset("markdown")
        self._text = text
        self._render_markdown()

    def show_tokens(self, tokens: list[TokenEvent], heat_mode: str, dark: bool) -> None:
        self._reset("tokens")
        self._heat_mode, self._dark = heat_mode, dark
        self.clear()
        self._append_tokens(tokens)
        self._update_highlight()

    def _reset(self, mode: str) -> None:
        self._md_timer.stop()
        self._md_stale = False
        self.setExtraSelections([])  # a token highlight from the token view
        self.mode = mode
        self._limit = TOKEN_PAGE if mode == "tokens" else TEXT_PAGE_CHARS
        self._more_at = None
        self._tokens, self._starts, self._text = [], [], ""
        self._byte_run = b""
        self._hovered = None
        self.code_blocks = []
        self.copy_buttons.show_for([])

    # -- streaming -------------------------------------------------------------------------

    @property
    def rendered_tokens(self) -> int:
        return len(self._tokens)

    @property
    def rendered_text(self) -> str:
        return self._text

    def append_tokens(self, tokens: list[TokenEvent]) -> None:
        """Add tokens at the end (token mode): drawn as they stream in while all before them are."""
        if not self.hidden:
            self._limit = max(self._limit, min(len(self._tokens) + len(tokens), STREAM_PAGES * TOKEN_PAGE))
        self._append_tokens(tokens)

    def append_text(self, text: str) -> None:
        """Add streamed text at the end (Markdown mode): plain now, rendered as Markdown soon."""
        if not text:
            return
        if not self.hidden:  # streaming in: drawn as it comes, up to a few pages
            self._limit = max(self._limit, min(len(self._text) + len(text), STREAM_PAGES * TEXT_PAGE_CHARS))
        room = self._limit - len(self._text)  # past the page the text waits for "Show more" (the render says so)
        self._text += text
        self._md_stale = True
        if room > 0 and self._more_at is None:
            cursor = QTextCursor(self.document())
            cursor.movePosition(QTextCursor.MoveOperation.End)
            cursor.insertText(text[:room], QTextCharFormat())
        if not self._md_timer.isActive():
            self._md_timer.start(self._md_interval_ms)

    def finish(self) -> None:
        """The answer ended: render the final Markdown now."""
        if self.mode == "markdown" and self._md_stale:
            self._md_timer.stop()
            self._render_markdown()

    def _render_markdown(self) -> None:
        t0 = time.perf_counter()
        self._md_stale = False
        # The frames of the code blocks go with the old text: forget them first (a relayout while the
        # new text goes in would place the Copy buttons over freed frames).
        self.code_blocks = []
        self.copy_buttons.show_for([])
        self._more_at = None
        self.document().setMarkdown(breakable(self._text[: self._limit]), MD_FEATURES)
        pal = self.palette()
        self.code_blocks = decorate_code_blocks(self.document(), is_dark(pal), pal.color(QPalette.ColorRole.PlaceholderText))
        self._show_more_line()
        self.copy_buttons.show_for(self.code_blocks)
        cost_ms = (time.perf_counter() - t0) * 1000
        self.markdown_renders += 1
        # Spend at most ~10 % of the UI thread on re-rendering a growing answer.
        self._md_interval_ms = int(min(MD_MAX_INTERVAL_MS, max(MD_MIN_INTERVAL_MS, cost_ms * 10)))

    def _append_tokens(self, tokens: list[TokenEvent]) -> None:
        if not tokens:
            return
        self._tokens.extend(tokens)
        self._draw_tokens()

    def _draw_tokens(self) -> None:
        """Draw the tokens given but not drawn yet, up to the page limit; the rest wait behind "Show more"."""
        first = len(self._starts)
        todo = self._tokens[first : self._limit]
        if todo:
            self._drop_more_line()
            cursor = QTextCursor(self.document())
            cursor.movePosition(QTextCursor.MoveOperation.End)
            cursor.beginEditBlock()
            for ev in todo:
                self._starts.append(cursor.position())
                text = unbreakable(display_text(ev) + self._characters_finished_by(ev))
                cursor.insertText(BETWEEN_TOKENS + text if self._starts[0] != cursor.position() else text, self._token_format(ev))
            cursor.endEditBlock()
        if len(self._tokens) > len(self._starts):
            self._show_more_line()
        # Re-highlight when the selected token was just drawn, or was the last one: its span ran to the
        # end of the document and the highlight's cursor grew with the text appended after it.
        if todo and self._selected is not None and first - 1 <= self._selected < len(self._starts):
            self._update_highlight()

    # -- pages -----------------------------------------------------------------------------

    @property
    def hidden(self) -> int:
        """How many characters (tokens in the token view) are not drawn yet."""
        if self.mode == "tokens":
            return len(self._tokens) - len(self._starts)
        return max(0, len(self._text) - self._limit)

    def show_more(self) -> None:
        """Draw the next page of a long message."""
        if not self.hidden:
            return
        if self.mode == "tokens":
            self._limit += TOKEN_PAGE
            self._draw_tokens()
        else:
            self._limit += TEXT_PAGE_CHARS
            self._render_plain() if self.mode == "plain" else self._render_markdown()

    def _show_more_line(self) -> None:
        """The "Show more" link at the end, saying how much is not drawn (replaced if it is there)."""
        self._drop_more_line()
        n = self.hidden
        if not n:
            return
        unit = "tokens" if self.mode == "tokens" else "characters"
        cursor = QTextCursor(self.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        self._more_at = cursor.position()
        link = QTextCharFormat()
        link.setAnchor(True)
        link.setAnchorHref(MORE_HREF)
        link.setFontUnderline(True)
        link.setForeground(self.palette().color(QPalette.ColorRole.Link))
        cursor.insertBlock()
        cursor.insertText(f"Show more ({n:,} {unit} not shown)", link)

    def _drop_more_line(self) -> None:
        if self._more_at is None:
            return
        cursor = QTextCursor(self.document())
        cursor.setPosition(self._more_at)
        cursor.movePosition(QTextCursor.MoveOperation.End, QTextCursor.MoveMode.KeepAnchor)
        cursor.removeSelectedText()
        self._more_at = None

    def _characters_finished_by(self, ev: TokenEvent) -> str:
        """After the bytes of the token that completes a character, the character itself: <98><80>😀."""
        if ev.token_bytes is None:
            self._byte_run = b""
            return ""
        self._byte_run += ev.token_bytes
        done = finished_characters(self._byte_run)
        if done is None:
            return ""
        self._byte_run = b""
        return done

    def _token_format(self, ev: TokenEvent) -> QTextCharFormat:
        fmt = QTextCharFormat()
        kl = self.steering_kl
        known = float(kl[ev.index]) if kl is not None and 0 <= ev.index < len(kl) else None
        fmt.setBackground(heat_color(confidence(ev, self._heat_mode, known), self._dark))
        if ev.special:
            fmt.setFontItalic(True)
            fmt.setForeground(self.palette().color(QPalette.ColorRole.PlaceholderText))
        if ev.forced:
            fmt.setFontUnderline(True)
            fmt.setUnderlineStyle(QTextCharFormat.UnderlineStyle.DashUnderline)
        elif ev.constraint is not None and ev.constraint.forced:  # the grammar left one token: nothing was chosen
            fmt.setFontUnderline(True)
            fmt.setUnderlineStyle(QTextCharFormat.UnderlineStyle.DotLine)
        if ev.rewind is not None:  # a banned string made the answer step back here: the tooltip says which
            fmt.setUnderlineStyle(QTextCharFormat.UnderlineStyle.WaveUnderline)
            fmt.setUnderlineColor(QColor(STEP_BACK_COLOR))
        return fmt

    def visible_text(self) -> str:
        """The text as shown (in the token view, without the zero-width characters that steer line breaks)."""
        return without_layout_chars(self.toPlainText())

    def createMimeDataFromSelection(self) -> QMimeData:  # noqa: N802 - Qt's name
        """Copied text is the tokens' text, not the joiners between and inside them."""
        data = super().createMimeDataFromSelection()
        if self.mode == "tokens":
            plain = QMimeData()
            plain.setText(without_layout_chars(data.text()))
            return plain
        if BETWEEN_TOKENS in data.text():  # the breaks put into a long run of text are not the model's
            plain = QMimeData()
            plain.setText(data.text().replace(BETWEEN_TOKENS, ""))
            return plain
        return data

    # -- selection and hover (token mode) --------------------------------------------------

    def set_selected(self, index: int | None) -> None:
        if index != self._selected:
            self._selected = index
            if self.mode == "tokens" and index is not None and len(self._starts) <= index < len(self._tokens):
                self._limit = index + 1 + TOKEN_PAGE  # a token chosen elsewhere (the loom, the inspector) is drawn
                self._draw_tokens()
            self._update_highlight()

    def token_span(self, index: int) -> tuple[int, int]:
        """Document positions [start, end) of token `index`."""
        start = self._starts[index]
        if index + 1 < len(self._starts):
            end = self._starts[index + 1]
        else:
            end = self._more_at if self._more_at is not None else self.document().characterCount() - 1
        return start, end

    def token_rect(self, index: int) -> QPoint:
        """Viewport point inside token `index` (tests click there)."""
        start, end = self.token_span(index)
        cursor = QTextCursor(self.document())
        cursor.setPosition(start + max(0, (end - start) // 2))
        return self.cursorRect(cursor).center()

    def token_at(self, pos: QPoint) -> int | None:
        if self.mode != "tokens" or not self._starts:
            return None
        hit = self.document().documentLayout().hitTest(QPointF(pos), Qt.HitTestAccuracy.ExactHit)
        if hit < 0 or (self._more_at is not None and hit >= self._more_at):
            return None
        i = bisect.bisect_right(self._starts, hit) - 1
        return i if 0 <= i < len(self._starts) else None

    def _update_highlight(self) -> None:
        selections = []
        i = self._selected
        if self.mode == "tokens" and i is not None and 0 <= i < len(self._starts):
            start, end = self.token_span(i)
            sel = QTextEdit.ExtraSelection()
            sel.cursor = QTextCursor(self.document())
            sel.cursor.setPosition(start)
            sel.cursor.setPosition(end, QTextCursor.MoveMode.KeepAnchor)
            sel.format.setBackground(self.palette().color(QPalette.ColorRole.Highlight))
            sel.format.setForeground(self.palette().color(QPalette.ColorRole.HighlightedText))
            sel.format.setFontWeight(QFont.Weight.Bold)
            selections.append(sel)
        self.setExtraSelections(selections)

    def mouseMoveEvent(self, event: QMouseEvent) -> None:
        super().mouseMoveEvent(event)
        i = self.token_at(event.position().toPoint())
        if i != self._hovered:
            self._hovered = i
            if i is None:
                QToolTip.hideText()
                self.viewport().unsetCursor()
            else:
                self.viewport().setCursor(Qt.CursorShape.PointingHandCursor)
                QToolTip.showText(event.globalPosition().toPoint(), token_tooltip(self._tokens[i], character=completed_character(self._tokens, i)), self.viewport())

    def mouseReleaseEvent(self, event: QMouseEvent) -> None:
        super().mouseReleaseEvent(event)
        if event.button() == Qt.MouseButton.LeftButton and not self.textCursor().hasSelection():
            i = self.token_at(event.position().toPoint())
            if i is not None:
                self.token_clicked.emit(i)

    def leaveEvent(self, event: QEvent) -> None:
        self._hovered = None
        super().leaveEvent(event)

    # -- links and resources ---------------------------------------------------------------

    def _on_anchor_clicked(self, url: QUrl) -> None:
        if url.toString() == MORE_HREF:
            self.show_more()
            return
        offer_to_open(self, url)

    def _on_link_hovered(self, url: QUrl) -> None:
        if url.isEmpty():
            QToolTip.hideText()
        elif url.toString() == MORE_HREF:
            QToolTip.showText(self.cursor().pos(), "Draw the next part of this message", self.viewport())
        else:
            QToolTip.showText(self.cursor().pos(), link_tooltip(url), self.viewport())

    def loadResource(self, kind: int, name: QUrl | str) -> None:  # noqa: N802 - Qt's name
        """Nothing: an answer's image or style sheet would name a local file (or a path relative to ours)."""
        return None

    def changeEvent(self, event: QEvent) -> None:
        super().changeEvent(event)
        # Code blocks take their colours from light or dark: render them again in the new ones.
        if event.type() == event.Type.PaletteChange and self.mode == "markdown" and self.code_blocks:
            self._render_markdown()

    # -- size ------------------------------------------------------------------------------

    def _fit_height(self, size: QSizeF) -> None:
        h = math.ceil(size.height()) + 2 * self.frameWidth()
        if h != self.height():
            self.setFixedHeight(max(h, self.fontMetrics().lineSpacing() + 4))
        if self.code_blocks:
            self.copy_buttons.reposition()

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._fit_height(self.document().size())

