"""Issue 36 item 2 in the window: an answer whose stored tokens hold an id outside the model's vocabulary
(an imported tree: 1,000,000 or -7) is refused in words on Continue and on a branch; the answer is kept.

(On llama.cpp the same ids aborted the process; tests/hostile/test_token_ids.py runs that model.)
"""

from __future__ import annotations

import pytest

from engine import TokenEvent

from qt_helpers import run_task


def _answer_with(window, token_id: int):
    conv = window.library.new()
    user = conv.add_message(None, "user", "Tell me a story")
    answer = conv.add_message(user, "assistant")
    ok = TokenEvent(index=0, token_id=7, text=" the", token_text=" the", logprob=-1.0, sampler_logprob=-1.0,
                    rank=0, entropy=1.0, top_model=(), top_sampler=())
    bad = TokenEvent(index=1, token_id=token_id, text=" ?", token_text=" ?", logprob=-1.0, sampler_logprob=-1.0,
                     rank=0, entropy=1.0, top_model=(), top_sampler=())
    conv.set_tokens(answer, [ok, bad], " the ?")
    conv.update_message(answer, finish_reason="length")
    return conv, answer


@pytest.mark.parametrize("bad_id", [1_000_000, -7])
def test_continue_refuses_an_id_outside_the_vocabulary_in_words(qtbot, window, bad_id):
    conv, answer = _answer_with(window, bad_id)
    errors: list[str] = []
    window.controller.error.connect(errors.append)
    run_task(qtbot, window.controller.continue_answer(answer))
    assert errors, "no error was reported"
    said = errors[-1]
    assert str(bad_id) in said and ("outside this model's vocabulary" in said or "0 or more" in said), said
    assert [t.token_id for t in answer.tokens[:2]] == [7, bad_id]  # nothing of the answer is lost
    assert not window.controller.busy


def test_a_branch_to_an_id_outside_the_vocabulary_is_refused(qtbot, window):
    conv, answer = _answer_with(window, 9)
    errors: list[str] = []
    window.controller.error.connect(errors.append)
    run_task(qtbot, window.controller.branch(answer, 1, 1_000_000))
    assert errors and "forced token id 1000000 is outside this model's vocabulary" in errors[-1], errors
