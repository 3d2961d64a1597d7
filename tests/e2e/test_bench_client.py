"""The serving benchmark's client (``benchmarks/serve.py``) against a real ``tessel serve``: its
streamed texts equal the offline engine's, and its counts and timings are those of the streams."""

from __future__ import annotations

import asyncio

from benchmarks import serve
from tessel.engine import LLM, SamplingParams
from tests.e2e.conftest import API_KEY, ServerProcess


def test_load_run_sees_every_token_of_every_stream(server: ServerProcess, llm: LLM) -> None:
    args = serve.parse_args(["--base-url", server.base_url, "--api-key", API_KEY, "--num-prompts", "6",
                             "--text-prompts", "--input-len", "12", "--output-len", "9", "--range-ratio", "0.5"])
    args.model = serve.served_model(server.base_url, API_KEY)
    prompts = serve.make_prompts(6, 12, 0.5, args.seed, as_text=True)
    results, duration, _ = asyncio.run(serve.run_load(args, prompts))
    want = [o.outputs[0].text for o in llm.generate(prompts, SamplingParams(max_tokens=9, temperature=0, ignore_eos=True))]
    assert all(r.ok for r in results), [r.error for r in results]
    assert [r.text for r in results] == want
    for r in results:
        assert r.output_tokens == 9 and 1 <= len(r.itl) <= 8  # a chunk may hold back half a character
        assert 0 < r.ttft <= r.latency <= duration
    summary = serve.summarize(results, duration, {})
    assert summary["completed"] == 6 and summary["output_throughput"] == 54 / duration


def test_load_run_reports_http_errors(server: ServerProcess) -> None:
    args = serve.parse_args(["--base-url", server.base_url, "--api-key", "wrong", "--num-prompts", "2"])
    args.model = "SmolLM2-135M-Instruct"
    results, _, _ = asyncio.run(serve.run_load(args, serve.make_prompts(2, 4, 0.0, 0, as_text=False)))
    assert [r.ok for r in results] == [False, False]
    assert all(r.error.startswith("HTTP 401") for r in results)
