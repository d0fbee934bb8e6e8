"""The main window's menus and keyboard shortcuts: the actions, typed, and where each one sits.

This module only makes the actions and lays out the menu bar; it knows nothing of
the window. The window connects each action to what it does (its own slots, the
model actions, the experiment actions), so nothing here imports it back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

from PySide6.QtGui import QAction, QActionGroup, QKeySequence
from PySide6.QtWidgets import QMainWindow, QMenu, QMessageBox, QWidget

from app import __version__

SHORTCUTS_HELP = """<table>
<tr><td><b>Enter</b></td><td>send</td></tr>
<tr><td><b>Shift+Enter</b></td><td>new line in the message (also when editing a sent one)</td></tr>
<tr><td><b>Tab / Shift+Tab</b></td><td>next / previous control on screen</td></tr>
<tr><td><b>Esc</b></td><td>stop generating; cancel editing a message; close Compare, Replay, Score</td></tr>
<tr><td><b>Ctrl+R</b></td><td>regenerate the last answer</td></tr>
<tr><td><b>Ctrl+Shift+Enter</b></td><td>continue a cut-off answer</td></tr>
<tr><td><b>Ctrl+N</b></td><td>new chat</td></tr>
<tr><td><b>Ctrl+H</b></td><td>token heatmap on/off</td></tr>
<tr><td><b>Alt+Left / Alt+Right</b></td><td>previous / next token in the inspector</td></tr>
<tr><td><b>Ctrl+O</b></td><td>open a model</td></tr>
<tr><td><b>Ctrl+L</b></td><td>model library</td></tr>
<tr><td><b>Ctrl+F</b></td><td>search conversations</td></tr>
<tr><td><b>Ctrl+E / Ctrl+Shift+E</b></td><td>export as Markdown / JSON</td></tr>
</table>"""

APPEARANCES = (("system", "Follow the system"), ("light", "Light"), ("dark", "Dark"))


@dataclass(frozen=True)
class WindowActions:
    """Every action of the menu bar; the window connects them and enables what depends on its state."""

    new_chat: QAction
    new_notebook: QAction
    export_markdown: QAction
    export_json: QAction
    export_trace: QAction
    quit: QAction
    send: QAction
    stop: QAction
    regenerate: QAction
    continue_answer: QAction
    search: QAction
    rename: QAction
    compare: QAction
    replay: QAction
    replay_with: QAction
    score: QAction
    compare_models: QAction
    open_model: QAction
    library: QAction
    connect_server: QAction
    serve: QAction
    runtime_settings: QAction
    chat_template: QAction
    heatmap: QAction
    previous_token: QAction
    next_token: QAction
    log_file: QAction
    shortcuts: QAction
    about: QAction

    @classmethod
    def create(cls, owner: QWidget) -> "WindowActions":
        """The actions with their texts, shortcuts and tips; added to `owner` so shortcuts work with no menu bar."""

        def act(text: str, shortcut: str | QKeySequence | QKeySequence.StandardKey | None = None,
                tip: str = "") -> QAction:
            action = QAction(text, owner)
            if shortcut:
                action.setShortcut(QKeySequence(shortcut))
            if tip:
                action.setStatusTip(tip)
            owner.addAction(action)
            return action

        heatmap = act("&Token heatmap", "Ctrl+H")
        heatmap.setCheckable(True)
        return cls(
            new_chat=act("&New chat", QKeySequence.StandardKey.New),
            new_notebook=act("New note&book", "Ctrl+Shift+N", "One text the model continues, with no chat template "
                             "(how a base model is used)"),
            export_markdown=act("Export as &Markdown…", "Ctrl+E"),
            export_json=act("Export as &JSON (with token records)…", "Ctrl+Shift+E"),
            export_trace=act("Export &trace (JSONL)…", tip="The selected answer as JSON lines: header, then every "
                             "token with its alternatives and stages"),
            quit=act("&Quit", QKeySequence.StandardKey.Quit),
            send=act("&Send", "Ctrl+Return"),
            stop=act("S&top", "Esc", "Stop generating before the next token"),
            regenerate=act("&Regenerate", "Ctrl+R"),
            continue_answer=act("&Continue answer", "Ctrl+Shift+Return"),
            search=act("Search c&onversations", QKeySequence.StandardKey.Find),
            rename=act("Re&name conversation", "F2"),
            compare=act("Co&mpare settings…", tip="One prompt under 2-4 sampler settings with the same seed, "
                        "tokens side by side"),
            replay=act("Re&play answer", tip="Generate the selected answer again with its seed and settings"),
            replay_with=act("Replay answer &with…",
                            tip="Change one setting, keep the seed, and see which tokens change"),
            score=act("Score &text…", tip="How surprising any text is to the model, token by token"),
            compare_models=act("Compare mo&dels…", tip="The loaded model and a second one on one text: where their "
                               "next-token distributions differ (KL per token), both models' ranks and alternatives"),
            open_model=act("&Open model…", QKeySequence.StandardKey.Open),
            library=act("Model &library…", "Ctrl+L", "The models on this machine (LM Studio, Ollama, Hugging Face "
                        "cache, GPT4All, Jan, your folders) and downloads"),
            connect_server=act("&Connect to server…", tip="A model on an OpenAI-compatible server: vLLM, SGLang, "
                               "llama.cpp, Ollama, LM Studio"),
            serve=act("&Serve…", tip="The loaded model as an OpenAI-compatible server on this machine; every "
                      "answer it serves appears in the chats list, each token inspectable"),
            runtime_settings=act("R&untime settings…", tip="Context length, threads, GPU layers and batch size of "
                                 "the loaded model; remembered for it"),
            chat_template=act("Chat &template…", tip="Which template turns a chat into the model's prompt: its own, "
                              "a built-in (ChatML, Llama 3, Gemma, Mistral, Phi-3) or one you paste; remembered for it"),
            heatmap=heatmap,
            previous_token=act("&Previous token", "Alt+Left"),
            next_token=act("&Next token", "Alt+Right"),
            log_file=act("Show &log file", tip="Open the folder with the log file"),
            shortcuts=act("&Keyboard shortcuts"),
            about=act("&About Logit Lab"),
        )

    def all(self) -> tuple[QAction, ...]:
        return tuple(getattr(self, f.name) for f in fields(self))


@dataclass(frozen=True)
class MenuBar:
    """What the window fills or follows after the bar is built."""

    model: QMenu  # refills Recent before it shows
    recent: QMenu
    appearance: dict[str, QAction]  # by scheme; empty without a theme


def build_menu_bar(window: QMainWindow, a: WindowActions, panels: Sequence[QAction], appearance: bool) -> MenuBar:
    """Lay the actions out in the menu bar; `panels` are the docks' show/hide actions (View menu)."""
    bar = window.menuBar()
    file = bar.addMenu("&File")
    file.addActions([a.new_chat, a.new_notebook])
    file.addSeparator()
    file.addActions([a.export_markdown, a.export_json, a.export_trace])
    file.addSeparator()
    file.addAction(a.quit)

    chat = bar.addMenu("&Chat")
    chat.addActions([a.send, a.stop, a.regenerate, a.continue_answer])
    chat.setToolTipsVisible(True)  # Continue's tip names the answer it continues, or why there is none
    chat.addSeparator()
    chat.addActions([a.search, a.rename])
    chat.addSeparator()
    chat.addActions([a.compare, a.replay, a.replay_with, a.score, a.compare_models])

    model = bar.addMenu("&Model")
    model.addActions([a.open_model, a.library, a.connect_server])
    recent = model.addMenu("&Recent")
    model.addSeparator()
    model.addActions([a.runtime_settings, a.chat_template])
    model.addSeparator()
    model.addAction(a.serve)

    view = bar.addMenu("&View")
    view.addActions([a.heatmap, a.previous_token, a.next_token])
    view.addSeparator()
    view.addActions(list(panels))
    schemes: dict[str, QAction] = {}
    if appearance:
        menu = view.addMenu("&Appearance")
        group = QActionGroup(window)
        for scheme, text in APPEARANCES:
            action = menu.addAction(text)
            action.setCheckable(True)
            group.addAction(action)
            schemes[scheme] = action

    help_ = bar.addMenu("&Help")
    help_.addActions([a.log_file, a.shortcuts, a.about])
    return MenuBar(model, recent, schemes)


def show_shortcuts(parent: QWidget) -> QMessageBox:
    return _open_box(parent, "Keyboard shortcuts", SHORTCUTS_HELP)


def show_about(parent: QWidget) -> QMessageBox:
    box = _open_box(
        parent,
        "About Logit Lab",
        f"<b>Logit Lab {__version__}</b><p>Chat with a local language model and see how it samples: "
        "every token's probability, its alternatives, and what each sampler stage did.</p>",
    )
    box.setIconPixmap(parent.windowIcon().pixmap(64, 64))
    return box


def _open_box(parent: QWidget, title: str, text: str) -> QMessageBox:
    """Opened, not exec()'d (no nested event loop), and deleted once closed."""
    box = QMessageBox(QMessageBox.Icon.Information, title, text, parent=parent)
    box.setAccessibleName(title)
    box.finished.connect(box.deleteLater)
    box.open()
    return box
