"""Stop conditions and streamed deltas: each step's sampled tokens to ``CompletionOutput``s."""

from __future__ import annotations

from dataclasses import dataclass, field

from transformers import PreTrainedTokenizerBase

from tessel.engine.detokenizer import IncrementalDetokenizer
from tessel.engine.request import CompletionOutput, Logprob, Request
from tessel.engine.stop_strings import find_stop_string, partial_stop_length

_STOP = "stop"
_LENGTH = "length"
_ABORT = "abort"


@dataclass
class _StreamState:
    """What one request's stream remembers between steps."""

    index: int  # the choice index (n > 1 siblings differ)
    detokenizer: IncrementalDetokenizer
    held: str = ""  # decoded text not yet emitted: it could be the start of a stop string
    num_seen: int = 0  # output tokens already processed


class OutputProcessor:
    """Decides when each request finishes (EOS, stop ids, stop strings, length) and turns
    its new tokens into a delta. The scheduler appends sampled tokens to
    ``request.output_token_ids``; ``process`` reads the ones it has not seen. On a finish it
    sets ``request.stop_reason`` and returns a delta whose ``finish_reason`` maps to the
    status to pass on: ``RequestStatus(delta.finish_reason)``."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self._tokenizer = tokenizer
        self._states: dict[str, _StreamState] = {}

    def add_request(self, request: Request, index: int = 0) -> None:
        detokenizer = IncrementalDetokenizer(
            self._tokenizer, request.params.skip_special_tokens, request.prompt_token_ids
        )
        self._states[request.request_id] = _StreamState(index, detokenizer)

    def process(self, request: Request, logprobs: list[Logprob] | None = None) -> CompletionOutput:
        """The delta for the tokens appended since the last call (``logprobs`` aligned with
        them). Tokens after a stop are dropped from ``request.output_token_ids``."""
        state = self._states[request.request_id]
        params = request.params
        first = state.num_seen
        new_ids = request.output_token_ids[first:]
        finish_reason: str | None = None
        stop_reason: int | str | None = None
        for token in new_ids:
            state.num_seen += 1
            checking = state.num_seen >= params.min_tokens
            is_eos = token == request.eos_token_id and not params.ignore_eos
            stop_token = checking and (is_eos or token in params.stop_token_ids)
            if not stop_token or params.include_stop_str_in_output:
                state.held += state.detokenizer.step([token])
            if stop_token:
                finish_reason, stop_reason = _STOP, None if is_eos else token
            elif checking and params.stop and (found := self._cut_at_stop(state, request)):
                finish_reason, stop_reason = _STOP, found
            elif state.num_seen >= request.max_tokens:
                finish_reason = _LENGTH
            if finish_reason is not None:
                break
        kept = state.num_seen - first
        if finish_reason is not None:
            del request.output_token_ids[state.num_seen :]
            request.stop_reason = stop_reason
            text = self._release_all(state, flush=not isinstance(stop_reason, str))
            del self._states[request.request_id]
        else:
            text = self._release_safe(state, request)
        return CompletionOutput(
            index=state.index,
            text=text,
            token_ids=new_ids[:kept],
            finish_reason=finish_reason,
            stop_reason=stop_reason,
            logprobs=logprobs[:kept] if logprobs is not None else None,
        )

    def abort(self, request_id: str) -> CompletionOutput | None:
        """The final delta of a request ended from outside (client gone, error): held text and
        finish_reason "abort". None if the request is unknown or already finished."""
        state = self._states.pop(request_id, None)
        if state is None:
            return None
        text = self._release_all(state, flush=True)
        return CompletionOutput(index=state.index, text=text, token_ids=[], finish_reason=_ABORT)

    @staticmethod
    def _cut_at_stop(state: _StreamState, request: Request) -> str | None:
        """Truncate held text at the earliest stop string (keeping it if asked); return it."""
        match = find_stop_string(state.held, request.params.stop)
        if match is None:
            return None
        start, stop = match
        end = start + len(stop) if request.params.include_stop_str_in_output else start
        state.held = state.held[:end]
        return stop

    @staticmethod
    def _release_safe(state: _StreamState, request: Request) -> str:
        """Emit held text except a suffix that could still grow into a stop string."""
        if not request.params.stop:
            text, state.held = state.held, ""
            return text
        keep = partial_stop_length(state.held, request.params.stop)
        text, state.held = (
            state.held[: len(state.held) - keep],
            state.held[len(state.held) - keep :],
        )
        return text

    @staticmethod
    def _release_all(state: _StreamState, flush: bool) -> str:
        text = state.held + (state.detokenizer.flush() if flush else "")
        state.held = ""
        return text


@dataclass
class CompletionAccumulator:
    """Folds one choice's deltas into its final output (offline API, non-streamed responses)."""

    index: int = 0
    _text: list[str] = field(default_factory=list)
    _token_ids: list[int] = field(default_factory=list)
    _logprobs: list[Logprob] | None = None
    _finish_reason: str | None = None
    _stop_reason: int | str | None = None

    def add(self, delta: CompletionOutput) -> None:
        self._text.append(delta.text)
        self._token_ids.extend(delta.token_ids)
        if delta.logprobs is not None:
            self._logprobs = self._logprobs if self._logprobs is not None else []
            self._logprobs.extend(delta.logprobs)
        if delta.finish_reason is not None:
            self._finish_reason, self._stop_reason = delta.finish_reason, delta.stop_reason

    def output(self) -> CompletionOutput:
        return CompletionOutput(
            index=self.index,
            text="".join(self._text),
            token_ids=list(self._token_ids),
            finish_reason=self._finish_reason,
            stop_reason=self._stop_reason,
            logprobs=list(self._logprobs) if self._logprobs is not None else None,
        )
