"""schemathesis against the server's own OpenAPI schema, every operation: no 5xx, no hang,
every error in OpenAI's shape; afterwards no request or KV block is left and it still serves.

A dedicated server with tight limits (max_tokens 8, n 2, 4 prompts) keeps the generated
requests cheap, so the run stays bounded (a fixed number of examples per operation).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable

from tests.e2e.conftest import API_KEY, ServerProcess, start_server, stop_server
from tests.e2e.test_lifecycle import gauges

HEADERS = {"Authorization": f"Bearer {API_KEY}"}
EXAMPLES_PER_OPERATION = 30
ERROR_KEYS = {"message", "type", "param", "code"}
IDLE_BLOCKS: list[float] = []


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    limits = ["--max-tokens-limit", "8", "--max-n", "2", "--max-prompts", "4"]
    srv = start_server(tmp_path_factory.mktemp("fuzz"), *limits, "--request-timeout-s", "30")
    IDLE_BLOCKS.append(gauges(srv)["tessel_kv_cache_blocks_used"])
    yield srv
    stop_server(srv)


@pytest.fixture(scope="module")
def fuzz_schema(fuzz_server: ServerProcess) -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_url(f"{fuzz_server.base_url}/openapi.json")


def check_response(case: schemathesis.Case) -> str | None:
    """What is wrong with the server's answer to ``case``, or None."""
    response = case.call(headers=HEADERS, timeout=60)
    if response.status_code >= 500:
        return f"{response.status_code}: {response.text[:300]}"
    if response.status_code >= 400:
        error = response.json().get("error")
        if not isinstance(error, dict) or set(error) != ERROR_KEYS or not error["message"]:
            return f"{response.status_code} not in OpenAI's error shape: {response.text[:300]}"
    return None


# schemathesis's own pytest plugin does not load under this pytest; hypothesis drives it here.
@pytest.mark.parametrize("mode", list(schemathesis.GenerationMode), ids=lambda m: m.value)
def test_no_server_error_and_errors_in_openai_shape(
    fuzz_schema: schemathesis.BaseSchema, mode: schemathesis.GenerationMode
) -> None:
    failures: list[str] = []
    fuzzed: list[str] = []
    operations = [result.ok() for result in fuzz_schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/v1/completions", "/v1/chat/completions"}
    for operation in operations:

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(
            max_examples=EXAMPLES_PER_OPERATION,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=True,  # the same cases every run: a failure reproduces
            database=None,
        )
        def fuzz(case: schemathesis.Case) -> None:
            problem = check_response(case)
            if problem is not None:
                failures.append(f"{case.as_curl_command()}\n  -> {problem}")

        try:
            fuzz()
        except Unsatisfiable:  # negative mode: a GET without parameters has nothing to break
            assert mode == schemathesis.GenerationMode.NEGATIVE and operation.method == "get"
            continue
        fuzzed.append(operation.path)
    assert {"/v1/completions", "/v1/chat/completions", "/tokenize"} <= set(fuzzed)
    assert not failures, "\n".join(failures[:10])


def test_after_the_fuzz_nothing_is_left_and_it_serves(fuzz_server: ServerProcess) -> None:
    """Runs after the fuzz cases (module order)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        g = gauges(fuzz_server)
        if g["tessel_num_requests_running"] == 0 and g["tessel_num_requests_waiting"] == 0:
            break
        time.sleep(0.2)
    g = gauges(fuzz_server)
    assert g["tessel_num_requests_running"] == 0 and g["tessel_num_requests_waiting"] == 0
    assert g["tessel_kv_cache_blocks_used"] == IDLE_BLOCKS[0]
    assert g["tessel_api_requests_in_flight"] == 0 and g["tessel_api_requests_queued"] == 0
    r = httpx.post(
        f"{fuzz_server.base_url}/v1/completions",
        json={"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0},
        headers=HEADERS,
        timeout=60,
    )
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
    assert "Traceback" not in fuzz_server.log(), fuzz_server.log()[-3000:]
