"""deploy/kubernetes/: the LeaderWorkerSet, its ConfigMap, Secret and Service follow the
LeaderWorkerSet v1 and core/v1 schemas (tests/deploy/lws_schema.py), and agree with the supervisor
they run: the config loads with its loader, the probes hit its endpoints and outlast its own
limits, the grace period covers its stop, the memory limit covers its pre-flight's plan for this
group on the target node, and the image is built on the SGLang release it was checked against.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from supervisor.commands.run import run as run_command
from supervisor.commands.run_options import STOP_MARGIN_S, UNIT_STOP_TIMEOUT_ENV, merge_run_config
from supervisor.config import SupervisorConfig
from supervisor.config.sections import HostConfig, instance_name_problem
from supervisor.core.sglang_cli_data import NEWEST
from supervisor.core.units import parse_size
from supervisor.errors import ConfigError
from supervisor.preflight import run_preflight
from tests.deploy import manifests as m
from tests.deploy.lws_schema import data_keys_problems, validate

MANIFESTS = ("leaderworkerset.yaml", "configmap.yaml", "service.yaml", "secret.example.yaml")
DOCKERFILE = m.DEPLOY / "Dockerfile"


@dataclasses.dataclass(frozen=True)
class NodeFacts:
    mem_available: str  # MemAvailable before the pod starts
    gpus: int
    gpu_memory: str  # nvidia-smi memory.total


# The nodes the manifest's nodeSelector picks (GPU feature discovery's gpu.product label): a DGX
# H100 (2 TiB of RAM; what is left for pods after the OS and kubelet) with 8 H100 SXM 80GB.
TARGET_NODES = {
    "NVIDIA-H100-80GB-HBM3": NodeFacts(mem_available="1900GB", gpus=8, gpu_memory="81559MiB"),
}


@pytest.fixture
def lws() -> dict[str, Any]:
    return m.one("leaderworkerset.yaml", "LeaderWorkerSet")


@pytest.fixture
def configmap() -> dict[str, Any]:
    return m.one("configmap.yaml", "ConfigMap")


@pytest.fixture
def secret() -> dict[str, Any]:
    return m.one("secret.example.yaml", "Secret")


@pytest.fixture
def config(configmap: dict[str, Any], tmp_path: Path) -> SupervisorConfig:
    return m.load_configmap_config(configmap, tmp_path)


def _leader(lws: dict[str, Any]) -> dict[str, Any]:
    return dict(m.templates(lws))["leaderTemplate"]


@pytest.mark.parametrize("name", MANIFESTS)
def test_every_manifest_follows_its_schema(name):
    docs = m.documents(name)
    assert docs
    for doc in docs:
        assert validate(doc) == []
    assert data_keys_problems(docs) == []


def test_the_configmap_loads_with_the_supervisors_own_loader_in_lws_group_mode(config):
    assert config.group.mode == "lws"
    assert config.group.token == ""  # from the Secret, never from the ConfigMap
    assert instance_name_problem(config.run.name) is None
    assert config.http.address is not None


def test_the_group_is_recreated_as_a_whole_and_workers_start_with_the_leader(lws):
    lwt = lws["spec"]["leaderWorkerTemplate"]
    assert lwt.get("restartPolicy", "RecreateGroupOnPodRestart") == "RecreateGroupOnPodRestart"
    # LeaderReady would start the workers only once the leader is ready, which it never is
    # before every worker has reported its pre-flight.
    assert lws["spec"].get("startupPolicy", "LeaderCreated") == "LeaderCreated"
    assert lwt["size"] == 2
    for _role, pod in m.templates(lws):
        assert pod.get("restartPolicy", "Always") == "Always"


def test_leader_and_worker_run_the_same_supervised_container(lws):
    (_, leader), (_, worker) = m.templates(lws)
    for field in m.SHARED_CONTAINER_FIELDS:
        assert m.container(leader).get(field) == m.container(worker).get(field), field
    for field in m.SHARED_POD_FIELDS:
        assert leader.get(field) == worker.get(field), field


def test_the_entrypoint_is_the_supervisor_reading_the_mounted_configmap(lws, configmap):
    for _role, pod in m.templates(lws):
        assert m.config_mount_problems(pod, configmap) == []


def test_the_launch_arguments_leave_the_group_flags_to_the_supervisor(lws, config):
    assert m.group_flags_given(config, m.container(_leader(lws))) == m.NONE_GIVEN
    plan = m.launch_plan(config, m.container(_leader(lws)))
    assert plan.model_path == "moonshotai/Kimi-K2.5"
    assert plan.enable_hierarchical_cache
    assert plan.hicache_size_gb > 0


def test_the_container_command_parses_with_runs_own_options(lws, monkeypatch):
    for name in list(os.environ):
        if name.startswith("SGLANG_SUPERVISOR_"):
            monkeypatch.delenv(name)
    c = m.container(_leader(lws))
    argv = [*c["command"][2:], *c["args"]]
    ctx = run_command.make_context("run", argv)
    assert ctx.params["config_path"] == Path("/etc/sglang-supervisor/config.toml")
    assert ctx.params["server_args"] == tuple(c["args"])


def test_every_supervisor_variable_in_the_pod_is_one_the_supervisor_reads(lws):
    known = {p.envvar for p in run_command.params if isinstance(p.envvar, str)}
    known |= {UNIT_STOP_TIMEOUT_ENV, m.GROUP_TOKEN_ENV}
    for _role, pod in m.templates(lws):
        ours = {n for n in m.env_of(m.container(pod)) if n.startswith("SGLANG_SUPERVISOR_")}
        assert ours <= known, ours - known


def test_the_probes_hit_the_supervisors_endpoints_and_outlast_its_own_limits(lws, config):
    for _role, pod in m.templates(lws):
        assert m.probe_problems(config, m.container(pod)) == []
    startup = m.container(_leader(lws))["startupProbe"]
    assert m.budget_s(startup) >= 1800  # a 30-minute load


def test_the_grace_period_covers_the_stop_grace_and_the_supervisor_enforces_it(
    lws, config, monkeypatch
):
    pod = _leader(lws)
    assert m.stop_problems(config, pod) == []
    grace = pod["terminationGracePeriodSeconds"]
    monkeypatch.setenv(UNIT_STOP_TIMEOUT_ENV, str(grace))
    assert merge_run_config(config.run, {}) == config.run
    too_long = dataclasses.replace(config.run, stop_grace_s=grace - STOP_MARGIN_S + 1)
    with pytest.raises(ConfigError, match="stop_grace"):
        merge_run_config(too_long, {})


def test_tokens_pod_ip_and_the_node_local_state_directory_come_from_the_right_places(lws, secret):
    for _role, pod in m.templates(lws):
        assert m.env_problems(m.container(pod), secret) == []


def test_shm_state_model_cache_and_ipc_lock(lws):
    for _role, pod in m.templates(lws):
        assert m.volume_problems(pod) == []


def test_gpus_match_the_local_ranks_and_the_pod_is_guaranteed(lws, config):
    size = lws["spec"]["leaderWorkerTemplate"]["size"]
    for _role, pod in m.templates(lws):
        assert m.resource_problems(pod, m.launch_plan(config, m.container(pod)), size) == []


def _image_to_repo(image_path: str) -> Path:
    """The repository file the Dockerfile copies to `image_path`."""
    for line in DOCKERFILE.read_text().splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "COPY" and image_path.startswith(parts[2] + "/"):
            return m.ROOT / parts[1] / image_path[len(parts[2]) + 1 :]
    raise AssertionError(f"the Dockerfile copies nothing to {image_path}")


def node_plan(lws: dict[str, Any], config: SupervisorConfig, rank: int, tmp_path: Path) -> Any:
    """The supervisor's pre-flight of node `rank` of this group on the target node: the
    ConfigMap's config, the image's model config, the node's facts and the pod's memory limit
    as the cgroup headroom, the argv as group mode fills it (design: section 2)."""
    pod = _leader(lws)
    facts = TARGET_NODES[pod["nodeSelector"]["nvidia.com/gpu.product"]]
    host = HostConfig(
        mem_available_bytes=parse_size(facts.mem_available),
        cgroup_headroom_bytes=m.memory_limit_bytes(pod),
        gpus=facts.gpus,
        gpu_memory_bytes=parse_size(facts.gpu_memory),
        sglang_version=NEWEST,
    )
    model_config = _image_to_repo(config.server.model_config or "")
    server = dataclasses.replace(config.server, model_config=str(model_config))
    planned = dataclasses.replace(config, host=host, server=server)
    size = lws["spec"]["leaderWorkerTemplate"]["size"]
    leader = f"{lws['metadata']['name']}-0.{lws['metadata']['name']}"
    group = config.group
    filled = ["--nnodes", str(size), "--node-rank", str(rank)]
    filled += ["--dist-init-addr", f"{leader}:{group.dist_init_port}"]
    filled += ["--gated-launch-port", str(group.gate_port)]
    argv = [*m.container(pod)["args"], *filled]
    return run_preflight(planned, argv, env={}, state_dir=tmp_path / f"state-{rank}")


@pytest.mark.parametrize("rank", [0, 1])
def test_the_memory_limit_covers_the_preflights_plan_on_the_target_node(
    lws, config, tmp_path, rank
):
    pod = _leader(lws)
    report = node_plan(lws, config, rank, tmp_path)
    assert report.verdict == "fit", report.render_table()
    assert report.local_ranks == 8
    limit = m.memory_limit_bytes(pod)
    # /dev/shm is tmpfs charged to the same cgroup: the launch and a full /dev/shm both fit.
    assert report.host_required_bytes + m.shm_limit_bytes(pod) <= limit
    facts = TARGET_NODES[pod["nodeSelector"]["nvidia.com/gpu.product"]]
    assert limit <= parse_size(facts.mem_available)  # else the node's memory binds, not ours


def test_a_memory_limit_below_the_plan_is_refused_by_the_preflight(lws, config, tmp_path):
    pod = _leader(lws)
    pod["containers"][0]["resources"]["limits"]["memory"] = "1000Gi"
    report = node_plan(lws, config, 0, tmp_path)
    assert report.verdict == "no-fit"
    assert any(c.name == "host_memory" and c.status.value == "fail" for c in report.checks)


def test_the_image_is_the_contract_tested_sglang_release_with_the_supervisor_as_pid_1(config):
    text = DOCKERFILE.read_text()
    assert f"ARG SGLANG_VERSION={NEWEST}\n" in text
    assert "ARG SGLANG_IMAGE=lmsysorg/sglang:v${SGLANG_VERSION}\n" in text
    assert re.search(r"^FROM \$\{SGLANG_IMAGE\}$", text, re.M)
    assert re.search(r'^ENTRYPOINT \["sglang-supervisor"\]$', text, re.M)  # exec form: PID 1
    assert "pip install --no-cache-dir /tmp/sglang-supervisor" in text
    assert _image_to_repo(config.server.model_config or "").is_file()


def test_the_docker_build_context_holds_what_the_dockerfile_copies():
    ignore = (m.DEPLOY / "Dockerfile.dockerignore").read_text().split()
    assert ignore[0] == "*"
    allowed = {line.removeprefix("!").rstrip("/") for line in ignore if line.startswith("!")}
    for line in DOCKERFILE.read_text().splitlines():
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                assert source in allowed, source
                assert (m.ROOT / source).exists(), source


def test_the_secret_example_holds_placeholders_only(secret):
    assert secret["stringData"]
    for key, value in secret["stringData"].items():
        assert value.startswith("REPLACE-"), key


def test_the_service_reaches_sglang_on_the_leader_only(lws):
    service = m.one("service.yaml", "Service")
    selector = service["spec"]["selector"]
    assert selector == {
        "leaderworkerset.sigs.k8s.io/name": lws["metadata"]["name"],
        "leaderworkerset.sigs.k8s.io/worker-index": "0",
    }
    ports = {p["name"]: p["containerPort"] for p in m.container(_leader(lws))["ports"]}
    (port,) = service["spec"]["ports"]
    assert ports[port["targetPort"]] == 30000
    assert "--port" in m.container(_leader(lws))["args"]


def test_the_readmes_explain_the_deployment_and_the_failure_semantics():
    deploy_readme = (m.DEPLOY / "README.md").read_text()
    for name in (*MANIFESTS, "Dockerfile"):
        assert name in deploy_readme, name
    readme = (m.ROOT / "README.md").read_text()
    section = readme.split("### Failure semantics", 1)[1].split("\n## ", 1)[0]
    assert "docs/multi-node.md" in section
    assert "deploy/kubernetes" in section


def _pod_env(c: dict[str, Any], rank: int, size: int, state_dir: Path) -> dict[str, str]:
    """The container's environment as the kubelet builds it for worker `rank` of group 0:
    LWS's variables, the Downward API's fields, the Secret's keys, $(VAR) expanded."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(state_dir),
        "LWS_LEADER_ADDRESS": "kimi-k2-5-0.kimi-k2-5.default",
        "LWS_GROUP_SIZE": str(size),
        "LWS_WORKER_INDEX": str(rank),
    }
    downward = {
        "status.podIP": "127.0.0.1",
        "metadata.labels['leaderworkerset.sigs.k8s.io/name']": "kimi-k2-5",
        "metadata.labels['leaderworkerset.sigs.k8s.io/group-index']": "0",
    }
    secret = {"group-token": "a-group-token-of-the-test", "hf-token": "hf_test_token_value"}
    for item in c["env"]:
        source = item.get("valueFrom", {})
        if "fieldRef" in source:
            env[item["name"]] = downward[source["fieldRef"]["fieldPath"]]
        elif "secretKeyRef" in source:
            env[item["name"]] = secret[source["secretKeyRef"]["key"]]
        else:
            env[item["name"]] = re.sub(r"\$\((\w+)\)", lambda g: env[g.group(1)], item["value"])
    env["SGLANG_SUPERVISOR_STATE_DIR"] = str(state_dir / "state")  # nothing is written: dry run
    return env


@pytest.mark.parametrize("rank", [0, 1])
def test_run_in_the_pod_fills_the_group_flags_from_lws(lws, configmap, tmp_path, rank):
    """`run --dry-run` with the pod's command line, environment and ConfigMap: group mode reads
    LWS's variables and launches with --nnodes, --node-rank, --dist-init-addr and the gate."""
    (tmp_path / "config.toml").write_text(configmap["data"]["config.toml"])
    c = m.container(_leader(lws))
    size = lws["spec"]["leaderWorkerTemplate"]["size"]
    command = [*c["command"][1:3], str(tmp_path / "config.toml")]  # run --config FILE
    model_config = _image_to_repo(
        m.load_configmap_config(configmap, tmp_path).server.model_config or ""
    )
    options = ["--model-config", str(model_config), "--gpu-backend", "none", "--log-format", "json"]
    argv = [sys.executable, "-m", "supervisor", *command, *options, "--force", "--dry-run"]
    result = subprocess.run(
        [*argv, "--", *c["args"]],
        env=_pod_env(c, rank, size, tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    preview = json.loads(result.stdout)
    leader = "kimi-k2-5-0.kimi-k2-5.default:20000"
    filled = ["--nnodes", str(size), "--node-rank", str(rank), "--dist-init-addr", leader]
    assert preview["argv"] == [*c["args"], *filled, "--gated-launch-port", "30100"]
    assert (preview["group"]["size"], preview["group"]["node_rank"]) == (size, rank)
    assert "a-group-token-of-the-test" not in result.stdout + result.stderr


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")
def test_kubectl_reads_the_manifests_as_these_tests_do(tmp_path):
    """The templates share their containers through YAML anchors: kubectl (kustomize) must
    expand them to what PyYAML reads here. Offline: `kubectl kustomize` needs no cluster."""
    applied = ("leaderworkerset.yaml", "configmap.yaml", "service.yaml")
    for name in applied:
        shutil.copy(m.DEPLOY / name, tmp_path / name)
    (tmp_path / "kustomization.yaml").write_text(f"resources: {list(applied)}\n")
    result = subprocess.run(
        ["kubectl", "kustomize", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    built = {doc["kind"]: doc for doc in yaml.safe_load_all(result.stdout)}
    for name in applied:
        (doc,) = m.documents(name)
        assert built[doc["kind"]] == doc, name
