"""``tessel serve`` and ``tessel generate``; every flag is a ``ServerSettings`` field."""

from __future__ import annotations

import argparse
import os
import sys
import types
import typing
from typing import Any

from tessel.server.request_log import configure_logging
from tessel.server.settings import ServerFields, ServerSettings, field_help

SERVER_ONLY = tuple(name for name in ServerFields.model_fields if name != "log_level")


def add_settings_flags(parser: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> None:
    """One ``--flag`` per settings field; unset flags stay out of the namespace, so the
    ``TESSEL_*`` environment and the defaults fill them."""
    for name, info in ServerSettings.model_fields.items():
        if name in skip:
            continue
        flag = "--" + name.replace("_", "-")
        kwargs: dict[str, Any] = {
            "dest": name,
            "default": argparse.SUPPRESS,
            "help": field_help(name),
        }
        annotation = _strip_optional(info.annotation)
        if annotation is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif typing.get_origin(annotation) is list:
            kwargs["action"] = "append"
            kwargs["metavar"] = name.upper()
        elif typing.get_origin(annotation) is typing.Literal:
            kwargs["choices"] = list(typing.get_args(annotation))
        elif annotation in (int, float):
            kwargs["type"] = annotation
        parser.add_argument(flag, **kwargs)


def _strip_optional(annotation: Any) -> Any:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return _strip_optional(args[0])
    if typing.get_origin(annotation) is typing.Annotated:
        return typing.get_args(annotation)[0]
    return annotation


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tessel", description="Tessel: an OpenAI-compatible LLM server."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="Serve the OpenAI API over HTTP.")
    serve.add_argument("model_path", nargs="?", default=None, help="Same as --model.")
    add_settings_flags(serve)
    generate = commands.add_parser("generate", help="Print one completion from the offline engine.")
    generate.add_argument("prompt", help="The prompt text.")
    generate.add_argument("--max-tokens", type=int, default=64, help="Tokens to generate.")
    generate.add_argument("--temperature", type=float, default=0.0, help="0 is greedy.")
    add_settings_flags(generate, skip=SERVER_ONLY)
    return parser


def settings_from_args(args: argparse.Namespace) -> ServerSettings:
    given = {k: v for k, v in vars(args).items() if k in ServerSettings.model_fields}
    if getattr(args, "model_path", None) is not None:
        given.setdefault("model", args.model_path)
    return ServerSettings(**given)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = settings_from_args(args)
    except ValueError as err:  # pydantic's ValidationError: name the flag and the problem
        print(f"tessel: invalid settings:\n{err}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level)
    if args.command == "serve":
        worker = _torchrun_worker_rank()
        if worker is not None:  # torchrun rank > 0: no HTTP, just follow rank 0's steps
            from tessel.engine.distributed.worker import run_torchrun_worker

            return run_torchrun_worker(settings.engine_config())
        from tessel.server.serve import serve

        return serve(settings)
    return _generate(settings, args.prompt, args.max_tokens, args.temperature)


def _torchrun_worker_rank() -> int | None:
    """This process's RANK when torchrun started it as a rank other than 0."""
    if "WORLD_SIZE" in os.environ and int(os.environ.get("RANK", "0")) > 0:
        return int(os.environ["RANK"])
    return None


def _generate(settings: ServerSettings, prompt: str, max_tokens: int, temperature: float) -> int:
    from tessel.engine import LLM, SamplingParams

    llm = LLM(config=settings.engine_config())
    params = SamplingParams(max_tokens=max_tokens, temperature=temperature)
    output = llm.generate([prompt], params)[0]
    print(output.outputs[0].text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
