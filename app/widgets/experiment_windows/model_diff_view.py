"""Compare models: the loaded model (A) and a second one (B) on one text, every token coloured by how far
the two models' next-token distributions are apart (KL(A‖B)).

The second model is loaded for this window only (app/controllers/model_diff.py `SecondModel`) and closed when
the window closes or another is picked; the memory both hold is shown under the picker. Hovering a token shows
both models' log-probs, ranks and top alternatives there; the list beside the text holds the largest
divergences. With two different tokenizers the text is compared by byte spans (summed log-prob per span,
coloured by |Δ log-prob|), since KL per token is not defined there.
"""

from __future__ import annotations

import asyncio
import html
import math
from pathlib import Path

from engine import BACKEND_TABLE, TokenEvent, backend_help, experiments, user_backends
from PySide6.QtCore import QSizeF, Qt, QTimer
from PySide6.QtGui import QCloseEvent, QMouseEvent
from PySide6.QtWidgets import (
    QComboBox, QFileDialog, QHBoxLayout, QLabel, QListWidget, QListWidgetItem, QPlainTextEdit, QProgressBar,
    QPushButton, QSizePolicy, QSplitter, QToolTip, QVBoxLayout, QWidget,
)

from app.controllers.engine_host import EngineHost
from app.state.database.store import Store
from app.controllers.model_diff import MemoryLine, ModelDiffRun, SecondModel, start_diff
from app.theme import is_dark
from app.widgets.escape_closes import close_on_escape
from app.widgets.fmt import human_bytes, pct, visible
from app.widgets.heat import HeatLegend
from app.widgets.chat.message_body import MessageBody
from app.widgets.dialogs.model_picker import recent_models
from app.widgets.experiment_windows.one_run import OneRun
from app.window_geometry import fit_to_screen

# Model B's backends: the engine's table's, those that give whole distributions (KL needs them; a server's top N
# does not do).
BACKENDS = user_backends(every_distribution=True)
# The backend a GGUF file's float twin runs on: the one that converts it to float weights (the table's torch).
FLOAT_TWIN = next(row.name for row in BACKEND_TABLE if row.float32_weights and row.user_facing)
TOP_DIVERGENCES = 20
DEFAULT_SPEC = "default"


def _spec_label(spec: str | None) -> str:
    return "the default model" if spec in (None, DEFAULT_SPEC) else Path(spec).name or spec


def position_tooltip(p: experiments.PositionDiff, name_a: str, name_b: str, alternatives: int = 5) -> str:
    """Both models at one token: log-probs, ranks, KL both ways, each top token's rank under the other, and
    their top alternatives side by side (rich text)."""
    def side(label: str, name: str, s: experiments.ScoredToken) -> str:
        return (f"<b>{label}</b> {html.escape(name)}: p {html.escape(pct(math.exp(s.logprob)))} · "
                f"log-prob {s.logprob:.3f} · rank {s.rank + 1} · entropy {s.entropy:.2f}")

    rows = []
    for i in range(min(alternatives, max(len(p.a.top), len(p.b.top)))):
        cells = []
        for top in (p.a.top, p.b.top):
            if i < len(top):
                t = top[i]
                mark = "▶ " if t.token_id == p.token_id else ""
                cells.append(f"<td>{mark}<code>{html.escape(visible(t.text, t.token_bytes))}</code></td>"
                             f"<td align='right'>&nbsp;{html.escape(pct(t.prob))}&nbsp;&nbsp;</td>")
            else:
                cells.append("<td></td><td></td>")
        rows.append(f"<tr>{''.join(cells)}</tr>")
    agree = ("both have the same top token" if p.a_top_rank_in_b == 0 and p.b_top_rank_in_a == 0 else
             f"A's top token is B's #{p.a_top_rank_in_b + 1}; B's top token is A's #{p.b_top_rank_in_a + 1}")
    return (
        f"<b><code>{html.escape(visible(p.token_text))}</code></b> · KL(A‖B) {p.kl_ab:.4f} nats · "
        f"KL(B‖A) {p.kl_ba:.4f}<br>{side('A', name_a, p.a)}<br>{side('B', name_b, p.b)}<br>{agree}"
        f"<table style='margin-top:4px'><tr><th align='left'>A</th><th></th><th align='left'>B</th><th></th></tr>"
        f"{''.join(rows)}</table>"
    )


def span_tooltip(s: experiments.SpanDiff) -> str:
    def lp(v: float | None) -> str:
        return "context only (nothing predicts it)" if v is None else f"log-prob {v:.3f}"

    delta = f"Δ (B − A) {s.delta:+.3f} nats" if s.delta is not None else "not compared"
    return (f"<b><code>{html.escape(visible(s.text))}</code></b> · bytes {s.start}–{s.end} · {delta}<br>"
            f"<b>A</b> {html.escape(lp(s.logprob_a))} over {html.escape(' | '.join(map(visible, s.tokens_a)))}<br>"
            f"<b>B</b> {html.escape(lp(s.logprob_b))} over {html.escape(' | '.join(map(visible, s.tokens_b)))}<br>"
            "KL per token is not defined: the two tokenizers differ")


def _span_event(i: int, s: experiments.SpanDiff) -> TokenEvent:
    lp = s.logprob_a if s.logprob_a is not None else 0.0
    return TokenEvent(index=i, token_id=-1, text=s.text, token_text=s.text, logprob=lp, sampler_logprob=lp,
                      rank=0, entropy=0.0, top_model=(), top_sampler=())


WIDGET_SIZE_MAX = (1 << 24) - 1  # Qt's QWIDGETSIZE_MAX (no maximum), which PySide6 does not export


class DivergenceBody(MessageBody):
    """The token view coloured by divergence ("divergence" colouring, app/widgets/heat.py); hover shows both models."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.tips: list[str] = []  # per drawn item: what hovering it shows
        # Not a chat message, which grows to its text inside a scrolling column: this one fills the room the
        # window leaves and scrolls itself. Sized to its one line, it held the whole result row to 18 px, and
        # the window's spare height went to empty bands around the labels above.
        self.setMinimumHeight(0)
        self.setMaximumHeight(WIDGET_SIZE_MAX)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAsNeeded)

    def _fit_height(self, size: QSizeF) -> None:
        """Its height is the window's layout's (see __init__), never its text's."""

    def show_diff(self, diff: experiments.ModelDiff | experiments.SpanModelDiff, dark: bool) -> None:
        if isinstance(diff, experiments.ModelDiff):
            events = [p.event(i) for i, p in enumerate(diff.positions)]
            values = [p.kl_ab for p in diff.positions]
            self.tips = [position_tooltip(p, diff.model_a, diff.model_b) for p in diff.positions]
        else:
            events = [_span_event(i, s) for i, s in enumerate(diff.spans)]
            values = [abs(s.delta) if s.delta is not None else math.nan for s in diff.spans]
            self.tips = [span_tooltip(s) for s in diff.spans]
        self.steering_kl = values  # the per-token value the KL colourings read (named for its first user)
        self.show_tokens(events, "divergence", dark)

    def mouseMoveEvent(self, event: QMouseEvent) -> None:
        before = self._hovered
        super().mouseMoveEvent(event)  # the plain token tooltip, replaced just below by both models' view
        i = self._hovered
        if i is not None and i != before and i < len(self.tips):
            QToolTip.showText(event.globalPosition().toPoint(), self.tips[i], self.viewport())


class ModelDiffView(QWidget):
    """Experiments ▸ Compare models…: pick model B, paste a text, compare."""

    def __init__(self, host: EngineHost, recent: list[dict[str, str]] | None = None, parent: QWidget | None = None,
                 *, second: SecondModel | None = None):
        super().__init__(parent, Qt.WindowType.Window)
        self.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        self.setWindowTitle("Compare models")
        self.setAccessibleName("Compare models")
        close_on_escape(self)
        self.host = host
        self.second = second or SecondModel()
        self.second.changed.connect(self._on_second_changed)
        self.second.progressed.connect(self._show_models)
        self._load_task: asyncio.Task | None = None
        self.result: experiments.ModelDiff | experiments.SpanModelDiff | None = None

        pick = self._build_pick(recent or [])
        bar = self._build_compare_bar()
        split = self._build_results()
        lay = QVBoxLayout(self)
        lay.addLayout(pick)
        lay.addWidget(self.models_label)
        lay.addWidget(self.text)
        lay.addLayout(bar)
        lay.addWidget(self.summary)
        lay.addWidget(split, 1)
        self.host.model_changed.connect(self._on_host_model)
        self._show_models()
        fit_to_screen(self, 1000, 760)

    def _build_pick(self, recent: list[dict[str, str]]) -> QHBoxLayout:
        """Model B's row: its name or path (the recent ones offered), its backend, Browse, Load, the load's bar
        and Cancel; and the line under it that names both models."""
        self.model_box = QComboBox()
        self.model_box.setEditable(True)
        self.model_box.setAccessibleName("Second model")
        self.model_box.setToolTip("Model B: a model folder, a .gguf file, a hub id, or one of the recent models")
        self._fill_models(recent or [])
        self.model_box.activated.connect(self._on_model_picked)
        self.backend_box = QComboBox()
        self.backend_box.setAccessibleName("Second model's backend")
        self.backend_box.setToolTip(backend_help("\n", BACKENDS))
        for b in BACKENDS:
            self.backend_box.addItem(b, b)
        self._on_model_picked(0)
        self.browse_button = QPushButton("Browse…")
        self.browse_button.clicked.connect(self._browse)
        self.load_button = QPushButton("Load model B")
        self.load_button.clicked.connect(lambda: self.load_second())
        pick = QHBoxLayout()
        pick.addWidget(QLabel("Model B:"))
        pick.addWidget(self.model_box, 1)
        pick.addWidget(self.backend_box)
        pick.addWidget(self.browse_button)
        pick.addWidget(self.load_button)
        # Loading B can take minutes (a download, a conversion): a bar (determinate when the engine knows how far),
        # the seconds so far in the line below, and a Cancel that stops the load.
        self.load_bar = QProgressBar()
        self.load_bar.setAccessibleName("Loading model B")
        self.load_bar.setMaximumWidth(140)
        self.load_bar.setVisible(False)
        self.cancel_load_button = QPushButton("Cancel")
        self.cancel_load_button.setAccessibleName("Cancel loading model B")
        self.cancel_load_button.setToolTip("Stop loading model B (a download or conversion stops at once)")
        self.cancel_load_button.clicked.connect(self.cancel_load)
        self.cancel_load_button.setVisible(False)
        pick.addWidget(self.load_bar)
        pick.addWidget(self.cancel_load_button)
        self._load_clock = QTimer(self)
        self._load_clock.setInterval(1000)
        self._load_clock.timeout.connect(self._show_models)
        self.models_label = QLabel()
        self.models_label.setWordWrap(True)
        self.models_label.setAccessibleName("Models and memory")
        return pick

    def _build_compare_bar(self) -> QHBoxLayout:
        """The text to compare on, and Compare, Stop and the colours' legend under it."""
        self.text = QPlainTextEdit()
        self.text.setAccessibleName("Text to compare the models on")
        self.text.setPlaceholderText("Paste a text: where do the two models disagree about it?")
        self.text.setMaximumHeight(160)
        self.compare_button = QPushButton("Compare")
        self.compare_button.setDefault(True)
        self.compare_button.clicked.connect(lambda: self.run())
        self.stop_button = QPushButton("Stop")
        bar = QHBoxLayout()
        bar.addWidget(self.compare_button)
        bar.addWidget(self.stop_button)
        bar.addStretch(1)
        self.legend = HeatLegend("divergence")
        bar.addWidget(self.legend)
        return bar

    def _build_results(self) -> QSplitter:
        """The summary, the coloured tokens, the largest divergences and the selected token's detail."""
        self.summary = QLabel("Load a second model, then compare: each token is coloured by KL(A‖B) of the two "
                              "models' next-token distributions there.")
        self.summary.setWordWrap(True)
        self.summary.setTextFormat(Qt.TextFormat.RichText)
        self.summary.setAccessibleName("Comparison summary")
        # After a run, Compare is enabled only while B is loaded (`_show_models`).
        self._runs: OneRun[ModelDiffRun] = OneRun(
            self.compare_button, self.stop_button, self.summary, busy="Comparing… (both models read the text at once)",
            failed="The comparison failed", on_end=self._show_run, after=self._show_models)
        self.body = DivergenceBody(self)
        self.body.setAccessibleName("Tokens coloured by divergence")
        self.body.token_clicked.connect(self.select)
        self.top_list = QListWidget()
        self.top_list.setAccessibleName("Largest divergences")
        self.top_list.itemClicked.connect(lambda item: self.select(item.data(Qt.ItemDataRole.UserRole)))
        self.detail = QLabel()
        self.detail.setTextFormat(Qt.TextFormat.RichText)
        self.detail.setWordWrap(True)
        self.detail.setAccessibleName("Selected token under both models")
        self.detail.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        right = QSplitter(Qt.Orientation.Vertical)
        right.addWidget(self.top_list)
        right.addWidget(self.detail)
        right.setStretchFactor(0, 3)  # the list of largest divergences takes most of the height
        right.setStretchFactor(1, 2)
        split = QSplitter()
        split.addWidget(self.body)
        split.addWidget(right)
        split.setStretchFactor(0, 3)
        split.setStretchFactor(1, 2)
        return split

    # -- model B ---------------------------------------------------------------------------------

    def _fill_models(self, recent: list[dict[str, str]]) -> None:
        info = self.host.info
        # A GGUF file (whichever backend runs it): its float twin, converted from the same file, is the natural
        # reference; the file's format says so, not the backend's name.
        if info is not None and info.runs_locally and info.path.lower().endswith(".gguf"):
            self.model_box.addItem(f"{info.name} on {FLOAT_TWIN} (float, converted from the GGUF)",
                                   (self.host.spec or DEFAULT_SPEC, FLOAT_TWIN))
        for row in recent:
            spec, backend = row.get("spec") or DEFAULT_SPEC, row.get("backend", "auto")
            self.model_box.addItem(f"{_spec_label(spec)} ({backend})", (spec, backend))
        if self.model_box.count() == 0:
            self.model_box.addItem("the default model (auto)", (DEFAULT_SPEC, "auto"))

    def _on_model_picked(self, index: int) -> None:
        data = self.model_box.itemData(index)
        if data is not None:
            self.backend_box.setCurrentIndex(max(0, self.backend_box.findData(data[1])))

    def _browse(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Model B: a GGUF file", "", "GGUF models (*.gguf);;All files (*)")
        if path:
            self.model_box.setEditText(path)

    def picked(self) -> tuple[str, str]:
        """(spec, backend) of the model B the picker names (typed text wins over the list's entry)."""
        index = self.model_box.currentIndex()
        data = self.model_box.itemData(index) if index >= 0 else None
        text = self.model_box.currentText().strip()
        spec = data[0] if data is not None and text == self.model_box.itemText(index) else text
        return spec or DEFAULT_SPEC, self.backend_box.currentData()

    def load_second(self, spec: str | None = None, backend: str | None = None) -> asyncio.Task:
        """Load model B (the picker's, unless given); the previous B is closed first."""
        if spec is None:
            spec, backend = self.picked()
        self._load_task = asyncio.ensure_future(
            self.second.load(None if spec == DEFAULT_SPEC else spec, backend or "auto"))
        return self._load_task

    def cancel_load(self) -> None:
        """Stop loading model B (the picker stays as it was; Load tries again)."""
        if self.second.cancel_load() and self._load_task is not None and not self._load_task.done():
            self._load_task.cancel()

    def _on_second_changed(self) -> None:
        loading = self.second.loading
        self.load_button.setEnabled(not loading)
        self.load_bar.setVisible(loading)
        self.cancel_load_button.setVisible(loading)
        if loading:
            self._load_clock.start()
        else:
            self._load_clock.stop()
        self._show_models()

    def _on_host_model(self, _info: object) -> None:
        self._show_models()

    def _show_models(self) -> None:
        """Which models are A and B and what each holds in memory."""
        parts = []
        if self.host.info is not None:
            parts.append(self._memory_words("A", MemoryLine.of(self.host.info)))
        else:
            parts.append("A: no model is loaded (Model ▸ Open model…)")
        b = self.second
        if b.loading:
            parts.append(self._loading_words(b))
        elif b.cancelled:
            parts.append(f"B: loading {_spec_label(b.spec)} was cancelled (pick one and Load)")
        elif b.error:
            parts.append(f"B: could not be loaded: {b.error}")
        elif b.info is not None:
            parts.append(self._memory_words("B", MemoryLine.of(b.info)))
        else:
            parts.append("B: none yet (pick one and Load)")
        if self.host.info is not None and b.info is not None:
            both = MemoryLine.of(self.host.info).total + MemoryLine.of(b.info).total
            parts.append(f"both: {human_bytes(both)} (closing this window frees B)")
        self.models_label.setText(" · ".join(parts))
        self.compare_button.setEnabled(b.info is not None and not self._runs.running)

    def _loading_words(self, b: SecondModel) -> str:
        """"B: loading X (torch)… 12 s · downloading X 40 %", and the bar: determinate where a fraction is known."""
        message, fraction = b.progress
        try:
            seconds = max(0, int(asyncio.get_running_loop().time() - b.started_at))
        except RuntimeError:  # no loop (a script): no clock
            seconds = 0
        if fraction is None:
            self.load_bar.setRange(0, 0)  # busy: the engine does not know how far it is
        else:
            self.load_bar.setRange(0, 100)
            self.load_bar.setValue(round(100 * max(0.0, min(1.0, fraction))))
        doing = f" · {message}" + (f" {round(100 * fraction)} %" if fraction is not None else "") if message else ""
        return f"B: loading {_spec_label(b.spec)} ({b.backend})… {seconds} s{doing}"

    @staticmethod
    def _memory_words(which: str, m: MemoryLine) -> str:
        cache = f" + {human_bytes(m.cache_bytes)} KV cache" if m.cache_bytes else ""
        return f"{which}: {m.name}, {human_bytes(m.weights_bytes)} weights{cache}"

    # -- the comparison --------------------------------------------------------------------------

    def run(self) -> asyncio.Task | None:
        return self._runs.start(lambda: start_diff(self.host, self.second, self.text.toPlainText()))

    def stop(self) -> None:
        self._runs.stop()

    def _show_run(self, run: ModelDiffRun) -> None:
        if run.result is not None:
            self.show_result(run.result)

    def show_result(self, diff: experiments.ModelDiff | experiments.SpanModelDiff) -> None:
        self.result = diff
        self.body.show_diff(diff, is_dark(self.palette()))
        self.top_list.clear()
        self.detail.clear()
        if isinstance(diff, experiments.ModelDiff):
            self.summary.setText(html.escape(f"A = {diff.model_a}; B = {diff.model_b}. {diff.summary()}; "
                                             f"{diff.seconds:.1f} s. Colour: KL(A‖B) per token; hover for both models."))
            for p in diff.top_divergences(TOP_DIVERGENCES):
                item = QListWidgetItem(f"KL {p.kl_ab:.4f}  ·  “{visible(p.token_text)}” (token {p.index - diff.context + 1})")
                item.setData(Qt.ItemDataRole.UserRole, p.index - diff.context)
                self.top_list.addItem(item)
        else:
            self.summary.setText(html.escape(f"A = {diff.model_a}; B = {diff.model_b}. {diff.summary()} "
                                             "Colour: |Δ log-prob| per span."))
            where = {id(s): i for i, s in enumerate(diff.spans)}
            for s in diff.top_divergences(TOP_DIVERGENCES):
                item = QListWidgetItem(f"Δ {s.delta:+.3f}  ·  “{visible(s.text)}” (bytes {s.start}–{s.end})")
                item.setData(Qt.ItemDataRole.UserRole, where[id(s)])
                self.top_list.addItem(item)

    def select(self, index: int) -> None:
        if self.result is None or not 0 <= index < len(self.body.tips):
            return
        self.body.set_selected(index)
        self.detail.setText(self.body.tips[index])

    def closeEvent(self, event: QCloseEvent) -> None:
        self._runs.close(abandon=True)  # it ends after this window (B may still be loading): nothing to draw into
        self.second.cancel_load()
        if self._load_task is not None and not self._load_task.done():
            self._load_task.cancel()
        self._load_clock.stop()
        self.host.model_changed.disconnect(self._on_host_model)
        self.second.close()  # the window held B for the comparison only
        super().closeEvent(event)


def open_model_diff(host: EngineHost, store: Store, parent: QWidget | None) -> ModelDiffView:
    """Chat ▸ Compare models…: the window, with the recent models to pick model B from."""
    view = ModelDiffView(host, recent_models(store), parent=parent)
    view.show()
    return view
