"""The server's settings: its own fields plus every engine field, flattened.

One source of truth: the engine fields (``--max-model-len``, ``--block-size``, ...) are
copied from ``config.settings`` with their types, defaults, bounds and docstrings, so
the CLI flags, the ``TESSEL_`` environment variables and the engine's config all agree.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, create_model, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from tessel.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig

# Engine section name in EngineConfig -> its config class; None: a field of EngineConfig itself.
ENGINE_SECTIONS: dict[str | None, type[BaseModel]] = {
    "model": ModelConfig,
    "cache": CacheConfig,
    "scheduler": SchedulerConfig,
    None: EngineConfig,
}


class ServerFields(BaseSettings):
    """Fields that belong to the HTTP server alone."""

    model_config = SettingsConfigDict(
        env_prefix="TESSEL_", use_attribute_docstrings=True, frozen=True, extra="forbid"
    )

    host: str = "127.0.0.1"
    """Address to listen on."""
    port: int = Field(default=8000, ge=0, le=65535)
    """TCP port to listen on (0: any free port)."""
    api_key: Annotated[list[str], NoDecode] = []
    """API keys accepted as ``Authorization: Bearer KEY``; none: no auth. Repeat the flag,
    or give a comma-separated list in the environment."""
    served_model_name: str | None = None
    """Model name clients send and see; default: the model's own name."""
    api_key_file: str | None = None
    """A file of further API keys, one per line (blank lines and ``#`` comments skipped)."""
    metrics_require_key: bool = False
    """Ask for an API key on /metrics too (/health and /ready stay open for probes)."""
    max_queue: int = Field(default=1024, ge=0)
    """Most requests waiting for their first token; past it, requests get 429 with Retry-After."""
    max_queue_tokens: int = Field(default=1_000_000, ge=0)
    """Most prompt tokens waiting for their first token (estimated from the body's size before
    tokenizing, then exact); past it, requests get 429 with Retry-After."""
    request_timeout_s: float | None = Field(default=None, gt=0)
    """Longest a generation request may take; a request's own ``timeout`` field may lower it.
    Past it the request is aborted and the client gets a 408 (or a stream error event)."""
    max_request_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    """Largest request body accepted; larger ones get 413."""
    max_prompts: int = Field(default=64, ge=1)
    """Most prompts in one /v1/completions request."""
    max_n: int = Field(default=128, ge=1)
    """Most choices (``n``) per prompt."""
    max_tokens_limit: int | None = Field(default=None, ge=1)
    """Most tokens one request may ask to generate; ``null`` max_tokens means this many.
    None: up to the context length."""
    max_stop_strings: int = Field(default=16, ge=0)
    """Most ``stop`` strings in one request."""
    max_stop_string_chars: int = Field(default=256, ge=1)
    """Longest ``stop`` string, in characters."""
    cors_allow_origins: Annotated[list[str], NoDecode] = []
    """Origins allowed by CORS (``*`` for any); none: CORS stays off. Comma-separated in
    the environment."""
    log_prompts: bool = False
    """Log each request's prompts and outputs (off: only counts and timings are logged)."""
    watchdog_timeout_s: float = Field(default=60.0, gt=0)
    """Work pending this long with no engine step finishing turns /ready 503 (and is logged)."""
    drain_timeout_s: float = Field(default=30.0, ge=0)
    """On SIGTERM, how long requests in flight may run before the process exits anyway."""
    log_level: Literal["critical", "error", "warning", "info", "debug"] = "info"
    """Python logging level for the server and uvicorn."""
    engine_process: Literal["auto", "on", "off"] = "auto"
    """Run the engine core in a process of its own, so the HTTP event loop and the engine's
    Python do not share one GIL. auto: on a GPU at tensor-parallel size 1."""

    @field_validator("api_key", "cors_allow_origins", mode="before")
    @classmethod
    def _split_keys(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [key.strip() for key in value.split(",") if key.strip()]
        return value


def attribute_docstrings(cls: type) -> dict[str, str]:
    """The docstring written under each annotated attribute of ``cls`` (PEP 257 style)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs: dict[str, str] = {}
    for stmt, nxt in zip(body, body[1:], strict=False):
        is_doc = isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and is_doc:
            docs[stmt.target.id] = inspect.cleandoc(str(nxt.value.value))  # type: ignore[attr-defined]
    return docs


def _engine_fields() -> dict[str, tuple[Any, FieldInfo]]:
    """Every scalar engine field, keyed by its flat name, with a description for --help."""
    fields: dict[str, tuple[Any, FieldInfo]] = {}
    for cls in ENGINE_SECTIONS.values():
        docs = attribute_docstrings(cls)
        for name, info in cls.model_fields.items():
            if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel):
                continue  # a nested section, flattened through its own class
            if name in fields or name in ServerFields.model_fields:
                raise RuntimeError(f"engine field {name!r} appears twice once flattened")
            copy = FieldInfo.merge_field_infos(info, description=info.description or docs.get(name))
            fields[name] = (info.annotation, copy)
    return fields


_ServerSettingsBase: type[ServerFields] = create_model(  # type: ignore[call-overload]
    "_ServerSettingsBase", __base__=ServerFields, **_engine_fields()
)


class ServerSettings(_ServerSettingsBase):  # type: ignore[misc, valid-type]
    """Everything ``tessel serve`` is configured by: flags, ``TESSEL_*`` variables, defaults."""

    def engine_config(self) -> EngineConfig:
        """The frozen engine config these settings describe."""
        values = self.model_dump()
        sections: dict[str, Any] = {}
        for section, cls in ENGINE_SECTIONS.items():
            if section is None:
                continue
            sections[section] = cls(**{k: values[k] for k in cls.model_fields})
        top = {
            k: values[k]
            for k in EngineConfig.model_fields
            if k not in ENGINE_SECTIONS and k in values
        }
        return EngineConfig(**sections, **top)


def field_help(name: str) -> str:
    """The help text of one ServerSettings field (its docstring)."""
    info = ServerSettings.model_fields[name]
    return " ".join((info.description or "").split())
