"""The manifests of deploy/kubernetes/ as data, and the checks that tie them to the supervisor:
each check returns what is wrong (empty when consistent), so a test can also show that a
mutated manifest is caught.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from supervisor.commands.run_options import STOP_MARGIN_S, UNIT_STOP_TIMEOUT_ENV
from supervisor.config import SupervisorConfig, load_config
from supervisor.core.group import GivenFlags
from supervisor.core.sglang_args import LaunchPlan
from supervisor.group.setup import given_flags
from supervisor.preflight import launch_reader
from tests.deploy.lws_schema import quantity

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "kubernetes"
SUPERVISOR_COMMAND = ["sglang-supervisor", "run", "--config"]
GROUP_TOKEN_ENV = "SGLANG_SUPERVISOR_GROUP_TOKEN"  # docs/multi-node.md, design of [group] token
STATE_ROOT = "/var/lib/sglang-supervisor"
# Group mode fills --nnodes, --node-rank, --dist-init-addr and --gated-launch-port from LWS_*
# and [group]; given by hand they would only have to agree with it.
NONE_GIVEN = GivenFlags(nnodes=None, node_rank=None, dist_init_addrs=(), gated_launch_port=None)
# Pod fields that must not differ between leader and worker: one deployment, two roles.
SHARED_CONTAINER_FIELDS = (
    "image", "command", "args", "env", "resources", "securityContext", "startupProbe",
    "livenessProbe", "readinessProbe", "volumeMounts",
)  # fmt: skip
SHARED_POD_FIELDS = ("terminationGracePeriodSeconds", "volumes", "nodeSelector", "restartPolicy")


def documents(name: str) -> list[dict[str, Any]]:
    with (DEPLOY / name).open() as fh:
        return [doc for doc in yaml.safe_load_all(fh) if doc is not None]


def one(name: str, kind: str) -> dict[str, Any]:
    """The only document of `kind` in deploy/kubernetes/`name` (a fresh copy to mutate)."""
    docs = [d for d in documents(name) if d.get("kind") == kind]
    assert len(docs) == 1, f"{name}: {len(docs)} documents of kind {kind}"
    return copy.deepcopy(docs[0])


def load_configmap_config(configmap: Mapping[str, Any], tmp_dir: Path) -> SupervisorConfig:
    """The ConfigMap's config.toml through the supervisor's own loader, as the pod reads it."""
    path = tmp_dir / "config.toml"
    path.write_text(configmap["data"]["config.toml"])
    return load_config(path)


def templates(lws: Mapping[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(role, pod spec) for the leader and the worker; the leader's defaults to the worker's."""
    lwt = lws["spec"]["leaderWorkerTemplate"]
    for role in ("leaderTemplate", "workerTemplate"):
        yield role, lwt.get(role, lwt["workerTemplate"])["spec"]


def container(pod: Mapping[str, Any]) -> dict[str, Any]:
    containers: list[dict[str, Any]] = pod["containers"]
    return next(c for c in containers if c["command"][:2] == SUPERVISOR_COMMAND[:2])


def env_of(c: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in c.get("env", [])}


def volume_at(pod: Mapping[str, Any], mount_path: str) -> dict[str, Any] | None:
    """The volume mounted at `mount_path` (or at a directory above it) in the supervisor's
    container, with the mount's own fields under "_mount"."""
    mounts = sorted(container(pod).get("volumeMounts", []), key=lambda m: -len(m["mountPath"]))
    for mount in mounts:
        base = mount["mountPath"].rstrip("/")
        if mount_path == base or mount_path.startswith(base + "/"):
            volume = next(v for v in pod.get("volumes", []) if v["name"] == mount["name"])
            return {**volume, "_mount": mount}
    return None


def launch_plan(config: SupervisorConfig, c: Mapping[str, Any]) -> LaunchPlan:
    """The container's launch arguments (after `--`) read as SGLang 0.5.23 reads them."""
    args = tuple(c.get("args", []))
    return launch_reader(config, args).plan(args)


def group_flags_given(config: SupervisorConfig, c: Mapping[str, Any]) -> GivenFlags:
    """The group flags the container's arguments give, as the supervisor reads them."""
    args = tuple(c.get("args", []))
    return given_flags(launch_reader(config, args), args)


def budget_s(probe: Mapping[str, Any]) -> int:
    """How long a probe may fail before the kubelet acts (failureThreshold x periodSeconds)."""
    return int(probe.get("failureThreshold", 3)) * int(probe.get("periodSeconds", 10))


def probe_problems(config: SupervisorConfig, c: Mapping[str, Any]) -> list[str]:
    """Probes on the supervisor's listener, and long enough for the supervisor to act first."""
    out = []
    address = config.http.address
    port = address[1] if address else None
    expected = {"livenessProbe": "/healthz", "readinessProbe": "/readyz", "startupProbe": "/readyz"}
    for name, path in expected.items():
        get = c.get(name, {}).get("httpGet", {})
        if (get.get("path"), get.get("port")) != (path, port):
            out.append(f"{name} must GET {path} on the listener's port {port}, not {get}")
    run, group, gpu = config.run, config.group, config.gpu
    startup_need_s = run.startup_timeout_s + group.resolve_timeout_s + group.report_timeout_s
    startup_s = budget_s(c.get("startupProbe", {}))
    if startup_s < max(1800.0, startup_need_s):
        out.append(
            f"startupProbe allows {startup_s} s: less than a 30-minute load or the supervisor's "
            f"own limits ({startup_need_s:g} s: startup_timeout + resolve + report)"
        )
    live_need_s = run.stop_grace_s + gpu.release_timeout_s + gpu.reset_timeout_s
    if budget_s(c.get("livenessProbe", {})) < live_need_s:
        out.append(
            f"livenessProbe allows {budget_s(c.get('livenessProbe', {}))} s, less than the "
            f"supervisor's own way out of a failure ({live_need_s:g} s)"
        )
    return out


def stop_problems(config: SupervisorConfig, pod: Mapping[str, Any]) -> list[str]:
    grace = pod.get("terminationGracePeriodSeconds", 30)
    out = []
    if grace < config.run.stop_grace_s + STOP_MARGIN_S:
        out.append(
            f"terminationGracePeriodSeconds {grace} < stop_grace {config.run.stop_grace_s:g} s "
            f"+ {STOP_MARGIN_S:g} s"
        )
    told = env_of(container(pod)).get(UNIT_STOP_TIMEOUT_ENV, {}).get("value")
    if told != str(grace):
        out.append(f"{UNIT_STOP_TIMEOUT_ENV} is {told!r}, not the grace period {grace}")
    return out


def secret_ref(c: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    ref: dict[str, Any] | None = env_of(c).get(name, {}).get("valueFrom", {}).get("secretKeyRef")
    return ref


def env_problems(c: Mapping[str, Any], secret: Mapping[str, Any]) -> list[str]:
    """Tokens from the Secret, the pod IP and the node-local state directory from the Downward
    API, every variable defined before a $(reference) to it."""
    out = []
    for name, optional in ((GROUP_TOKEN_ENV, False), ("HF_TOKEN", True)):
        ref = secret_ref(c, name)
        if ref is None or ref.get("name") != secret["metadata"]["name"]:
            out.append(f"{name} must come from the Secret {secret['metadata']['name']}")
        elif ref["key"] not in secret["stringData"] or bool(ref.get("optional")) != optional:
            out.append(f"{name}: key {ref['key']!r} missing from the Secret, or optional wrong")
    env = env_of(c)
    fields = {
        "POD_IP": "status.podIP",
        "LWS_NAME": "metadata.labels['leaderworkerset.sigs.k8s.io/name']",
        "GROUP_INDEX": "metadata.labels['leaderworkerset.sigs.k8s.io/group-index']",
    }
    for name, path in fields.items():
        if env.get(name, {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") != path:
            out.append(f"{name} must come from the Downward API field {path}")
    state = env.get("SGLANG_SUPERVISOR_STATE_DIR", {}).get("value")
    if state != f"{STATE_ROOT}/$(LWS_NAME)-$(GROUP_INDEX)":
        out.append(f"SGLANG_SUPERVISOR_STATE_DIR is {state!r}: not keyed by LWS name and group")
    names = [e["name"] for e in c.get("env", [])]
    for i, item in enumerate(c.get("env", [])):
        for ref in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", item.get("value", "")):
            if ref not in names[:i]:
                out.append(f"{item['name']} refers to $({ref}), not defined before it")
    return out


def volume_problems(pod: Mapping[str, Any]) -> list[str]:
    out = []
    shm = volume_at(pod, "/dev/shm")
    empty_dir = (shm or {}).get("emptyDir", {})
    if empty_dir.get("medium") != "Memory" or "sizeLimit" not in empty_dir:
        out.append("/dev/shm must be an emptyDir of medium Memory with a sizeLimit")
    state = volume_at(pod, f"{STATE_ROOT}/x")
    if state is None or state.get("hostPath", {}).get("path") != STATE_ROOT:
        out.append(f"{STATE_ROOT} must be the node's own {STATE_ROOT} (hostPath)")
    hf_home = env_of(container(pod)).get("HF_HOME", {}).get("value", "/root/.cache/huggingface")
    if volume_at(pod, hf_home) is None:
        out.append(f"the model cache HF_HOME={hf_home} is not on a volume")
    caps = container(pod).get("securityContext", {}).get("capabilities", {}).get("add", [])
    if "IPC_LOCK" not in caps:
        out.append("capabilities.add lacks IPC_LOCK (SGLang pins the host pool)")
    return out


def config_mount_problems(pod: Mapping[str, Any], configmap: Mapping[str, Any]) -> list[str]:
    command = container(pod)["command"]
    if command[:3] != SUPERVISOR_COMMAND or command[4:] != ["--"]:
        return [f"command {command}: not `sglang-supervisor run --config FILE --`"]
    path = Path(command[3])
    volume = volume_at(pod, str(path))
    if volume is None or volume.get("configMap", {}).get("name") != configmap["metadata"]["name"]:
        return [f"{path} is not on the ConfigMap {configmap['metadata']['name']}"]
    if "subPath" in volume["_mount"] or path.name not in configmap["data"]:
        return [f"{path}: mount the whole ConfigMap (no subPath), with a key {path.name}"]
    return []


def resource_problems(pod: Mapping[str, Any], plan: LaunchPlan, size: int) -> list[str]:
    resources = container(pod).get("resources", {})
    limits, requests = resources.get("limits", {}), resources.get("requests", {})
    out = []
    if limits != requests:
        out.append("requests differ from limits: the pod is not of Guaranteed QoS")
    ranks = plan.tp_size * plan.pp_size * plan.dp_size
    if ranks % size or quantity(limits.get("nvidia.com/gpu", 0)) != ranks // size:
        out.append(f"nvidia.com/gpu {limits.get('nvidia.com/gpu')}: {ranks} ranks on {size} nodes")
    return out


def memory_limit_bytes(pod: Mapping[str, Any]) -> int:
    return int(quantity(container(pod)["resources"]["limits"]["memory"]))


def shm_limit_bytes(pod: Mapping[str, Any]) -> int:
    shm = volume_at(pod, "/dev/shm")
    assert shm is not None
    return int(quantity(shm["emptyDir"]["sizeLimit"]))
