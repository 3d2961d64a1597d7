"""The container and cluster files: what they reference exists and agrees with the server.

Docker cannot build here, so the Dockerfile is read: every path it copies exists, and its
entry point is the package's console script. promtool checks the Prometheus files.
"""

from __future__ import annotations

import importlib
import json
import shlex
import tomllib
from pathlib import Path
from typing import Any

import yaml

from tessel.server.cli import build_parser
from tests.promtool import needs_promtool, promtool

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


def dockerfile() -> list[tuple[str, str]]:
    """(instruction, arguments) of the Dockerfile, continuation lines joined."""
    lines, current = [], ""
    for raw in (ROOT / "Dockerfile").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        current += line.removesuffix("\\").strip() + " "
        if not line.endswith("\\"):
            instruction, _, args = current.strip().partition(" ")
            lines.append((instruction.upper(), args.strip()))
            current = ""
    return lines


def instructions(name: str) -> list[str]:
    return [args for instruction, args in dockerfile() if instruction == name]


def test_dockerfile_copies_only_paths_that_exist() -> None:
    copies = instructions("COPY")
    assert copies
    for args in copies:
        *sources, _ = shlex.split(args)
        for source in sources:
            assert (ROOT / source).exists(), f"COPY {source}: no such path"
    copied = {shlex.split(args)[0] for args in copies}
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    for package in packages["packages"]["find"]["include"]:
        assert package.rstrip("*") in copied, f"package {package} is not copied"


def test_dockerfile_entry_point_is_the_console_script() -> None:
    (entry,) = instructions("ENTRYPOINT")
    command = json.loads(entry)
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert command[0] in scripts
    module, _, function = scripts[command[0]].partition(":")
    assert callable(getattr(importlib.import_module(module), function))
    assert build_parser().parse_args(command[1:]).command == "serve"


def test_dockerfile_runs_as_a_user_with_port_volume_and_healthcheck() -> None:
    (base,) = instructions("FROM")
    assert "cuda" in base and "pytorch" in base
    users = instructions("USER")
    assert users and users[-1] not in ("root", "0")
    assert instructions("EXPOSE") == ["8000"]
    assert any("/models" in v for v in instructions("VOLUME"))
    (check,) = instructions("HEALTHCHECK")
    assert "/health" in check and "8000" in check
    assert any("TESSEL_HOST=0.0.0.0" in env for env in instructions("ENV"))


def load_all(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def flag_value(args: list[str], flag: str) -> str:
    return next(a.split("=", 1)[1] for a in args if a.startswith(f"--{flag}="))


def test_k8s_deployment_probes_gpu_and_drain() -> None:
    (deployment,) = load_all(DEPLOY / "k8s" / "deployment.yaml")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    drain = float(flag_value(container["args"], "drain-timeout-s"))
    assert pod["terminationGracePeriodSeconds"] > float(pre_stop[1]) + drain
    settings = build_parser().parse_args(["serve", *container["args"]])
    assert settings.drain_timeout_s == drain  # the flags parse as the server's own
    labels = deployment["spec"]["selector"]["matchLabels"]
    (service,) = load_all(DEPLOY / "k8s" / "service.yaml")
    assert service["spec"]["selector"] == labels
    assert service["spec"]["ports"][0]["targetPort"] == container["ports"][0]["name"]


def test_triton_cache_of_the_image_is_a_volume_of_the_pod() -> None:
    env = dict(
        pair.split("=", 1) for args in instructions("ENV") for pair in shlex.split(args)
    )
    cache = env["TRITON_CACHE_DIR"]
    assert any("$TRITON_CACHE_DIR" in args for args in instructions("RUN"))  # made before USER
    (deployment,) = load_all(DEPLOY / "k8s" / "deployment.yaml")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == cache]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert "emptyDir" in volume and not mount.get("readOnly")


def test_hpa_scales_the_deployment_on_waiting_requests() -> None:
    (hpa,) = load_all(DEPLOY / "k8s" / "hpa.yaml")
    assert hpa["spec"]["scaleTargetRef"]["name"] == "tessel"
    (metric,) = hpa["spec"]["metrics"]
    assert metric["pods"]["metric"]["name"] == "tessel_num_requests_waiting"


def test_compose_runs_server_prometheus_and_grafana() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    assert set(compose["services"]) == {"tessel", "prometheus", "grafana"}
    for service in compose["services"].values():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (DEPLOY / source).exists(), source
    scrape = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    targets = scrape["scrape_configs"][0]["static_configs"][0]["targets"]
    assert targets == ["tessel:8000"]


@needs_promtool
def test_promtool_accepts_config_and_rules() -> None:
    config = promtool("check", "config", str(DEPLOY / "prometheus" / "prometheus.yml"))
    assert config.returncode == 0 and "SUCCESS" in config.stdout, config.stdout
    rules = promtool("check", "rules", str(DEPLOY / "prometheus" / "alerts.yml"))
    assert rules.returncode == 0 and "SUCCESS: 5 rules found" in rules.stdout, rules.stdout
    names = {
        rule["alert"]
        for group in yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())["groups"]
        for rule in group["rules"]
    }
    assert {
        "TesselTimeToFirstTokenP99High",
        "TesselErrorRateHigh",
        "TesselQueueGrowing",
        "TesselKVCacheNearlyFull",
    } <= names
