"""The offline API: ``LLM(model).generate(prompts, params)``, as in vLLM."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import count

from tqdm import tqdm

from tessel.config.settings import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from tessel.engine.core import EngineCore
from tessel.engine.engine_setup import build_engine_parts
from tessel.engine.request import RequestOutput, merge_outputs
from tessel.engine.sampling_params import SamplingParams

Prompt = str | list[int]


class LLM:
    """Generates for a list of prompts in one continuous batch; returns outputs in prompt order.

    With ``tensor_parallel_size=N`` it spawns N-1 worker processes; ``shutdown()`` (or a ``with``
    block) stops them, and they also end when this process does."""

    def __init__(self, model: str | None = None, config: EngineConfig | None = None, **overrides: object) -> None:
        if config is None:
            config = engine_config_from_kwargs(model, **overrides)
        self.config = config
        self.core = EngineCore(build_engine_parts(config))
        self.tokenizer = self.core.tokenizer
        self._ids = count()

    def shutdown(self) -> None:
        """Stop the tensor-parallel workers (nothing to do at one rank); idempotent."""
        self.core.shutdown()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item,assignment]
        params_list = _per_prompt(params, len(prompts))
        ids = [str(next(self._ids)) for _ in prompts]
        for rid, prompt, p in zip(ids, prompts, params_list, strict=True):
            self.core.add_request(rid, prompt, p)  # type: ignore[arg-type]
        # Deltas are folded once at the end: folding each step's would cost every request
        # its per-delta work inside the step loop, where it delays the next step.
        deltas: dict[str, list[RequestOutput]] = {rid: [] for rid in ids}
        with tqdm(total=len(ids), disable=not use_tqdm, desc="generate") as bar:
            while self.core.has_unfinished():
                for out in self.core.step():
                    deltas.setdefault(out.request_id, []).append(out)  # ids of an earlier, broken call too
                    if out.finished:
                        bar.update(1)
        return [merge_outputs(deltas[rid]) for rid in ids]


def engine_config_from_kwargs(model: str | None, **kw: object) -> EngineConfig:
    """Flat vLLM-style keyword arguments (max_model_len=..., num_blocks=...) -> EngineConfig."""
    sections: dict[str, dict[str, object]] = {"model": {"model": model}, "cache": {}, "scheduler": {}}
    top: dict[str, object] = {}
    for key, value in kw.items():
        for name, cls in (("model", ModelConfig), ("cache", CacheConfig), ("scheduler", SchedulerConfig)):
            if key in cls.model_fields:
                sections[name][key] = value
                break
        else:
            if key not in EngineConfig.model_fields:
                raise TypeError(f"unknown engine option {key!r}")
            top[key] = value
    return EngineConfig(
        model=ModelConfig(**sections["model"]),  # type: ignore[arg-type]
        cache=CacheConfig(**sections["cache"]),  # type: ignore[arg-type]
        scheduler=SchedulerConfig(**sections["scheduler"]),  # type: ignore[arg-type]
        **top,  # type: ignore[arg-type]
    )


def _per_prompt(params: SamplingParams | Sequence[SamplingParams] | None, n: int) -> list[SamplingParams]:
    if params is None:
        return [SamplingParams() for _ in range(n)]
    if isinstance(params, SamplingParams):
        return [params] * n
    if len(params) != n:
        raise ValueError(f"got {len(params)} SamplingParams for {n} prompts")
    return list(params)
