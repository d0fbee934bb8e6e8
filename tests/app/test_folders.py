"""Folders and tags for chats (issue 48 item 3): the migration from version 4, the sidebar's filter with the
search, a drag and the context menu's move, rename and delete, and foreign rows that must not stop the list."""

from __future__ import annotations

import json
import sqlite3

import pytest
import shiboken6
from PySide6.QtCore import QPointF, Qt, QTimer
from PySide6.QtGui import QContextMenuEvent, QDragMoveEvent, QDropEvent
from PySide6.QtWidgets import QAbstractItemView, QApplication, QInputDialog, QMenu, QMessageBox

from app.state import folders as folder_tables
from app.state.conversation import Conversation
from app.state.export import to_json_dict, to_markdown
from app.state.folders import ALL, NONE, Folders
from app.state.database.store import SCHEMA, SCHEMA_VERSION, Store


def _titles(sidebar) -> list[str]:
    return [sidebar.list.item(i).text() for i in range(sidebar.list.count())]


def _chat_item(sidebar, title: str):
    return next(sidebar.list.item(i) for i in range(sidebar.list.count()) if sidebar.list.item(i).text() == title)


def _folder_names(sidebar) -> list[str]:
    rows = sidebar.folder_pane.folders
    return [rows.item(i).text() for i in range(rows.count())]


def _action(menu: QMenu, *path: str):
    """The action at `path` ("Move to folder", "Work") in a menu and its submenus."""
    for name in path[:-1]:
        menu = next(a.menu() for a in menu.actions() if a.text() == name)
    return next(a for a in menu.actions() if a.text() == path[-1])


def _v4_database(path) -> None:
    """A database as version 4 wrote it: the schema without the folder tables, two chats."""
    conn = sqlite3.connect(path)
    for statement in filter(str.strip, SCHEMA.split(";")):
        if not any(f" {table}" in statement for table in folder_tables.TABLES):  # the folder tables and index
            conn.execute(statement)
    for title in ("old chat", "older chat"):
        conn.execute("INSERT INTO conversations(title, system_prompt, created, updated) VALUES (?, '', 1, 1)", (title,))
    conn.execute("INSERT INTO messages(conversation_id, parent_id, role, content, created) VALUES (1, NULL, 'user', 'hi', 1)")
    conn.execute("PRAGMA user_version = 4")
    conn.commit()
    conn.close()


def test_a_version_4_database_keeps_its_chats_in_no_folder_and_takes_folders(tmp_path):
    path = tmp_path / "v4.sqlite3"
    _v4_database(path)
    assert "folders" not in {r[0] for r in sqlite3.connect(path).execute("SELECT name FROM sqlite_master")}
    store = Store(path)
    assert sorted(r.title for r in store.conversations()) == ["old chat", "older chat"]
    folders = Folders(store)
    assert folders.all() == [] and folders.assignments() == {} and folders.tag_map() == {}
    work = folders.create("Work")
    folders.move(1, work.id)
    folders.add_tag(1, "greeting")
    store.close()
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 5
    store = Store(path)
    folders = Folders(store)
    assert folders.all() == [work] and folders.assignments() == {1: work.id} and folders.tags_of(1) == ["greeting"]
    conv = Conversation(store, store.conversation(1), store.messages(1))
    assert [m.content for m in conv.path()] == ["hi"]
    assert store.damage_seen == []
    store.close()


def test_export_keeps_the_folder_and_the_tags(store):
    row = store.create_conversation("plans")
    folders = Folders(store)
    folders.move(row.id, folders.create("Trips").id)
    folders.add_tag(row.id, "summer")
    folders.add_tag(row.id, "SUMMER")  # the same tag in another case: kept once
    conv = Conversation(store, row, [])
    doc = json.loads(json.dumps(to_json_dict(conv)))
    assert (doc["folder"], doc["tags"]) == ("Trips", ["summer"])
    assert "*Folder: `Trips`* · *Tags: `summer`*" in to_markdown(conv)
    untagged = Conversation(store, store.create_conversation("loose"), [])
    assert (to_json_dict(untagged)["folder"], to_json_dict(untagged)["tags"]) == (None, [])
    assert "Folder" not in to_markdown(untagged)


def test_the_folder_and_tag_filters_work_with_the_search(qtbot, window):
    sidebar, lib = window.sidebar, window.library
    ids = {t: lib.add_unopened(t).id for t in ("cats at home", "cats abroad", "dogs at home", "dogs abroad")}
    home = lib.create_folder("Home")
    lib.move_to_folder(ids["cats at home"], home)
    lib.move_to_folder(ids["dogs at home"], home)
    lib.set_tag(ids["cats at home"], "pets", True)
    lib.set_tag(ids["cats abroad"], "pets", True)
    qtbot.waitUntil(lambda: "Home" in _folder_names(sidebar))
    assert sidebar.folder_pane.tags.isVisibleTo(sidebar)

    sidebar.folder_pane.folders.setCurrentItem(sidebar.folder_pane.folders.item_of(home))  # a click on "Home"
    qtbot.waitUntil(lambda: sorted(_titles(sidebar)) == ["cats at home", "dogs at home"])
    qtbot.keyClicks(sidebar.search, "cats")
    qtbot.waitUntil(lambda: _titles(sidebar) == ["cats at home"])
    sidebar.folder_pane.folders.setCurrentItem(sidebar.folder_pane.folders.item_of(NONE))
    qtbot.waitUntil(lambda: _titles(sidebar) == ["cats abroad"])
    sidebar.search.clear()
    sidebar.folder_pane.tags.setCurrentIndex(sidebar.folder_pane.tags.findData("pets"))
    qtbot.waitUntil(lambda: _titles(sidebar) == ["cats abroad"])  # no folder, tagged pets
    sidebar.folder_pane.folders.setCurrentRow(0)  # All chats, still tagged pets
    qtbot.waitUntil(lambda: sorted(_titles(sidebar)) == ["cats abroad", "cats at home"])
    sidebar.folder_pane.tags.setCurrentIndex(0)
    qtbot.waitUntil(lambda: len(_titles(sidebar)) == 5)  # with the chat the window opened


def test_a_chat_dragged_onto_a_folder_or_moved_from_its_menu_goes_there(qtbot, window, monkeypatch):
    sidebar, lib = window.sidebar, window.library
    chat = lib.add_unopened("the cat")
    work = lib.create_folder("Work")
    qtbot.waitUntil(lambda: "Work" in _folder_names(sidebar) and "the cat" in _titles(sidebar))

    # The drag: the chat list's own drag data (what its drag carries), over and dropped on the folder's row.
    # Qt delivers no synthetic drop event to a widget outside a drag it runs itself, so the list's handlers
    # get the events as Qt's drag would hand them over.
    folders = sidebar.folder_pane.folders
    mime = sidebar.list.mimeData([_chat_item(sidebar, "the cat")])

    def drop_on(choice, kind=QDropEvent):
        at = QPointF(folders.visualItemRect(folders.item_of(choice)).center())
        event = kind(at, Qt.DropAction.MoveAction, mime, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier)
        (folders.dragMoveEvent if kind is QDragMoveEvent else folders.dropEvent)(event)
        return event.isAccepted()

    assert drop_on(work, QDragMoveEvent) and not drop_on(ALL, QDragMoveEvent)  # "All chats" takes no chat
    assert drop_on(work)
    assert lib.folders.folder_of(chat.id) == work
    qtbot.waitUntil(lambda: "in the folder Work" in _chat_item(sidebar, "the cat").toolTip())
    # Dropped on "No folder": out again; on "All chats": nothing happens.
    assert drop_on(NONE) and lib.folders.folder_of(chat.id) is None
    assert not drop_on(ALL) and lib.folders.folder_of(chat.id) is None

    # The menu (what right click and the Menu key open): Move to folder ▸ Work, then a new folder from it.
    _action(sidebar.chat_menu(chat.id), "Move to folder", "Work").trigger()
    assert lib.folders.folder_of(chat.id) == work
    menu = sidebar.chat_menu(chat.id)
    assert _action(menu, "Move to folder", "Work").isChecked()
    monkeypatch.setattr(QInputDialog, "getText", staticmethod(lambda *a, **k: ("Later", True)))
    _action(menu, "Move to folder", "New folder…").trigger()
    later = next(f for f in lib.folders.all() if f.name == "Later")
    assert lib.folders.folder_of(chat.id) == later.id
    # Tags from the same menu: added, listed, removed.
    monkeypatch.setattr(QInputDialog, "getText", staticmethod(lambda *a, **k: ("#urgent", True)))
    _action(sidebar.chat_menu(chat.id), "Tags", "Add tag…").trigger()
    assert lib.folders.tags_of(chat.id) == ["urgent"]
    tag = _action(sidebar.chat_menu(chat.id), "Tags", "#urgent")
    assert tag.isChecked()
    tag.trigger()
    assert lib.folders.tags_of(chat.id) == []


def test_the_menu_key_opens_the_chat_menu_and_moves_the_chat_by_keyboard(qtbot, window):
    sidebar, lib = window.sidebar, window.library
    chat = lib.add_unopened("by keyboard")
    work = lib.create_folder("Work")
    qtbot.waitUntil(lambda: "by keyboard" in _titles(sidebar) and "Work" in _folder_names(sidebar))
    sidebar.list.setCurrentItem(_chat_item(sidebar, "by keyboard"))
    sidebar.list.setFocus()
    menus: list[QMenu] = []

    def walk() -> None:  # in the open menu: Move to folder ▸ (No folder, Work, …) ▸ Work, all by keys
        menu = QApplication.activePopupWidget()
        if not isinstance(menu, QMenu) or menu in menus:
            QTimer.singleShot(20, walk)
            return
        menus.append(menu)
        want = "Move to folder" if len(menus) == 1 else "Work"
        for _ in range(len(menu.actions()) + 1):  # down the entries to the one wanted, as a person does
            if menu.activeAction() is not None and menu.activeAction().text() == want:
                break
            qtbot.keyClick(menu, Qt.Key.Key_Down)
        if len(menus) == 1:
            qtbot.keyClick(menu, Qt.Key.Key_Right)
            QTimer.singleShot(20, walk)
        else:
            qtbot.keyClick(menu, Qt.Key.Key_Return)

    QTimer.singleShot(0, walk)
    guard = QTimer()  # never left open by a failure: closed after 5 s (stopped once the test is through)
    guard.setSingleShot(True)
    guard.timeout.connect(lambda: [m.close() for m in reversed(menus) if shiboken6.isValid(m)])
    guard.start(5000)
    # What the Menu key (or Shift+F10) becomes: a context menu event of the keyboard, at the selected row.
    at = sidebar.list.visualItemRect(sidebar.list.currentItem()).center()
    QApplication.sendEvent(sidebar.list.viewport(), QContextMenuEvent(
        QContextMenuEvent.Reason.Keyboard, at, sidebar.list.viewport().mapToGlobal(at)))
    qtbot.waitUntil(lambda: len(menus) == 2)
    assert menus[0].actions()[0].text() == "Move to folder" and menus[1].title() == "Move to folder"
    qtbot.waitUntil(lambda: lib.folders.folder_of(chat.id) == work)
    guard.stop()


def test_a_folder_is_made_renamed_and_deleted_and_its_chats_stay(qtbot, window, monkeypatch):
    sidebar, lib = window.sidebar, window.library
    chat = lib.add_unopened("kept")
    qtbot.mouseClick(sidebar.folder_pane.new_button, Qt.MouseButton.LeftButton)
    folders = sidebar.folder_pane.folders
    assert folders.state() == QAbstractItemView.State.EditingState  # the new folder's name, open for typing
    (made,) = lib.folders.all()
    assert made.name == "New folder"
    qtbot.waitUntil(lambda: folders.state() == QAbstractItemView.State.EditingState)  # a reload kept the editor
    folders.currentItem().setText("Projects")  # what the editor does on Enter
    assert [f.name for f in lib.folders.all()] == ["Projects"]
    folders.closePersistentEditor(folders.currentItem())
    qtbot.waitUntil(lambda: "Projects" in _folder_names(sidebar))
    folders.item_of(made.id).setText("   ")  # a name of nothing: said in words, the old name kept
    qtbot.waitUntil(lambda: "Projects" in _folder_names(sidebar))
    assert sidebar.folder_pane.note.text() == "Renaming the folder: a folder needs a name."
    assert [f.name for f in lib.folders.all()] == ["Projects"]

    lib.move_to_folder(chat.id, made.id)
    folders.setCurrentItem(folders.item_of(made.id))
    qtbot.waitUntil(lambda: _titles(sidebar) == ["kept"])
    asked: list[str] = []
    monkeypatch.setattr(QMessageBox, "question",
                        staticmethod(lambda _p, _t, text, *a: asked.append(text) or QMessageBox.StandardButton.Yes))
    sidebar.delete_folder(made.id, "Projects")
    assert asked == ["Delete the folder “Projects”? Its chats are kept, in no folder."]
    assert lib.folders.all() == [] and lib.folders.folder_of(chat.id) is None
    qtbot.waitUntil(lambda: "kept" in _titles(sidebar) and len(_titles(sidebar)) == 2)  # back to All chats
    assert window.store.conversation(chat.id) is not None


@pytest.fixture
def foreign_rows(db_path):
    """The database the window opens, with folder rows another tool wrote: foreign keys off, any values."""
    store = Store(db_path)
    good = Folders(store).create("Good")
    for title in ("one", "two", "three"):
        store.create_conversation(title)
    store.close()
    raw = sqlite3.connect(db_path)
    raw.execute("INSERT INTO folders(id, name, created) VALUES (7, CAST(x'fffe41' AS TEXT), 1)")  # not UTF-8
    raw.execute("INSERT INTO folders(id, name, created) VALUES (8, '   ', 1)")  # a name of nothing
    raw.execute("INSERT INTO folders(id, name, created) VALUES (9, x'0102', 1)")  # a name that is bytes
    raw.execute("INSERT INTO conversation_folders(conversation_id, folder_id) VALUES (1, 99)")  # no folder 99
    raw.execute("INSERT INTO conversation_folders(conversation_id, folder_id) VALUES (2, 'abc')")
    raw.execute(f"INSERT INTO conversation_folders(conversation_id, folder_id) VALUES (3, {good.id})")
    raw.execute("INSERT INTO conversation_tags(conversation_id, tag) VALUES (1, CAST(x'ff' AS TEXT))")
    raw.execute("INSERT INTO conversation_tags(conversation_id, tag) VALUES (2, 'fine')")
    raw.commit()
    raw.close()


def test_foreign_and_damaged_folder_rows_do_not_stop_the_sidebar(qtbot, foreign_rows, window):
    sidebar = window.sidebar
    qtbot.waitUntil(lambda: sorted(_titles(sidebar)) == ["one", "three", "two"])
    assert _folder_names(sidebar) == ["All chats", "No folder", "Good"]
    tags = sidebar.folder_pane.tags
    assert [tags.itemText(i) for i in range(tags.count())] == ["All tags", "#fine"]
    sidebar.folder_pane.folders.setCurrentItem(sidebar.folder_pane.folders.item_of(NONE))
    qtbot.waitUntil(lambda: sorted(_titles(sidebar)) == ["one", "two"])  # their folders are not there
    assert any("3 folder row(s) could not be read" in d for d in window.store.damage_seen)
    assert any("1 tag row(s) could not be read" in d for d in window.store.damage_seen)


def test_a_repaired_database_keeps_the_folders_and_tags_of_the_chats_it_keeps(tmp_path):
    from app.state.database.recovery import salvage_into

    source = Store(tmp_path / "source.sqlite3")
    kept, other = source.create_conversation("kept"), source.create_conversation("also kept")
    folders = Folders(source)
    work = folders.create("Work")
    folders.move(kept.id, work.id)
    folders.add_tag(other.id, "later")
    source.close()
    target = Store(tmp_path / "target.sqlite3")
    salvage_into(tmp_path / "source.sqlite3", target)
    copied = Folders(target)
    assert copied.all() == [work] and copied.assignments() == {kept.id: work.id}
    assert copied.tag_map() == {other.id: ["later"]}
    target.close()
