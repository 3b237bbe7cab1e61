"""The deployment recipes in config/deploy, checked against the code they deploy.

There is no Docker engine or cluster here, so each manifest is parsed and every
part that names something in toolpair is checked against the real thing: the
command lines go through toolpair's own argument parser, environment names
must be settings, probe paths must be the routes toolpair answers, ports must
agree from the container to the Service and the Ingress, and image tags follow
the package version.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

import proxy
from proxy.cli import build_parser
from proxy.config import ENV_PREFIX, Settings, load_settings
from proxy.ops.paths import HEALTH_PATH, PROBE_PATHS, READY_PATH
from tests.support.proxies import proxy_app

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "config" / "deploy"
COMPOSE = DEPLOY / "docker-compose.yml"
KUBERNETES = DEPLOY / "kubernetes"
ENGINE_MANIFESTS = ["llama-server.yaml", "vllm.yaml"]
FIELDS = {f.name for f in dataclasses.fields(Settings)}


def _subcommands() -> set[str]:
    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            return set(action.choices)
    return set()


HAS_SERVE = "serve" in _subcommands()
needs_serve = pytest.mark.xfail(
    not HAS_SERVE, reason="`toolpair serve`, /health and /ready arrive with issue 3", strict=True
)


def toolpair_settings(argv: list[str], env: dict[str, str]) -> tuple[argparse.Namespace, Settings]:
    """Parse ``argv`` as toolpair would, then resolve settings with ``env`` as the environment."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:
        raise AssertionError(f"toolpair rejects the command line {argv}") from exc
    cli = {k: v for k, v in vars(args).items() if k in FIELDS}
    for name in env:
        assert name.startswith(ENV_PREFIX) and name.removeprefix(ENV_PREFIX).lower() in FIELDS, name
    # Values taken from elsewhere at deploy time (secrets, ${VAR}) are only checked by name.
    settable = {k: v for k, v in env.items() if "$" not in v}
    return args, load_settings(cli, settable)


def check_image(image: str, backend: str) -> None:
    assert image == f"toolpair:{proxy.__version__}-{backend}", f"image {image} does not follow the package version"


# -- docker compose


def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return loaded


@pytest.mark.parametrize(("service", "backend"), [("toolpair-cpu", "cpu"), ("toolpair-cuda", "cuda")])
def test_compose_service_images_ports_and_health(service: str, backend: str) -> None:
    spec = compose()["services"][service]
    assert spec["build"]["args"]["BACKEND"] == backend
    assert (COMPOSE.parent / spec["build"]["context"]).resolve() == ROOT
    check_image(spec["image"], backend)
    assert spec["profiles"] == [backend]
    assert spec["entrypoint"] == ["toolpair"]
    command = spec["command"]
    port = int(command[command.index("--port") + 1])
    assert port == Settings().port
    assert command[command.index("--host") + 1] == "0.0.0.0"
    (published,) = spec["ports"]
    host_ip, _, container_port = published.split(":")
    assert host_ip == "127.0.0.1" and int(container_port) == port  # loopback on the host unless opened on purpose
    probe = " ".join(spec["healthcheck"]["test"])
    url = urlsplit(re.search(r"http://[^'\"]+", probe).group(0))  # type: ignore[union-attr]
    assert url.port == port and url.path == READY_PATH
    for name in spec["environment"]:
        assert name.removeprefix(ENV_PREFIX).lower() in FIELDS
    assert any(volume.endswith(":/models:ro") for volume in spec["volumes"])
    gpus = spec.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
    if backend == "cuda":
        assert gpus == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]
    else:
        assert gpus == []


@needs_serve
@pytest.mark.parametrize("service", ["toolpair-cpu", "toolpair-cuda"])
def test_compose_command_is_accepted_by_toolpair(service: str) -> None:
    spec = compose()["services"][service]
    args, settings = toolpair_settings(spec["command"], spec["environment"])
    assert args.command == "serve"
    assert settings.port == Settings().port and settings.host == "0.0.0.0" and settings.log_format == "json"


def test_compose_dockerfile_takes_the_backend() -> None:
    dockerfile = ROOT / compose()["services"]["toolpair-cpu"]["build"]["dockerfile"]
    if not dockerfile.exists():
        pytest.skip("the Dockerfile arrives with issue 3")
    text = dockerfile.read_text()
    assert re.search(r"^ARG BACKEND\b", text, re.MULTILINE)
    assert re.search(rf"^EXPOSE {Settings().port}\b", text, re.MULTILINE)


# -- docker compose, profile "replicas": nginx, two toolpair replicas, Redis

REPLICAS = ("toolpair-1", "toolpair-2")
NGINX_CONF = DEPLOY / "nginx.conf"


def test_compose_replicas_share_one_redis_store() -> None:
    services = compose()["services"]
    redis_service = services["redis"]
    assert redis_service["profiles"] == ["replicas"] and redis_service["image"].startswith("redis:")
    assert "noeviction" in redis_service["command"]  # toolpair evicts by its own limits; Redis must not
    stores = set()
    for name in REPLICAS:
        spec = services[name]
        assert spec["profiles"] == ["replicas"] and spec["ports"] == []  # reached through nginx only
        check_image(spec["image"], "cpu")
        args, settings = toolpair_settings(spec["command"], spec["environment"])
        assert args.command == "serve" and settings.host == "0.0.0.0" and settings.port == Settings().port
        url = urlsplit(settings.responses_store)
        assert url.scheme == "redis" and url.hostname == "redis" and url.port == 6379
        assert spec["depends_on"]["redis"]["condition"] == "service_healthy"
        stores.add(settings.responses_store)
    assert len(stores) == 1


def test_compose_nginx_balances_the_replicas_with_the_deploy_config() -> None:
    services = compose()["services"]
    nginx = services["nginx"]
    assert nginx["profiles"] == ["replicas"] and set(nginx["depends_on"]) == set(REPLICAS)
    (mount,) = nginx["volumes"]
    source, target, mode = mount.split(":")
    assert (COMPOSE.parent / source).resolve() == NGINX_CONF and target == "/etc/nginx/nginx.conf" and mode == "ro"
    (published,) = nginx["ports"]
    host_ip, host_port, container_port = published.split(":")
    assert host_ip == "127.0.0.1" and int(host_port) == Settings().port
    text = NGINX_CONF.read_text()
    assert re.search(rf"^\s*listen {container_port};", text, re.MULTILINE)
    upstream = re.search(r"upstream toolpair \{(.*?)\}", text, re.DOTALL).group(1)  # type: ignore[union-attr]
    servers = re.findall(r"^\s*server ([\w-]+):(\d+)", upstream, re.MULTILINE)
    ports = {name: services[name]["command"][services[name]["command"].index("--port") + 1] for name in REPLICAS}
    assert servers == [(name, ports[name]) for name in REPLICAS]
    assert re.search(r"^\s*hash \$conversation consistent;", upstream, re.MULTILINE)


def test_nginx_conf_keys_conversations_and_stays_within_toolpair_limits() -> None:
    text = NGINX_CONF.read_text()
    key = re.search(r'map "([^"]+)" \$conversation \{(.*?)\}', text, re.DOTALL)
    assert key is not None
    # Claude Code's session header, Codex's (both spellings read as $http_session_id), and toolpair's own.
    headers = key.group(1).split("|")
    assert headers[0] == "$http_x_toolpair_conversation"
    assert {"$http_x_claude_code_session_id", "$http_session_id", "$http_conversation_id"} <= set(headers)
    assert re.search(r"default \$remote_addr;", key.group(2))
    assert re.search(r"^\s*underscores_in_headers on;", text, re.MULTILINE)  # Codex's session_id
    body = re.search(r"client_max_body_size (\d+)m;", text).group(1)  # type: ignore[union-attr]
    assert int(body) * 1024 * 1024 >= Settings().max_body_bytes
    read = re.search(r"proxy_read_timeout (\d+)s;", text).group(1)  # type: ignore[union-attr]
    assert int(read) >= (Settings().upstream_read_timeout or 0)
    for directive in ("proxy_buffering off;", "proxy_request_buffering off;", "proxy_http_version 1.1;"):
        assert directive in text
    assert "non_idempotent" not in text  # a POST a replica may have started is never sent again


# -- Kubernetes


def documents(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((KUBERNETES / name).read_text()) if d]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [d for d in docs if d["kind"] == kind]
    return found


def container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [c for c in pod["containers"] if c["name"] == name]
    return found


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


@pytest.mark.parametrize("manifest", ENGINE_MANIFESTS)
def test_sidecar_command_env_and_key_file(manifest: str) -> None:
    pod = one(documents(manifest), "Deployment")["spec"]["template"]["spec"]
    toolpair = container(pod, "toolpair")
    check_image(toolpair["image"], "cpu")
    env = {e["name"]: e.get("value", "$from-elsewhere") for e in toolpair.get("env", [])}
    args, settings = toolpair_settings(toolpair["command"][1:] + toolpair["args"], env)
    assert toolpair["command"] == ["toolpair"] and args.command == "proxy"
    assert settings.host == "0.0.0.0" and settings.log_format == "json"
    # the key file lives on a mounted Secret
    assert settings.api_keys_file is not None
    mounts = {m["mountPath"]: m["name"] for m in toolpair["volumeMounts"]}
    key_dir = str(Path(settings.api_keys_file).parent)
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "secret" in volumes[mounts[key_dir]]
    # the upstream is the engine container, on loopback inside the pod
    engine = container(pod, "engine")
    upstream = urlsplit(settings.upstream or "")
    assert upstream.hostname == "127.0.0.1"
    assert flag(engine["args"], "--host") == "127.0.0.1"
    assert int(flag(engine["args"], "--port")) == upstream.port


@pytest.mark.parametrize("manifest", ENGINE_MANIFESTS)
def test_sidecar_ports_and_probes_agree_with_the_code(manifest: str) -> None:
    docs = documents(manifest)
    deployment = one(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    toolpair = container(pod, "toolpair")
    _, settings = toolpair_settings(toolpair["command"][1:] + toolpair["args"], {})
    (port,) = toolpair["ports"]
    assert port == {"name": "http", "containerPort": settings.port} and settings.port == Settings().port
    assert toolpair["livenessProbe"]["httpGet"] == {"path": HEALTH_PATH, "port": "http"}
    assert toolpair["readinessProbe"]["httpGet"] == {"path": READY_PATH, "port": "http"}
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(settings.port) and annotations["prometheus.io/path"] == "/metrics"
    # the Service selects this pod and targets toolpair's port, never the engine's
    service = one(docs, "Service")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert service["spec"]["selector"].items() <= labels.items()
    (service_port,) = service["spec"]["ports"]
    assert service_port["targetPort"] == "http" and service_port["name"] == "http"
    assert all(not c.get("ports") for c in pod["containers"] if c["name"] != "toolpair")


def test_ingress_hashes_sessions_onto_the_service_within_toolpair_limits() -> None:
    ingress = one(documents("ingress.yaml"), "Ingress")
    service = one(documents("llama-server.yaml"), "Service")
    annotations = ingress["metadata"]["annotations"]
    assert re.fullmatch(r"\$http_[a-z0-9_]+", annotations["nginx.ingress.kubernetes.io/upstream-hash-by"])
    assert int(annotations["nginx.ingress.kubernetes.io/proxy-read-timeout"]) >= (Settings().upstream_read_timeout or 0)
    size = annotations["nginx.ingress.kubernetes.io/proxy-body-size"]
    assert size.endswith("m") and int(size[:-1]) * 1024 * 1024 >= Settings().max_body_bytes
    assert annotations["nginx.ingress.kubernetes.io/proxy-buffering"] == "off"  # streams are not held back
    (rule,) = ingress["spec"]["rules"]
    (path,) = rule["http"]["paths"]
    backend = path["backend"]["service"]
    assert backend["name"] == service["metadata"]["name"]
    assert backend["port"]["name"] == service["spec"]["ports"][0]["name"]


# -- the probe paths are toolpair's own routes, open without a key


@needs_serve
@pytest.mark.parametrize("path", sorted(PROBE_PATHS))
async def test_probe_paths_are_answered_by_toolpair_itself(path: str) -> None:
    app = proxy_app(Settings(upstream="http://127.0.0.1:9", api_keys=["k"]))
    match = await app.router.resolve(make_mocked_request("GET", path, app=app))
    assert isinstance(match, web.UrlMappingMatchInfo)
    assert match.route.name != "passthrough", f"{path} would be forwarded to the engine"
