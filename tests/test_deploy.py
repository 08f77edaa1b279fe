"""deploy/: the Kubernetes manifests are checked field by field (no cluster or kubeconform here),
with every cross-reference they make: labels and selectors, the PVC, probe paths and flags the
server really has, and the HPA's metrics against a live server's /metrics. The Dockerfiles copy
what exists and start `radixgen serve` with valid flags; the CPU image is built where a Docker
engine runs (skipped, saying so, where none does). The wheel lists every package."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest
import tomllib
import yaml

from radixgen.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "deploy" / "k8s"
DOCKER = ROOT / "deploy" / "docker"

CONTAINER_KEYS = {
    "name", "image", "imagePullPolicy", "args", "command", "env", "ports", "readinessProbe",
    "livenessProbe", "startupProbe", "resources", "volumeMounts",
}  # fmt: skip
PROBE_KEYS = {
    "httpGet", "periodSeconds", "failureThreshold", "timeoutSeconds", "initialDelaySeconds",
    "successThreshold",
}  # fmt: skip


def manifests() -> dict[str, dict]:
    """kind/name -> object, over every document of deploy/k8s/*.yaml."""
    objects = {}
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            assert {"apiVersion", "kind", "metadata"} <= set(doc), path
            objects[f"{doc['kind']}/{doc['metadata']['name']}"] = doc
    return objects


def test_manifests_have_the_expected_objects_and_api_versions():
    objects = manifests()
    versions = {key: obj["apiVersion"] for key, obj in objects.items()}
    assert versions == {
        "Deployment/radixgen": "apps/v1",
        "Service/radixgen": "v1",
        "PersistentVolumeClaim/radixgen-models": "v1",
        "HorizontalPodAutoscaler/radixgen": "autoscaling/v2",
        "ConfigMap/radixgen-adapter-rules": "v1",
    }


def test_deployment_wires_labels_volumes_probes_and_ports():
    objects = manifests()
    deployment = objects["Deployment/radixgen"]["spec"]
    pod = deployment["template"]
    labels = pod["metadata"]["labels"]
    assert deployment["selector"]["matchLabels"].items() <= labels.items()
    assert objects["Service/radixgen"]["spec"]["selector"].items() <= labels.items()
    (container,) = pod["spec"]["containers"]
    assert set(container) <= CONTAINER_KEYS
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": 30000}
    (service_port,) = objects["Service/radixgen"]["spec"]["ports"]
    assert service_port["targetPort"] == "http"
    for name, path in (
        ("readinessProbe", "/health"),
        ("livenessProbe", "/health_generate"),
        ("startupProbe", "/health"),
    ):
        probe = container[name]
        assert set(probe) <= PROBE_KEYS
        assert probe["httpGet"] == {"path": path, "port": "http"}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts == {"models": "/models", "dshm": "/dev/shm"}
    assert volumes["dshm"]["emptyDir"]["medium"] == "Memory"
    claim = volumes["models"]["persistentVolumeClaim"]["claimName"]
    assert f"PersistentVolumeClaim/{claim}" in objects
    grace = pod["spec"]["terminationGracePeriodSeconds"]
    args = container["args"]
    assert grace > float(args[args.index("--shutdown-timeout") + 1])


def test_deployment_args_are_radixgen_serve_flags():
    (container,) = manifests()["Deployment/radixgen"]["spec"]["template"]["spec"]["containers"]
    build_parser().parse_args(["serve", *container["args"]])  # exits on an unknown flag


def test_probe_paths_exist_on_the_server():
    from radixgen.server import native_api

    paths = {route.path for route in native_api.router.routes}
    assert "/health_generate" in paths
    app_source = (ROOT / "radixgen" / "server" / "app.py").read_text()
    assert '@app.get("/health")' in app_source


def test_hpa_scales_the_deployment_on_metrics_the_server_exports(tiny_server_url):
    objects = manifests()
    hpa = objects["HorizontalPodAutoscaler/radixgen"]["spec"]
    assert hpa["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "radixgen",
    }
    assert 1 <= hpa["minReplicas"] <= hpa["maxReplicas"]
    wanted = {m["pods"]["metric"]["name"] for m in hpa["metrics"] if m["type"] == "Pods"}
    assert wanted == {"radixgen_num_requests_running", "radixgen_num_requests_waiting"}
    rules = yaml.safe_load(objects["ConfigMap/radixgen-adapter-rules"]["data"]["config.yaml"])
    (rule,) = rules["rules"]
    exported = re.search(r"\((.*?)\)", rule["seriesQuery"]).group(1).split("|")
    renamed = {"radixgen_" + name for name in exported}
    assert wanted <= renamed
    metrics = httpx.get(f"{tiny_server_url}/metrics", timeout=10).text
    for name in exported:  # the KV usage and hit rate too, which dashboards and rules use
        assert re.search(rf"^radixgen:{name} ", metrics, re.M), name


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", path.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.cuda"])
def test_dockerfiles_copy_what_exists_and_serve_with_valid_flags(name: str):
    path = DOCKER / name
    instructions = dockerfile_instructions(path)
    copies = [rest.split()[:-1] for word, rest in instructions if word == "COPY"]
    for sources in copies:
        for source in sources:
            assert (ROOT / source).exists(), source
    ignore = (DOCKER / f"{name}.dockerignore").read_text()
    for sources in copies:
        for source in sources:
            assert f"!{source}" in ignore, f"{name}.dockerignore drops {source}"
    (entry,) = [rest for word, rest in instructions if word == "ENTRYPOINT"]
    argv = yaml.safe_load(entry)  # the JSON form
    assert argv[:2] == ["radixgen", "serve"]
    build_parser().parse_args(argv[1:])
    assert any(word == "HEALTHCHECK" and "/health" in rest for word, rest in instructions)


def test_the_wheel_lists_every_package():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    roots = {v: k for k, v in config["package-dir"].items()}  # folder -> package
    found = set()
    for folder, package in roots.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join([package, *rel.parts]))
    assert found <= listed, sorted(found - listed)


def _docker_engine() -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0


def test_cpu_image_builds():
    if not _docker_engine():
        pytest.skip("no Docker engine here (`docker info` fails): the CPU image was not built")
    command = f"docker build -f {DOCKER / 'Dockerfile'} -t radixgen:test-cpu {ROOT}"
    result = subprocess.run(shlex.split(command), capture_output=True, text=True, timeout=3600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
