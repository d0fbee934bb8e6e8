"""Scoring on a server that reports only its top N: a token outside them is named, not a bare 'perplexity inf'."""

from __future__ import annotations

import math

from remote_server import CharModel

from engine.cli import main as cli_main
from engine.experiments import read_trace

PROBS = {"a": 0.5, "b": 0.3, "c": 0.15, "d": 0.05}  # only these four are ever reported; "z" never is


def test_cli_score_says_which_tokens_fell_outside_the_servers_top_n(serve, tmp_path, capsys):
    server = serve(CharModel(PROBS, max_top=5))
    assert cli_main(["score", "--text", "abzab", "--model", server.url]) == 0
    out = capsys.readouterr().out
    assert "perplexity inf: 1 of them fell outside the server's top" in out
    assert "over the other 3: perplexity" in out

    trace = tmp_path / "score.jsonl"  # -inf / inf went into JSON that refuses them
    assert cli_main(["score", "--text", "abzab", "--model", server.url, "--output", str(trace)]) == 0
    (run,) = read_trace(trace)
    assert run.end["unknown_tokens"] == 1 and run.end["perplexity"] is None
    assert [e.logprob == -math.inf for e in run.events()] == [False, True, False, False]


def test_language_model_score_on_a_server_goes_step_by_step_and_says_why(serve):
    from engine.research import LanguageModel

    server = serve(CharModel(PROBS, max_top=5))
    lm = LanguageModel.load(server.url)
    try:
        inside, outside = lm.score(["abab", "abzab"])
        expected = [math.log(p) for p in (0.3, 0.5, 0.3)]  # what the server said, through float32 logits
        assert all(abs(t.logprob - e) < 1e-6 for t, e in zip(inside.tokens, expected, strict=True))
        assert outside.unknown_tokens == 1 and outside.perplexity == math.inf
        assert "1 of them fell outside the server's top 5" in outside.summary(lm.backend.info.reports_top_n)
    finally:
        lm.close()
