"""The inspector's branch button shows the token whole when the row has room, and cuts it only to fit.

At 1440x900 the README's branch screenshot read 'Resample “␣scatteri…”' on a 290 px button: the token was
cut to 10 characters whatever the width.
"""

from __future__ import annotations

from PySide6.QtWidgets import QHBoxLayout, QPushButton, QWidget

from app.widgets.chat.token_button import TokenButton


def _row(qtbot, width: int) -> tuple[QWidget, TokenButton]:
    """The inspector's row: the branch button (stretching) beside "N continuations here"."""
    row = QWidget()
    lay = QHBoxLayout(row)
    button = TokenButton("Branch from here", longest_verb="Branch with")
    lay.addWidget(button, 1)
    lay.addWidget(QPushButton("N continuations here"))
    qtbot.addWidget(row)
    row.resize(width, 40)
    row.show()
    qtbot.waitExposed(row)
    return row, button


def _fits(button: TokenButton) -> bool:
    return button.fontMetrics().horizontalAdvance(button.text()) + button._padding() <= button.width()


def test_a_wide_row_shows_the_whole_token(qtbot):
    _row_widget, button = _row(qtbot, 700)
    button.set_token("Resample", "␣scattering")
    assert button.text() == "Resample “␣scattering”" and _fits(button)


def test_a_narrow_row_cuts_the_token_to_the_button_and_grows_it_back(qtbot):
    row, button = _row(qtbot, 320)
    long_token = "␣internationalization_of_everything"
    button.set_token("Branch with", long_token)
    assert button.text().startswith("Branch with “") and button.text().endswith("…”")
    assert _fits(button)
    assert row.minimumSizeHint().width() <= 320  # a long token never widens the dock
    assert button.label() == f"Branch with “{long_token}”"
    row.resize(900, 40)
    qtbot.waitUntil(lambda: button.text() == f"Branch with “{long_token}”")
    button.set_plain("Branch from here")
    assert button.text() == "Branch from here"
