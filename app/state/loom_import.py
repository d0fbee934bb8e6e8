"""Import a loom file: check all of it against what a loom file is, then write it in one transaction.

A loom file (`app/state/loom_tree.export_tree`) is a prompt and a question's
answers, each with its token records, settings, model and stats. A file is
data from anywhere, so before anything is written every value is checked:
types (a mapping where a mapping belongs, integers where counts belong),
finite numbers, token ids in a sane range (the model's own vocabulary is
checked when a tree is continued), sizes (file, answers, tokens, texts) and
nesting. A file that fails any check is refused with one line saying where
and why, and the database is left exactly as it was; one that passes is
written as a new conversation in a single transaction, so a failure while
writing (a full disk, a busy database) leaves nothing half-written either.
"""

from __future__ import annotations

import json
import math
import sqlite3
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine import TokenEvent, TokenProb

from app.state.conversation import DEFAULT_TITLE, Conversation, Message, _title_from
from app.state.conversation_list import Library
from app.state.json_safe import json_safe, number_in
from app.state.database.message_fields import (
    STATS_FLOATS, FieldError, check_branch_index, check_finish_reason, check_json, check_model, check_request,
    check_stats, is_int, is_number,
)
from app.state.database.records import token_from_row

FORMAT = "logitlab-loom"
VERSION = 1

MAX_FILE_BYTES = 64 * 2**20
MAX_ANSWERS = 1_000
MAX_TOKENS_PER_ANSWER = 100_000
MAX_TOKENS = 1_000_000
MAX_MESSAGES = 10_000
MAX_TOKEN_CHARS = 1_024  # a token's text: a few bytes in every vocabulary; a megabyte "token" is an attack
MAX_ALTERNATIVES = 1_000  # candidates per list (the app records 20)
MAX_TITLE_CHARS = 1_000
TOKEN_ID_LIMIT = 2**31  # ids are 0 <= id < 2**31 (vocabularies are far smaller); -2 is the "rest" entry
REST_ID = -2
LOGPROB_SLACK = 1e-3  # a log-probability is <= 0; rounding may leave a hair above


class LoomImportError(ValueError):
    """The file is not a loom tree this version can read (one line, in words)."""


@dataclass
class ImportedAnswer:
    tokens: list[TokenEvent]
    branch_index: int | None
    finish_reason: str
    request: dict[str, Any] | None
    model: dict[str, Any] | None
    stats: dict[str, Any] | None


@dataclass
class ImportedTree:
    title: str | None
    system_prompt: str
    messages: list[tuple[str, str]]  # (role, content): the prompt, ending with the question
    answers: list[ImportedAnswer] = field(default_factory=list)


# -- reading the file ---------------------------------------------------------------------------


def read_loom_file(path: str | Path) -> Any:
    """The JSON document in `path`, read with bounds (size, nesting). Raises LoomImportError in words."""
    path = Path(path)
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):
            raise LoomImportError(f"{path.name} is not a regular file")
        if info.st_size > MAX_FILE_BYTES:
            raise LoomImportError(f"{path.name} is {info.st_size / 2**20:.0f} MB; a loom file can be at most "
                                  f"{MAX_FILE_BYTES // 2**20} MB")
        with path.open("rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise LoomImportError(f"{path.name} cannot be read ({e.strerror or e})") from None
    if len(data) > MAX_FILE_BYTES:
        raise LoomImportError(f"{path.name} is larger than {MAX_FILE_BYTES // 2**20} MB, the most a loom file can be")
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise LoomImportError(f"{path.name} cannot be read as JSON (it is not UTF-8 text: {e.reason} "
                              f"at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise LoomImportError(f"{path.name} cannot be read as JSON ({e})") from None
    except RecursionError:
        raise LoomImportError(f"{path.name} is nested too deeply to be a loom tree") from None
    except MemoryError:
        raise LoomImportError(f"{path.name} is too large to read") from None


# -- checking it -------------------------------------------------------------------------------


def parse_tree(doc: Any) -> ImportedTree:
    """Check a whole loom document and return it as typed values. Raises LoomImportError naming where and why."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise LoomImportError(f"this file is not a Logit Lab loom tree (its \"format\" is not \"{FORMAT}\")")
    version = doc.get("version")
    if not is_int(version) or not 1 <= version <= VERSION:
        raise LoomImportError(f"this loom tree has version {_short(version)}; this Logit Lab reads version {VERSION}")
    title = doc.get("title")
    if title is not None and not isinstance(title, str):
        raise LoomImportError(f"this loom tree's title is {_short(title)}, not a text")
    system, messages = _prompt(doc.get("messages"))
    answers = doc.get("answers")
    if not isinstance(answers, list) or not answers:
        raise LoomImportError("this loom tree has no answers")
    if len(answers) > MAX_ANSWERS:
        raise LoomImportError(f"this loom tree has {len(answers):,} answers; at most {MAX_ANSWERS:,} can be imported")
    tree = ImportedTree(title=title[:MAX_TITLE_CHARS] if title else None, system_prompt=system, messages=messages)
    total = 0
    for n, a in enumerate(answers, 1):
        try:
            answer = _answer(a)
        except (FieldError, LoomImportError) as e:
            raise LoomImportError(f"answer {n} of this loom tree cannot be imported: {e}") from None
        total += len(answer.tokens)
        if total > MAX_TOKENS:
            raise LoomImportError(f"this loom tree has more than {MAX_TOKENS:,} tokens, the most that can be imported")
        tree.answers.append(answer)
    return tree


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:39] + "…"


def _prompt(messages: Any) -> tuple[str, list[tuple[str, str]]]:
    if not isinstance(messages, list) or not messages:
        raise LoomImportError("this loom tree has no prompt")
    if len(messages) > MAX_MESSAGES:
        raise LoomImportError(f"this loom tree's prompt has {len(messages):,} messages; at most {MAX_MESSAGES:,}")
    system, out = "", []
    for n, m in enumerate(messages, 1):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant"):
            raise LoomImportError(f"message {n} of this loom tree's prompt is not a system, user or assistant message")
        content = m.get("content", "")
        if not isinstance(content, str):
            raise LoomImportError(f"message {n} of this loom tree's prompt has content that is not a text")
        if m["role"] == "system":
            system = system or content
        else:
            out.append((m["role"], content))
    if not out or out[-1][0] != "user":
        raise LoomImportError("this loom tree's prompt does not end with a user message")
    return system, out


def _answer(a: Any) -> ImportedAnswer:
    if not isinstance(a, dict):
        raise LoomImportError("it is not a mapping")
    raw_tokens = a.get("tokens")
    if not isinstance(raw_tokens, list):
        raise LoomImportError("its tokens are not a list")
    if len(raw_tokens) > MAX_TOKENS_PER_ANSWER:
        raise LoomImportError(f"it has {len(raw_tokens):,} tokens; at most {MAX_TOKENS_PER_ANSWER:,}")
    tokens = [_token(t, i) for i, t in enumerate(raw_tokens)]
    request = a.get("request")
    if request is not None:
        check_json(request, "its request")  # NaN and +inf refused here; -inf (a ban) allowed, then spelled in JSON
        request = json_safe(request)
    stats = a.get("stats")
    if isinstance(stats, dict):  # json_safe wrote non-finite times as "-inf"/"inf"/"nan": numbers again
        stats = {k: number_in(v) if k in STATS_FLOATS or k == "constraint_logprob" else v for k, v in stats.items()}
    seed = a.get("seed")
    if seed is not None and not is_int(seed):
        raise LoomImportError(f"its seed is {_short(seed)}, not an integer")
    if stats is None and seed is not None:
        stats = {"seed": seed}
    finish = a.get("finish_reason")
    return ImportedAnswer(
        tokens=tokens,
        branch_index=check_branch_index(a.get("branch_index"), len(tokens)),
        finish_reason=check_finish_reason(finish) or "length",  # an export has every answer finished
        request=check_request(request),
        model=check_model(a.get("model")),
        stats=check_stats(stats),
    )


def _token(t: Any, i: int) -> TokenEvent:
    where = f"token {i + 1}"
    if not isinstance(t, dict):
        raise LoomImportError(f"{where} is not a mapping")
    token_id = t.get("token_id")
    if not is_int(token_id) or not 0 <= token_id < TOKEN_ID_LIMIT:
        raise LoomImportError(f"{where} has the id {_short(token_id)}; a token id is an integer from 0 to 2**31 - 1")
    text, token_text = t.get("text"), t.get("token_text", t.get("text"))
    for name, value in (("text", text), ("token text", token_text)):
        if not isinstance(value, str):
            raise LoomImportError(f"{where}'s {name} is not a text")
        if len(value) > MAX_TOKEN_CHARS:
            raise LoomImportError(f"{where}'s {name} is {len(value):,} characters long; a token has at most "
                                  f"{MAX_TOKEN_CHARS:,}")
    for name in ("logprob", "sampler_logprob"):
        _logprob(t.get(name), f"{where}'s {name}")
    rank, entropy = t.get("rank", 0), t.get("entropy", 0.0)
    if not is_int(rank) or not 0 <= rank < TOKEN_ID_LIMIT:
        raise LoomImportError(f"{where}'s rank is {_short(rank)}, not a count")
    if not is_number(entropy) or entropy < -LOGPROB_SLACK:
        raise LoomImportError(f"{where}'s entropy is {_short(entropy)}, not a finite number of nats >= 0")
    for name in ("forced", "special"):
        if t.get(name) not in (None, True, False, 0, 1):
            raise LoomImportError(f"{where}'s {name!r} is {_short(t.get(name))}, not true or false")
    alternatives = t.get("alternatives")
    if alternatives is None:
        alternatives = {"m": [], "s": []}
    if not isinstance(alternatives, dict):
        raise LoomImportError(f"{where}'s alternatives are not a mapping")
    try:
        check_json(alternatives, f"{where}'s alternatives")
        for key in ("m", "s"):
            rows = alternatives.get(key, [])
            if not isinstance(rows, list) or len(rows) > MAX_ALTERNATIVES:
                raise LoomImportError(f"{where}'s alternatives are not a list of at most {MAX_ALTERNATIVES:,}")
        alternatives = {"m": [], "s": [], **alternatives}
        event = token_from_row((
            i, token_id, text, token_text, t.get("logprob"), t.get("sampler_logprob"), rank, float(entropy),
            int(bool(t.get("forced"))), int(bool(t.get("special"))), json.dumps(alternatives, allow_nan=False),
        ))
    except FieldError as e:
        raise LoomImportError(str(e)) from None
    except (KeyError, TypeError, ValueError, IndexError, OverflowError) as e:
        raise LoomImportError(f"{where}'s alternatives cannot be read ({type(e).__name__}: {e})") from None
    _check_event(event, where)
    return event


def _logprob(value: Any, name: str) -> None:
    # null is -inf (a token the sampler had cut), as the export writes it.
    if value is not None and (not is_number(value) or value > LOGPROB_SLACK):
        raise LoomImportError(f"{name} is {_short(value)}, not a log-probability (a finite number <= 0, or null)")


def _check_probs(probs: tuple[TokenProb, ...], where: str) -> None:
    for p in probs:
        if not (p.token_id == REST_ID or 0 <= p.token_id < TOKEN_ID_LIMIT):
            raise LoomImportError(f"{where} has an alternative with the id {p.token_id}, outside 0 to 2**31 - 1")
        if math.isnan(p.logprob) or p.logprob > LOGPROB_SLACK:
            raise LoomImportError(f"{where} has an alternative with the log-probability {p.logprob}")
        if len(p.text) > MAX_TOKEN_CHARS:
            raise LoomImportError(f"{where} has an alternative {len(p.text):,} characters long")


def _check_event(ev: TokenEvent, where: str) -> None:
    """The numbers deep in a token's record (alternatives, stages, constraint, rewind) are sane."""
    _check_probs(ev.top_model, where)
    _check_probs(ev.top_sampler, where)
    for s in ev.stages or ():
        if s.survivors < 0 or not (math.isfinite(s.mass_kept) and math.isfinite(s.entropy)) or len(s.top) > MAX_ALTERNATIVES:
            raise LoomImportError(f"{where} has a sampler stage ({s.stage[:40]!r}) with numbers that are not sane")
        _check_probs(s.top, where)
    if ev.constraint is not None:
        if ev.constraint.allowed < 0 or not math.isfinite(ev.constraint.mass_kept):
            raise LoomImportError(f"{where} has a constraint step with numbers that are not sane")
        _check_probs(ev.constraint.disallowed, where)
    if ev.rewind is not None and (ev.rewind.withdrawn < 0 or not 0 <= ev.rewind.banned_token_id < TOKEN_ID_LIMIT):
        raise LoomImportError(f"{where} has a rewind with numbers that are not sane")


# -- writing it ---------------------------------------------------------------------------------


def import_tree(library: Library, doc: Any) -> tuple[Conversation, Message]:
    """A new conversation holding an exported tree: its prompt, then every answer as a branch of the question.

    The whole document is checked first; then everything is written in one transaction, so a failure
    leaves the database as it was. Returns the conversation (opened) and its question. Raises
    LoomImportError in words.
    """
    tree = parse_tree(doc)
    store = library.store
    try:
        with store.transaction():
            first_user = next((c for r, c in tree.messages if r == "user"), "")
            title = " ".join((tree.title or "").split()) or _title_from(first_user) or DEFAULT_TITLE
            conv_row = store.create_conversation(title, tree.system_prompt)
            parent_id: int | None = None
            for role, content in tree.messages:
                row = store.insert_message(conv_row.id, parent_id, role, content)
                if role == "assistant":
                    store.update_message(row.id, finish_reason="eos")
                if parent_id is None:
                    store.update_conversation(conv_row.id, active_root_id=row.id)
                else:
                    store.update_message(parent_id, active_child_id=row.id)
                parent_id = row.id
            question_id = parent_id
            assert question_id is not None  # parse_tree's prompt is never empty: it ends with the question
            for a in tree.answers:
                row = store.insert_message(conv_row.id, question_id, "assistant", "".join(t.text for t in a.tokens),
                                           branch_index=a.branch_index, request=a.request, model=a.model)
                store.update_message(row.id, finish_reason=a.finish_reason, stats=a.stats)
                store.write_tokens(row.id, a.tokens)
                store.update_message(question_id, active_child_id=row.id)  # the newest shown, as when added by hand
    except sqlite3.Error as e:
        raise LoomImportError(f"the loom tree could not be saved ({e}); nothing was imported") from None
    conv = library.open(conv_row.id)
    library.list_changed.emit()
    return conv, conv.messages[question_id]


def import_loom_file(library: Library, path: str | Path) -> tuple[Conversation, Message]:
    """Read, check and import the loom file at `path` (Loom ▸ Import…). Raises LoomImportError in words."""
    return import_tree(library, read_loom_file(path))
