"""Stop conditions and streamed deltas, with a real byte-level BPE tokenizer."""

from __future__ import annotations

import random
from typing import Any

import pytest

from tessel.engine.output_processor import CompletionAccumulator, OutputProcessor
from tessel.engine.request import CompletionOutput, Logprob, Request
from tessel.engine.sampling_params import SamplingParams
from tessel.engine.stop_strings import find_stop_string, partial_stop_length
from tests.engine.tiny_tokenizer import CORPUS, STOP, tiny_tokenizer

TOK = tiny_tokenizer()
EOS = TOK.eos_token_id
STOP_ID = TOK.convert_tokens_to_ids(STOP)


def start(max_tokens: int = 200, **params: Any) -> tuple[OutputProcessor, Request]:
    request = Request(
        request_id="r",
        prompt_token_ids=TOK.encode("Hello"),
        params=SamplingParams(max_tokens=max_tokens, **params),
        max_tokens=max_tokens,
        eos_token_id=EOS,
    )
    processor = OutputProcessor(TOK)
    processor.add_request(request, index=0)
    return processor, request


def feed(
    processor: OutputProcessor, request: Request, ids: list[int], chunk: int = 1
) -> list[CompletionOutput]:
    """Append ``chunk`` tokens per step, as the scheduler would, until finished or out of ids."""
    deltas = []
    for i in range(0, len(ids), chunk):
        request.output_token_ids.extend(ids[i : i + chunk])
        deltas.append(processor.process(request))
        if deltas[-1].finish_reason is not None:
            break
    return deltas


def joined(deltas: list[CompletionOutput]) -> str:
    return "".join(d.text for d in deltas)


def test_plain_stream_finishes_on_length_with_full_text() -> None:
    ids = TOK.encode(CORPUS[2])
    processor, request = start(max_tokens=len(ids))
    deltas = feed(processor, request, ids + [5, 5])
    assert joined(deltas) == TOK.decode(ids)
    assert [d.finish_reason for d in deltas] == [None] * (len(ids) - 1) + ["length"]
    assert sum((d.token_ids for d in deltas), []) == ids == request.output_token_ids


@pytest.mark.parametrize("include", [False, True])
@pytest.mark.parametrize("chunk", [1, 3])
def test_stop_string_across_tokens_is_never_emitted(include: bool, chunk: int) -> None:
    text = "Hello world! Stop here. END of text 😀"
    ids = TOK.encode(text)
    stop = "here. END"
    assert not any(stop in TOK.decode([i]) for i in ids)  # it does cross token boundaries
    processor, request = start(stop=["nothing", stop], include_stop_str_in_output=include)
    deltas = feed(processor, request, ids, chunk)
    cut = text.index(stop) + (len(stop) if include else 0)
    assert joined(deltas) == text[:cut]
    emitted = ""
    for d in deltas:
        emitted += d.text
        assert text[:cut].startswith(emitted)  # nothing past the cut, ever
    last = deltas[-1]
    assert (last.finish_reason, last.stop_reason, request.stop_reason) == ("stop", stop, stop)
    kept = sum((d.token_ids for d in deltas), [])
    assert kept == request.output_token_ids and stop in TOK.decode(kept) and len(kept) < len(ids)
    assert stop not in TOK.decode(kept[:-1])  # stopped at the token that completed it


def test_possible_stop_prefix_is_held_then_released_at_finish() -> None:
    ids = TOK.encode("Stop here.") + TOK.encode(" E") + TOK.encode("N")
    processor, request = start(max_tokens=len(ids), stop=["END"])
    deltas = feed(processor, request, ids)
    assert joined(deltas[:-1]) == "Stop here. "
    assert (deltas[-1].text, deltas[-1].finish_reason) == ("EN", "length")


def test_held_text_is_released_once_ruled_out() -> None:
    processor, request = start(stop=["END"])
    deltas = feed(processor, request, TOK.encode("a E"))
    assert joined(deltas) == "a "
    deltas += feed(processor, request, TOK.encode("x"))
    assert joined(deltas) == "a Ex"


@pytest.mark.parametrize("skip", [True, False])
def test_eos_stops_without_its_text(skip: bool) -> None:
    ids = TOK.encode("Héllo 😀")
    processor, request = start(skip_special_tokens=skip)
    deltas = feed(processor, request, ids + [EOS, 7])
    assert joined(deltas) == "Héllo 😀"
    assert (deltas[-1].finish_reason, deltas[-1].stop_reason) == ("stop", None)
    assert deltas[-1].token_ids == [EOS] and request.output_token_ids == ids + [EOS]


def test_ignore_eos_keeps_going() -> None:
    ids = TOK.encode("ok") + [EOS] + TOK.encode("go")
    processor, request = start(max_tokens=len(ids), ignore_eos=True, skip_special_tokens=False)
    deltas = feed(processor, request, ids)
    assert joined(deltas) == "ok<|eos|>go" and deltas[-1].finish_reason == "length"


@pytest.mark.parametrize("include", [False, True])
def test_stop_token_id(include: bool) -> None:
    ids = TOK.encode("one, two")
    processor, request = start(
        stop_token_ids=[STOP_ID], skip_special_tokens=False, include_stop_str_in_output=include
    )
    deltas = feed(processor, request, ids + [STOP_ID] + ids)
    assert joined(deltas) == "one, two" + (STOP if include else "")
    assert (deltas[-1].finish_reason, deltas[-1].stop_reason) == ("stop", STOP_ID)


def test_min_tokens_defers_eos_stop_ids_and_stop_strings() -> None:
    ids = [EOS, STOP_ID] + TOK.encode("a") + TOK.encode("b") + [EOS]
    processor, request = start(min_tokens=4, stop=["a", "ab"], stop_token_ids=[STOP_ID])
    deltas = feed(processor, request, ids)
    # eos, the stop id and "a" came before min_tokens: plain (skipped special) text, and "a"
    # was held as a prefix of "ab"; at token 4 = min_tokens the held "ab" is searched.
    assert len(ids) == 5 and deltas[-1].stop_reason == "a" and len(request.output_token_ids) == 4
    assert [d.finish_reason for d in deltas] == [None, None, None, "stop"]
    processor, request = start(min_tokens=3)
    deltas = feed(processor, request, [EOS, EOS, EOS, EOS])
    assert [d.finish_reason for d in deltas] == [None, None, "stop"]


def test_multi_token_step_drops_tokens_after_stop_and_slices_logprobs() -> None:
    ids = TOK.encode("x y")
    processor, request = start()
    request.output_token_ids.extend(ids + [EOS, 9, 9])
    logprobs = [Logprob(t, -1.0) for t in request.output_token_ids]
    delta = processor.process(request, logprobs)
    assert delta.token_ids == ids + [EOS] == request.output_token_ids
    assert delta.logprobs == logprobs[: len(ids) + 1] and delta.text == "x y"


def test_abort_releases_held_text() -> None:
    processor, request = start(stop=["END"])
    assert joined(feed(processor, request, TOK.encode("so E"))) == "so "
    final = processor.abort("r")
    assert final is not None and (final.text, final.finish_reason) == ("E", "abort")
    assert processor.abort("r") is None


def test_accumulator_matches_the_deltas() -> None:
    ids = TOK.encode(CORPUS[1])
    processor, request = start(max_tokens=len(ids))
    acc = CompletionAccumulator(index=0)
    for d in feed(processor, request, ids):
        acc.add(d)
    out = acc.output()
    assert (out.text, out.token_ids, out.finish_reason) == (TOK.decode(ids), ids, "length")


@pytest.mark.parametrize("seed", range(25))
def test_random_stops_on_real_text(seed: int) -> None:
    rng = random.Random(seed)
    text = rng.choice(CORPUS) + " " + rng.choice(CORPUS)
    ids = TOK.encode(text)
    a = rng.randrange(len(text) - 4)
    stop = text[a : a + rng.randint(1, 4)]
    include = rng.random() < 0.5
    processor, request = start(stop=[stop], include_stop_str_in_output=include)
    deltas = feed(processor, request, ids, chunk=rng.choice([1, 2]))
    cut = text.index(stop) + (len(stop) if include else 0)
    assert joined(deltas) == text[:cut] and deltas[-1].stop_reason == stop
    assert all("\ufffd" not in d.text for d in deltas)


def test_stop_string_helpers() -> None:
    assert find_stop_string("abcabc", ["ca", "bc", "x"]) == (1, "bc")
    assert find_stop_string("abc", ["bc", "b"]) == (1, "bc")  # tie: first listed
    assert find_stop_string("abc", ["x"]) is None
    assert partial_stop_length("hello EN", ["END", "ENDING"]) == 2
    assert partial_stop_length("hello END", ["END"]) == 0  # complete stops are found, not held
    assert partial_stop_length("xaba", ["abab"]) == 3
    assert partial_stop_length("", ["ab"]) == 0
