"""The status bar: loading progress; model, backend and device; speed of the last answer; context; memory."""

from __future__ import annotations

import os
import resource
import sys

from engine import GenerationStats, ModelInfo
from PySide6.QtCore import QSize, Qt, QTimer, Signal
from PySide6.QtGui import QPainter, QPaintEvent, QResizeEvent
from PySide6.QtWidgets import QLabel, QProgressBar, QStatusBar, QWidget

from app.controllers.chat import ChatController
from app.controllers.serve import ServeState
from app.controllers.engine_host import EngineHost, LoadState
from app.state.context_usage import ContextCounter
from app.state.conversation import Conversation, Message
from app.widgets.fmt import human_bytes


def resident_bytes() -> int:
    """This process's resident memory now (Linux), else its peak (macOS, others)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(peak if sys.platform == "darwin" else peak * 1024)


MESSAGE_PADDING = 16  # px around a status message (QStatusBar's margins)


class ElidedLabel(QLabel):
    """A one-line label that gives up width when the bar has none: it ends in "…" rather than widening the window.

    A status bar's minimum width is the sum of its permanent widgets' minimums, and a window is never
    narrower than its status bar: a plain label holding a long model name or a server URL made the
    window grow past a 1024-pixel screen. This one asks for its whole text (`sizeHint`) but needs only
    a few characters (`minimumSizeHint`); `set_limit` makes it ask for no more than a given width (never
    less than that minimum), so a status message and the other labels have room. `text()` stays the
    whole text.
    """

    MIN_CHARS = 8

    def __init__(self, text: str = "", parent: QWidget | None = None):
        super().__init__(text, parent)
        self.setTextFormat(Qt.TextFormat.PlainText)  # model names, paths and messages are text, never markup
        self._limit: int | None = None  # the most width it asks for (None: its whole text's)

    def set_limit(self, width: int | None) -> None:
        if width != self._limit:
            self._limit = width
            self.updateGeometry()

    def whole_width(self) -> int:
        """The width its whole text asks for."""
        return super().sizeHint().width()

    def minimumSizeHint(self) -> QSize:
        full = super().sizeHint()
        return QSize(min(full.width(), self.fontMetrics().horizontalAdvance("x" * self.MIN_CHARS)), full.height())

    def sizeHint(self) -> QSize:
        full = super().sizeHint()
        if self._limit is None:
            return full
        return QSize(max(self.minimumSizeHint().width(), min(full.width(), self._limit)), full.height())

    def paintEvent(self, _event: QPaintEvent) -> None:
        rect = self.contentsRect()
        shown = self.fontMetrics().elidedText(self.text(), Qt.TextElideMode.ElideRight, rect.width())
        painter = QPainter(self)
        self.style().drawItemText(painter, rect, int(self.alignment() | Qt.AlignmentFlag.AlignVCenter), self.palette(),
                                  self.isEnabled(), shown, self.foregroundRole())


class StatusBar(QStatusBar):
    template_shown = Signal()  # the chat template in use was (re)named: the model's or a chosen one

    def __init__(self, host: EngineHost, controller: ChatController, parent: QWidget | None = None):
        super().__init__(parent)
        self._host = host
        self._controller = controller
        # The selected conversation's tokens in the model's context; the chat template is rendered off this thread.
        self._context = ContextCounter(host.run_off_ui_thread)
        self._context.counted.connect(self._update_context)
        self._context_conv: Conversation | None = None
        self._attached: int | None = 0  # tokens of the files on the composer, not sent yet (None: being counted)
        self.progress_label = ElidedLabel()  # "Loading <a long path or URL>…" must not widen the window either
        self.progress = QProgressBar()
        self.progress.setMaximumWidth(160)
        self.progress.setTextVisible(False)
        self.progress.setAccessibleName("Model loading progress")
        # Every permanent label can shrink (ends in "…"), so no model name or URL widens the window.
        self.model_label = ElidedLabel("No model")
        self.model_label.setAccessibleName("Model")
        self.server_label = ElidedLabel()  # remote models: host and the last round trip
        self.server_label.setAccessibleName("Server")
        self.server_label.setVisible(False)
        self.speed_label = ElidedLabel()
        self.speed_label.setAccessibleName("Speed of the last answer")
        self.context_label = ElidedLabel()
        self.context_label.setAccessibleName("Context used")
        self.memory_label = ElidedLabel()
        self.memory_label.setAccessibleName("Memory")
        self.serve_label = ElidedLabel()  # "Serving on http://127.0.0.1:PORT/v1" while Model ▸ Serve… runs
        self.serve_label.setAccessibleName("Serving")
        self.serve_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.serve_label.setVisible(False)
        self.addWidget(self.progress_label)
        self.addWidget(self.progress)
        # Which chat template the model's chats use, a warning when it has none (app/actions/templates.py).
        self.template_label = ElidedLabel()
        self.template_label.setAccessibleName("Chat template")
        self._template_warns = False
        self.addPermanentWidget(self.template_label)
        self._labels = (self.serve_label, self.model_label, self.server_label, self.speed_label, self.context_label,
                        self.memory_label)
        for w in self._labels:
            self.addPermanentWidget(w)
        # While a message shows (an error, "Loaded …"), the labels step back to their minimum: it needs the room.
        self.messageChanged.connect(self._on_message_changed)

        host.state_changed.connect(self._on_load_state)
        host.model_changed.connect(self._on_model_changed)
        host.load_failed.connect(self._on_load_failed)
        controller.finished.connect(self._on_finished)
        controller.busy_changed.connect(self._on_busy)
        self._peak = 0  # the peak memory the last answer of the loaded model reported (0: none yet)
        self._memory_timer = QTimer(self)
        self._memory_timer.setInterval(2000)
        self._memory_timer.timeout.connect(self._update_memory)
        self._memory_timer.start()
        self._on_load_state(host.state)
        if host.info is not None:
            self._on_model_changed(host.info)
        self._update_memory()
        # The context label follows the selected conversation, token by token while it streams.
        controller.library.current_changed.connect(self._on_conversation_changed)
        self._on_conversation_changed(controller.library.current)

    def detach(self) -> None:
        """Stop following the host (the window is closing; the host may live on)."""
        self._host.state_changed.disconnect(self._on_load_state)
        self._host.model_changed.disconnect(self._on_model_changed)
        self._host.load_failed.disconnect(self._on_load_failed)
        self._memory_timer.stop()
        self._controller.library.current_changed.disconnect(self._on_conversation_changed)
        self._context.counted.disconnect(self._update_context)
        self._on_conversation_changed(None)

    def _on_message_changed(self, text: str) -> None:
        """Room for the message ("Loaded …", an error), and whole labels where the bar can have them.

        At 1440 px "Loaded SmolLM2…" fits beside every label at its whole width, yet making them all
        compact squeezed them to "Templa… SmolL…" for the message's seconds. Now the labels give up
        only the width that is missing, one after another: the model first (the title bar names it
        too), then the server, memory, context and speed; the template's warning never does: it is
        what a user needs to see after a load.
        """
        order = [self.model_label, self.server_label, self.memory_label, self.context_label, self.speed_label,
                 self.serve_label]
        if not self._template_warns:
            order.append(self.template_label)
        for label in (*order, self.template_label):
            label.set_limit(None)
        # What is missing, laid out with every label whole: what the layout squeezed out of them, and what
        # the message lacks left of the first label.
        layout = self.layout()
        assert layout is not None, "QStatusBar lays out its own widgets: its constructor makes the layout"
        layout.activate()
        shown = [w for w in (self.template_label, *self._labels) if not w.isHidden()]
        squeezed = sum(max(0, w.sizeHint().width() - w.width()) for w in shown)
        room = min((w.geometry().left() for w in shown), default=self.width())
        missing = squeezed + (max(0, self._message_width(text) - room) if text else 0)
        for label in order:
            if missing <= 0:
                break
            if label.isHidden():
                continue
            whole = label.whole_width()
            give = min(missing, whole - label.minimumSizeHint().width())
            label.set_limit(whole - give)
            missing -= give

    def _fit_message(self) -> None:
        """Lay the labels out again (a label's text changed, the bar was resized, a message came or went)."""
        self._on_message_changed(self.currentMessage())

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._fit_message()

    def _message_width(self, text: str) -> int:
        return self.fontMetrics().horizontalAdvance(text) + MESSAGE_PADDING

    def _on_load_state(self, state: LoadState) -> None:
        self.progress_label.setVisible(state.loading)
        self.progress.setVisible(state.loading)
        if state.loading:
            self.progress_label.setText(state.message)
            if state.fraction is None:
                self.progress.setRange(0, 0)  # busy indicator
            else:
                self.progress.setRange(0, 1000)
                self.progress.setValue(int(state.fraction * 1000))

    def _on_model_changed(self, info: ModelInfo) -> None:
        self.model_label.setText(f"{info.name} · {info.backend} · {info.device}")
        self.model_label.setToolTip("\n".join(info.summary_lines()))
        if info.quantization:  # a GGUF file (llama.cpp): its quantization type and its size on disk
            self.model_label.setText(f"{self.model_label.text()} · {info.quantization} · {human_bytes(info.file_bytes)}")
        # The last answer's speed and peak memory were another model's: they say nothing about this one.
        self.speed_label.setText("")
        self.speed_label.setToolTip("")
        self._peak = 0
        self._update_memory()
        self._update_server()
        self._context.clear()
        self._update_context()
        self.showMessage(f"Loaded {info.name}", 4000)

    def show_serving(self, state: ServeState) -> None:
        """Model ▸ Serve…'s state (app/controllers/serve.py `ServeState`): its address while it serves."""
        self.serve_label.setText(state.status_text)
        self.serve_label.setToolTip(f"Serving {state.what} to OpenAI clients at {state.url}; every answer appears "
                                    "in the chats list (Model ▸ Serve… stops it)" if state.running else "")
        self.serve_label.setVisible(state.running)
        self._fit_message()

    def show_template(self, text: str, tooltip: str = "", warn: bool = False) -> None:
        """The chat template in a few words; `warn` (a model without one) draws it in the warning colour."""
        self.template_label.setText(text)
        self.template_label.setToolTip(tooltip)
        self.template_label.setStyleSheet("color: #c0392b; font-weight: bold" if warn else "")
        self.template_label.setVisible(bool(text))
        self._template_warns = warn
        self._fit_message()  # the label's new text may leave the message less room, or more
        self.template_shown.emit()

    def _on_load_failed(self, spec: str | None, message: str) -> None:
        self.showMessage(f"Could not load {spec or 'the default model'}: {message}", 15000)

    def _on_busy(self, busy: bool) -> None:
        if busy:
            self.speed_label.setText("generating…")

    def _on_finished(self, _message: Message, stats: GenerationStats | None) -> None:
        if stats is None:
            self.speed_label.setText("")
            return
        speed = f"{stats.decode_tokens_per_s:.1f} tok/s" if stats.decode_tokens_per_s else "—"
        self.speed_label.setText(f"{speed} · first token {stats.time_to_first_token_s:.2f} s")
        self.speed_label.setToolTip(
            f"{stats.generated_tokens} tokens in {stats.total_s:.2f} s; prompt {stats.prompt_tokens} tokens, "
            f"{stats.reused_tokens} reused from the cache; seed {stats.seed}"
        )
        self._peak = stats.peak_memory_bytes
        self._update_context()
        self._update_memory()
        self._update_server()
        self._fit_message()

    def _update_server(self) -> None:
        """Host, model and the last round trip of a remote model (the round trip changes with every request)."""
        info, engine = self._host.info, self._host.engine
        server = info.server if info is not None else None
        self.server_label.setVisible(server is not None)
        if info is None or server is None:
            return
        rtt = engine.round_trip_s if engine is not None else None
        latency = f"{rtt * 1000:.0f} ms" if rtt is not None else "— ms"
        self.server_label.setText(f"round trip {latency}")  # the host is in the model label: name · remote · host
        self.server_label.setToolTip(
            f"{info.name} on {info.path}; {latency} for the last complete request (network and the server's work)\n"
            + "server can: " + ", ".join(server.labels())
        )

    def _on_conversation_changed(self, conv: Conversation | None) -> None:
        old, self._context_conv = self._context_conv, conv
        if old is not None:
            for signal in (old.tokens_appended, old.path_changed, old.message_changed):
                signal.disconnect(self._update_context)
        if conv is not None:
            for signal in (conv.tokens_appended, conv.path_changed, conv.message_changed):
                signal.connect(self._update_context)
        self._update_context()

    def context_used(self) -> int | None:
        """The selected conversation's tokens in the context (None: unknown or being counted)."""
        engine, info = self._host.engine, self._host.info
        local = engine is not None and (info is None or info.runs_locally)
        return self._context.used(self._context_conv, engine.tokenizer if engine is not None and local else None)

    def set_attached_tokens(self, tokens: int | None) -> None:
        """The composer's attachments, counted in the context label before they are sent (0: none)."""
        self._attached = tokens
        self._update_context()

    def _update_context(self, *_args: object) -> None:
        info = self._host.info
        engine = self._host.engine
        # A remote model's tokenizer is HTTP: never from this (the UI) thread; finished answers still count.
        local = engine is not None and (info is None or info.runs_locally)
        tokenizer = engine.tokenizer if engine is not None and local else None
        used = self._context.used(self._context_conv, tokenizer)
        total = f"{info.context_length:,}" if info and info.context_length else "?"
        failed = used is None and self._context.error is not None
        shown = "?" if failed else "—" if used is None else f"{used:,}"
        runtime = info.runtime if info is not None else None
        capped = " (capped)" if runtime is not None and runtime.context_note else ""
        kv = f" · KV {human_bytes(runtime.kv_cache_bytes)}" if runtime is not None and runtime.kv_cache_bytes else ""
        attached = "" if self._attached == 0 else " + … attached" if self._attached is None else f" + {self._attached:,} attached"
        self.context_label.setText(f"context {shown}{attached} / {total}{capped}{kv}")
        tip = "Tokens of the model's context the selected conversation fills: system prompt, messages and answer"
        if attached:
            tip += "; then the files attached to the next message, not sent yet"
        if failed:
            tip = f"The context cannot be counted: {self._context.error}"
        elif used is None and self._context.counting:
            tip += " (counting…)"
        if runtime is not None and runtime.summary():  # what the context costs, and why it is shorter than the model's
            tip += f"\n{runtime.summary()}"
            if runtime.context_note:
                tip += f"\nThe context was {runtime.context_note}."
            tip += "\nModel ▸ Runtime settings… changes it."
        self.context_label.setToolTip(tip)

    def _update_memory(self) -> None:
        """The loaded model's own memory (its weights and KV cache), with the process's in the tooltip.

        The label showed the process's resident memory: after Gemma 3 was closed for SmolLM2 it stayed at
        2.0-2.2 GiB (0.47 before), because memory an earlier model used stays with the process (the
        allocator keeps it) and the backends' "peak" is the process's lifetime peak. Neither is the model's."""
        rss = resident_bytes()
        info = self._host.info
        weights = info.bytes if info is not None else 0
        runtime = info.runtime if info is not None else None
        kv = runtime.kv_cache_bytes if runtime is not None else 0
        if weights:
            self.memory_label.setText(f"memory {human_bytes(weights + kv)}")
            parts = f"model weights {human_bytes(weights)}" + (f" + KV cache {human_bytes(kv)}" if kv else "")
            tip = f"The loaded model's memory: {parts}.\nThe app's resident memory now: {human_bytes(rss)}"
        else:  # a server's model, or one whose size is unknown: the app's own is what there is to show
            self.memory_label.setText(f"app memory {human_bytes(rss)}")
            tip = f"The app's resident memory now: {human_bytes(rss)}"
        tip += " (memory an earlier model used may stay with the process until the system needs it)"
        if self._peak:
            tip += f".\nPeak reported for the last answer: {human_bytes(self._peak)}"
        self.memory_label.setToolTip(tip)
        self._fit_message()  # every 2 s: labels whose texts grew are laid out again
