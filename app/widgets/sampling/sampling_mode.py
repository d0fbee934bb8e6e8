"""Who samples on a remote model (the server, or we from its top-N), and the controls that choice rules out.

In server-samples mode the server's own sampler runs, so only the settings it
has a parameter for can apply (`engine.server_sampler_fields`); every other
control is disabled with a tooltip that says why. A server that gives no
log-probs or has no tokenize endpoint can only sample itself: the choice is
then fixed, again with the reason. Local models hide the box.
"""

from __future__ import annotations

from engine import SAMPLER_CONTROLS, STAGE_ROWS, ModelInfo, server_sampler_fields
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QCheckBox, QGroupBox, QLabel, QVBoxLayout, QWidget

from app.controllers.engine_host import EngineHost
from app.state.models.servers import server_samples
from app.state.settings import SettingsState

# The controls a server may have no parameter for: every stage setting the registry lists (engine's
# SAMPLER_CONTROLS), and the banned strings (no stage: never a server's); the seed and the order have rules below.
SERVER_LIMITED = (*SAMPLER_CONTROLS, "banned_strings")


def sent_fields(taken: frozenset[str]) -> dict[str, bool]:
    """Stage setting -> whether a server that takes `taken` (`server_sampler_fields`) applies it, by the registry's
    rows: a field it names, and for a stage sent by its switch (`server_rule` "switch"), only with that switch."""
    out: dict[str, bool] = {}
    for row in STAGE_ROWS.values():
        switch_sent = row.server_rule != "switch" or row.switches[0] in taken
        out |= {f: f in taken and switch_sent for f in row.fields}
    return out
SERVER_SAMPLES_TIP = (
    "The server samples: fast, streaming, each token with the server's top-N log-probs (heatmap, alternatives). "
    "Its sampler stages are not visible and branching needs we-sample mode. "
    "Off: we sample from the server's top-N, one request per token, with every stage view."
)


class SamplingModeBox(QGroupBox):
    """The "server samples" switch, shown for remote models; `limits()` says which controls it rules out."""

    def __init__(self, settings: SettingsState, host: EngineHost, parent: QWidget | None = None):
        super().__init__("Remote model", parent)
        self._settings = settings
        self._host = host
        self.server_samples = QCheckBox("The server samples")
        self.server_samples.setAccessibleName("The server samples")
        self.server_samples.setToolTip(SERVER_SAMPLES_TIP)
        self.note = QLabel()
        self.note.setTextFormat(Qt.TextFormat.PlainText)  # a server's host name
        self.note.setWordWrap(True)
        self.note.setForegroundRole(self.note.foregroundRole().PlaceholderText)
        lay = QVBoxLayout(self)
        lay.addWidget(self.server_samples)
        lay.addWidget(self.note)
        self.server_samples.toggled.connect(self._on_toggled)
        self.update_from(host.info)

    def _on_toggled(self, on: bool) -> None:
        info = self._host.info
        if info is not None and info.server is not None and info.server.we_sample_ok:  # a forced choice is not the user's to save
            self._settings.set_server_sampling(on)

    def update_from(self, info: ModelInfo | None) -> None:
        if info is None or info.server is None:  # no model, or a local one: nothing to choose
            self.setVisible(False)
            return
        self.setVisible(True)
        facts = info.server
        on = server_samples(self._settings.options.server_sampling, info)
        self.server_samples.blockSignals(True)
        self.server_samples.setChecked(on)
        self.server_samples.blockSignals(False)
        self.server_samples.setEnabled(facts.we_sample_ok)
        self.server_samples.setToolTip(facts.why_server_only or SERVER_SAMPLES_TIP)
        self.note.setText(
            f"{facts.host} ({facts.kind}): the server samples; settings it has no parameter for are off."
            if on else
            f"{facts.host} ({facts.kind}): we sample from its top {info.reports_top_n} log-probs."
        )

    def limits(self, info: ModelInfo | None) -> dict[str, str]:
        """Sampler field -> why it cannot apply now ({} when everything can: local model or we-sample mode)."""
        facts = info.server if info is not None else None
        if facts is None or not server_samples(self._settings.options.server_sampling, info):
            return {}
        fields = server_sampler_fields(facts)
        sent = sent_fields(fields)
        why = f"a {facts.kind} server has no parameter for this: it applies in we-sample mode only"
        own = f"a {facts.kind} server uses a value of its own for this: it applies in we-sample mode only"
        server_own = {f for row in STAGE_ROWS.values() for f in row.server_defaults}
        out = {name: own if name in server_own else why for name in SERVER_LIMITED if not sent.get(name, False)}
        if "seed" not in fields:
            out["seed"] = f"{facts.host} gave different tokens for one seed when probed: seeds apply in we-sample mode"
        if "order" not in fields:
            out["order"] = "the server applies its own stage order: it applies in we-sample mode only"
        return out


def show_limit(widgets: list[QWidget], why: str | None, tip: str) -> None:
    """Disable `widgets` with `why` as their tooltip, or enable them with their own `tip` back."""
    for w in widgets:
        w.setEnabled(why is None)
        w.setToolTip(tip if why is None else f"Off in server-samples mode: {why}")
