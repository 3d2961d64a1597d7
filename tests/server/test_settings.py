"""ServerSettings and the CLI: one set of fields for flags, TESSEL_* variables and EngineConfig."""

from __future__ import annotations

import pytest

from tessel.config import CacheConfig, SchedulerConfig
from tessel.server.cli import build_parser, settings_from_args
from tessel.server.settings import ServerSettings, field_help


def parse(*argv: str) -> ServerSettings:
    return settings_from_args(build_parser().parse_args(["serve", *argv]))


def test_flags_reach_the_engine_config() -> None:
    settings = parse(
        "--max-model-len",
        "256",
        "--max-num-seqs",
        "3",
        "--block-size",
        "32",
        "--no-enable-prefix-caching",
        "--port",
        "9001",
        "--api-key",
        "a",
        "--api-key",
        "b",
    )
    config = settings.engine_config()
    assert config.model.max_model_len == 256
    assert config.scheduler.max_num_seqs == 3
    assert config.cache.block_size == 32
    assert config.cache.enable_prefix_caching is False
    assert (settings.port, settings.api_key) == (9001, ["a", "b"])


def test_environment_fills_unset_flags_and_flags_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TESSEL_MAX_NUM_SEQS", "7")
    monkeypatch.setenv("TESSEL_MAX_QUEUE", "5")
    monkeypatch.setenv("TESSEL_API_KEY", "k1, k2")
    settings = parse("--max-queue", "9")
    assert settings.engine_config().scheduler.max_num_seqs == 7
    assert settings.max_queue == 9
    assert settings.api_key == ["k1", "k2"]


def test_defaults_are_the_engine_defaults() -> None:
    config = ServerSettings().engine_config()
    assert config.cache == CacheConfig()
    assert config.scheduler == SchedulerConfig()


def test_help_is_the_field_docstring() -> None:
    assert field_help("block_size") == "Tokens per KV-cache block."
    assert "Tokens per KV-cache block." in " ".join(
        build_parser()._subparsers._group_actions[0].choices["serve"].format_help().split()  # type: ignore[union-attr]
    )


def test_invalid_values_name_the_field() -> None:
    with pytest.raises(ValueError, match="block_size"):
        parse("--block-size", "0")
    with pytest.raises(SystemExit):
        parse("--dtype", "int3")


def test_quantization_flags_reach_the_model_config() -> None:
    model = parse("--quantization", "int8", "--smoothquant-alpha", "0.5").engine_config().model
    assert (model.quantization, model.smoothquant_alpha) == ("int8", 0.5)
    model = parse("--quantization", "int8", "--quant-rotation", "residual_and_down").engine_config().model
    assert model.quant_rotation == "residual_and_down"
    model = parse("--quantization", "int8", "--quant-gptq", "--quantize-lm-head").engine_config().model
    assert model.quant_gptq and model.quantize_lm_head
    assert parse("--quantization", "fp8").engine_config().model.quantization == "fp8"
    assert ServerSettings().engine_config().model.quantization is None
    with pytest.raises(SystemExit):  # argparse: not one of the choices
        parse("--quantization", "int4")
    assert "W8A8" in field_help("quantization")
