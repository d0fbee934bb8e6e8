"""docs/serve.md names what the server answers (issue 46 item 7): every route the app serves, every field its
parsers read, and `serve --help` lists the same routes (engine.serve.endpoints). A route or field added without
its words in the page fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from engine.serve.endpoints import ENDPOINTS, endpoints_help, fields_help

DOC = (Path(__file__).resolve().parents[2] / "docs" / "serve.md").read_text(encoding="utf-8")


def _routes() -> set[tuple[str, str]]:
    from engine.serve.app import build_app

    # Building the app only lists its routes; nothing is called on the service, so none is needed.
    app = build_app(object())  # type: ignore[arg-type]
    return {(m, r.path) for r in app.routes for m in (r.methods or ()) if m != "HEAD"}


def test_every_route_is_named_in_the_docs_and_the_help():
    served = _routes()
    listed = {(m, p) for m, p, _ in ENDPOINTS}
    # each /v1 route is also served without the prefix, as llama.cpp's server does (the page says so once)
    assert {(m, p.removeprefix("/v1")) if p.startswith("/v1/") else (m, p) for m, p in served} == \
        {(m, p.removeprefix("/v1")) if p.startswith("/v1/") else (m, p) for m, p in listed}
    missing = sorted(p for _, p in listed if f"`{p}`" not in DOC and not re.search(rf"`(GET|POST) {re.escape(p)}`", DOC)
                     and f"`{p.removeprefix('/v1')}`" not in DOC)
    assert not missing, f"docs/serve.md does not name these routes: {missing}"
    help_text = endpoints_help()
    assert all(p in help_text for _, p in listed)


def _named(name: str) -> bool:
    return bool(re.search(rf"(?<![\w]){re.escape(name)}(?![\w])", DOC)) or any(
        name.startswith(p) and f"`{p}*`" in DOC for p in ("dry_", "xtc_"))


@pytest.mark.parametrize("keys", ["CHAT_KEYS", "COMPLETION_KEYS", "SAMPLER_KEYS", "RESPONSES_KEYS", "MESSAGES_KEYS",
                                  "COUNT_KEYS"])
def test_every_field_the_parsers_read_is_named_in_the_docs_and_the_help(keys):
    from engine.serve import anthropic_api, parse, responses_api

    found = next(getattr(m, keys) for m in (parse, responses_api, anthropic_api) if hasattr(m, keys))
    missing = sorted(k for k in found if not _named(k))
    assert not missing, f"docs/serve.md does not name these fields ({keys}): {missing}"
    listed = fields_help()
    assert all(re.search(rf"(?<![\w]){re.escape(k)}(?![\w])", listed) for k in found)
