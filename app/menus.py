"""The main window's menus and keyboard shortcuts."""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtGui import QAction, QActionGroup, QKeySequence
from PySide6.QtWidgets import QMessageBox

from app import __version__
from app.experiment_actions import export_trace, open_compare, open_replay, open_score
from app.logs import show_log_file
from app.widgets.model_picker import recent_models

if TYPE_CHECKING:
    from app.main_window import MainWindow

SHORTCUTS_HELP = """<table>
<tr><td><b>Enter</b></td><td>send</td></tr>
<tr><td><b>Shift+Enter</b></td><td>new line in the message</td></tr>
<tr><td><b>Esc</b></td><td>stop generating</td></tr>
<tr><td><b>Ctrl+R</b></td><td>regenerate the last answer</td></tr>
<tr><td><b>Ctrl+Shift+Enter</b></td><td>continue a cut-off answer</td></tr>
<tr><td><b>Ctrl+N</b></td><td>new chat</td></tr>
<tr><td><b>Ctrl+H</b></td><td>token heatmap on/off</td></tr>
<tr><td><b>Alt+Left / Alt+Right</b></td><td>previous / next token in the inspector</td></tr>
<tr><td><b>Ctrl+O</b></td><td>open a model</td></tr>
<tr><td><b>Ctrl+F</b></td><td>search conversations</td></tr>
<tr><td><b>Ctrl+E / Ctrl+Shift+E</b></td><td>export as Markdown / JSON</td></tr>
</table>"""


def build_menus(w: "MainWindow") -> dict[str, QAction]:
    """Create the menu bar; returns the actions other code enables and disables, by key."""
    actions: dict[str, QAction] = {}
    bar = w.menuBar()

    def act(key: str, text: str, slot, shortcut: str | QKeySequence | None = None, tip: str = "") -> QAction:
        a = QAction(text, w)
        if shortcut:
            a.setShortcut(QKeySequence(shortcut))
        if tip:
            a.setStatusTip(tip)
        a.triggered.connect(lambda _checked=False: slot())
        w.addAction(a)  # shortcuts work even with the menu bar hidden
        actions[key] = a
        return a

    file = bar.addMenu("&File")
    file.addAction(act("new", "&New chat", w.new_chat, QKeySequence.StandardKey.New))
    file.addSeparator()
    file.addAction(act("export_md", "Export as &Markdown…", lambda: w.export("markdown"), "Ctrl+E"))
    file.addAction(act("export_json", "Export as &JSON (with token records)…", lambda: w.export("json"), "Ctrl+Shift+E"))
    file.addAction(act("export_trace", "Export &trace (JSONL)…", lambda: export_trace(w),
                       tip="The selected answer as JSON lines: header, then every token with its alternatives and stages"))
    file.addSeparator()
    file.addAction(act("quit", "&Quit", w.close, QKeySequence.StandardKey.Quit))

    chat = bar.addMenu("&Chat")
    chat.addAction(act("send", "&Send", lambda: w.chat.composer.submit(), "Ctrl+Return"))
    chat.addAction(act("stop", "S&top", w.stop, "Esc", "Stop generating before the next token"))
    chat.addAction(act("regenerate", "&Regenerate", w.on_regenerate, "Ctrl+R"))
    chat.addAction(act("continue", "&Continue answer", w.on_continue, "Ctrl+Shift+Return"))
    chat.addSeparator()
    chat.addAction(act("search", "Search c&onversations", _focus_search(w), QKeySequence.StandardKey.Find))
    chat.addAction(act("rename", "Re&name conversation", w.sidebar.begin_rename, "F2"))
    chat.addSeparator()
    chat.addAction(act("compare", "Co&mpare settings…", lambda: open_compare(w),
                       tip="One prompt under 2-4 sampler settings with the same seed, tokens side by side"))
    chat.addAction(act("replay", "Re&play answer", lambda: open_replay(w, False),
                       tip="Generate the selected answer again with its seed and settings"))
    chat.addAction(act("replay_with", "Replay answer &with…", lambda: open_replay(w, True),
                       tip="Change one setting, keep the seed, and see which tokens change"))
    chat.addAction(act("score", "Score &text…", lambda: open_score(w),
                       tip="How surprising any text is to the model, token by token"))

    model = bar.addMenu("&Model")
    model.addAction(act("open_model", "&Open model…", w.open_model_dialog, QKeySequence.StandardKey.Open))
    model.addAction(act("connect_server", "&Connect to server…", w.open_connect_dialog,
                        tip="A model on an OpenAI-compatible server: vLLM, SGLang, llama.cpp, Ollama, LM Studio"))
    recent = model.addMenu("&Recent")

    def fill_recent() -> None:
        recent.clear()
        for row in recent_models(w.store):
            spec, backend = row["spec"], row.get("backend", "auto")
            a = recent.addAction(f"{spec}  ({backend})")
            a.triggered.connect(
                lambda _c=False, s=spec, b=backend: w.host.loading or w.load_model(None if s == "default" else s, b)
            )
        recent.setEnabled(not recent.isEmpty())

    model.aboutToShow.connect(fill_recent)
    fill_recent()

    view = bar.addMenu("&View")
    heat = act("heatmap", "&Token heatmap", w.toggle_heatmap, "Ctrl+H")
    heat.setCheckable(True)
    heat.setChecked(w.view_options.heatmap)
    w.view_options.changed.connect(lambda: heat.setChecked(w.view_options.heatmap))
    view.addAction(heat)
    view.addAction(act("prev_token", "&Previous token", lambda: w.inspector.step(-1), "Alt+Left"))
    view.addAction(act("next_token", "&Next token", lambda: w.inspector.step(+1), "Alt+Right"))
    view.addSeparator()
    for dock in (w.chats_dock, w.sampling_dock, w.inspector_dock):
        view.addAction(dock.toggleViewAction())
    if w.theme is not None:
        appearance = view.addMenu("&Appearance")
        group = QActionGroup(w)
        for scheme in ("system", "light", "dark"):
            a = appearance.addAction(scheme.capitalize() if scheme != "system" else "Follow the system")
            a.setCheckable(True)
            a.setChecked(w.theme.scheme == scheme)
            a.triggered.connect(lambda _c=False, s=scheme: w.set_appearance(s))
            group.addAction(a)

    help_ = bar.addMenu("&Help")
    help_.addAction(act("log_file", "Show &log file", lambda: show_log_file(w), tip="Open the folder with the log file"))
    help_.addAction(act("shortcuts", "&Keyboard shortcuts", lambda: QMessageBox.information(w, "Keyboard shortcuts", SHORTCUTS_HELP)))
    help_.addAction(
        act(
            "about",
            "&About Logit Lab",
            lambda: QMessageBox.about(
                w,
                "About Logit Lab",
                f"<b>Logit Lab {__version__}</b><p>Chat with a local language model and see how it samples: "
                "every token's probability, its alternatives, and what each sampler stage did.</p>",
            ),
        )
    )
    return actions


def _focus_search(w: "MainWindow"):
    def focus() -> None:
        w.chats_dock.show()
        w.chats_dock.raise_()
        w.sidebar.search.setFocus()
        w.sidebar.search.selectAll()

    return focus
