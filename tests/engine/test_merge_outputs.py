"""Folding a request's deltas into one output (offline results, a lagging stream's chunk)."""

from __future__ import annotations

from tessel.engine.request import CompletionOutput, Logprob, RequestOutput, merge_outputs


def _delta(choices: list[CompletionOutput], finished: bool = False, prompt_lp: list | None = None) -> RequestOutput:
    return RequestOutput("r", [1, 2], choices, finished, prompt="p", prompt_logprobs=prompt_lp)


def test_choices_joined_in_index_order_and_the_last_finish_kept() -> None:
    lp = [Logprob(5, -0.1), Logprob(6, -0.2), Logprob(7, -0.3)]
    deltas = [
        _delta([CompletionOutput(1, "x", [9]), CompletionOutput(0, "a", [5], logprobs=lp[:1])],
               prompt_lp=[None, Logprob(2, -1.0)]),
        _delta([CompletionOutput(0, "bc", [6, 7], logprobs=lp[1:])]),
        _delta([CompletionOutput(1, "y", [8], finish_reason="stop", stop_reason="y"),
                CompletionOutput(0, "", [], finish_reason="length")], finished=True),
    ]
    before = [[(c.text, list(c.token_ids)) for c in d.outputs] for d in deltas]
    out = merge_outputs(deltas)
    assert [c.index for c in out.outputs] == [0, 1]
    first, second = out.outputs
    assert (first.text, first.token_ids, first.logprobs, first.finish_reason) == ("abc", [5, 6, 7], lp, "length")
    assert (second.text, second.token_ids, second.logprobs) == ("xy", [9, 8], None)
    assert (second.finish_reason, second.stop_reason) == ("stop", "y")
    assert out.finished and out.prompt == "p" and out.prompt_logprobs == [None, Logprob(2, -1.0)]
    assert [[(c.text, list(c.token_ids)) for c in d.outputs] for d in deltas] == before  # not changed


def test_logprobs_start_where_a_later_delta_first_has_them() -> None:
    out = merge_outputs([
        _delta([CompletionOutput(0, "a", [1])]),
        _delta([CompletionOutput(0, "b", [2], logprobs=[Logprob(2, -0.5)])]),
    ])
    assert out.outputs[0].logprobs == [Logprob(2, -0.5)] and not out.finished
