"""Each consistency check of tests/deploy/manifests.py catches the drift it is there for: the
shipped LeaderWorkerSet, changed in one place, no longer agrees with the supervisor's config."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from supervisor.commands.run_options import UNIT_STOP_TIMEOUT_ENV
from supervisor.config import SupervisorConfig
from tests.deploy import manifests as m

Pod = dict[str, Any]
Check = Callable[[Pod, SupervisorConfig], list[str]]


def _container(pod: Pod) -> dict[str, Any]:
    return m.container(pod)


def _env(pod: Pod, name: str) -> dict[str, Any]:
    return m.env_of(_container(pod))[name]


def _volume(pod: Pod, name: str) -> dict[str, Any]:
    return next(v for v in pod["volumes"] if v["name"] == name)


def _probes(pod: Pod, config: SupervisorConfig) -> list[str]:
    return m.probe_problems(config, _container(pod))


def _stop(pod: Pod, config: SupervisorConfig) -> list[str]:
    return m.stop_problems(config, pod)


def _env_checks(pod: Pod, config: SupervisorConfig) -> list[str]:
    return m.env_problems(_container(pod), m.one("secret.example.yaml", "Secret"))


def _volumes(pod: Pod, config: SupervisorConfig) -> list[str]:
    return m.volume_problems(pod)


def _config_mount(pod: Pod, config: SupervisorConfig) -> list[str]:
    return m.config_mount_problems(pod, m.one("configmap.yaml", "ConfigMap"))


def _resources(pod: Pod, config: SupervisorConfig) -> list[str]:
    return m.resource_problems(pod, m.launch_plan(config, _container(pod)), 2)


def _set_probe(name: str, **fields: Any) -> Callable[[Pod], None]:
    def mutate(pod: Pod) -> None:
        probe = dict(_container(pod)[name])
        probe.update(fields)
        _container(pod)[name] = probe

    return mutate


def _reorder_state_dir(pod: Pod) -> None:
    env = _container(pod)["env"]
    state = next(e for e in env if e["name"] == "SGLANG_SUPERVISOR_STATE_DIR")
    _container(pod)["env"] = [state, *(e for e in env if e is not state)]


def _plain_token(pod: Pod) -> None:
    _env(pod, m.GROUP_TOKEN_ENV).pop("valueFrom")
    _env(pod, m.GROUP_TOKEN_ENV)["value"] = "s3cret"


def _drop_ipc_lock(pod: Pod) -> None:
    _container(pod)["securityContext"] = {"capabilities": {"add": ["SYS_PTRACE"]}}


def _to_empty_dir(volume: dict[str, Any]) -> None:
    volume.pop("hostPath")
    volume["emptyDir"] = {}


def _gpus(count: str, request: str | None = None) -> Callable[[Pod], None]:
    def mutate(pod: Pod) -> None:
        resources = {k: dict(v) for k, v in _container(pod)["resources"].items()}
        resources["limits"]["nvidia.com/gpu"] = count
        resources["requests"]["nvidia.com/gpu"] = request or count
        _container(pod)["resources"] = resources

    return mutate


def _mount(name: str, **fields: Any) -> Callable[[Pod], None]:
    def mutate(pod: Pod) -> None:
        mounts = [dict(x) for x in _container(pod)["volumeMounts"]]
        next(x for x in mounts if x["name"] == name).update(fields)
        _container(pod)["volumeMounts"] = mounts

    return mutate


CASES: list[tuple[str, Callable[[Pod], None], Check, str]] = [
    (
        "liveness on SGLang's /health",
        _set_probe("livenessProbe", httpGet={"path": "/health", "port": 9400}),
        _probes,
        "livenessProbe must GET /healthz",
    ),
    (
        "readiness on another port",
        _set_probe("readinessProbe", httpGet={"path": "/readyz", "port": 30000}),
        _probes,
        "readinessProbe must GET /readyz",
    ),
    (
        "startup shorter than a load",
        _set_probe("startupProbe", failureThreshold=100),
        _probes,
        "startupProbe allows 1000 s",
    ),
    (
        "liveness cuts the release wait",
        _set_probe("livenessProbe", failureThreshold=3),
        _probes,
        "livenessProbe allows 30 s",
    ),
    (
        "grace below stop_grace + 30",
        lambda pod: pod.update(terminationGracePeriodSeconds=60),
        _stop,
        "terminationGracePeriodSeconds 60",
    ),
    (
        "the supervisor told another grace",
        lambda pod: _env(pod, UNIT_STOP_TIMEOUT_ENV).update(value="600"),
        _stop,
        "not the grace period",
    ),
    ("the group token in plain text", _plain_token, _env_checks, "must come from the Secret"),
    (
        "HF_TOKEN required",
        lambda pod: _env(pod, "HF_TOKEN")["valueFrom"]["secretKeyRef"].update(optional=False),
        _env_checks,
        "optional wrong",
    ),
    (
        "a key the Secret lacks",
        lambda pod: _env(pod, m.GROUP_TOKEN_ENV)["valueFrom"]["secretKeyRef"].update(key="token"),
        _env_checks,
        "missing from the Secret",
    ),
    (
        "POD_IP from the host",
        lambda pod: _env(pod, "POD_IP")["valueFrom"]["fieldRef"].update(fieldPath="status.hostIP"),
        _env_checks,
        "POD_IP must come",
    ),
    (
        "state dir not keyed by group",
        lambda pod: _env(pod, "SGLANG_SUPERVISOR_STATE_DIR").update(
            value="/var/lib/sglang-supervisor/kimi"
        ),
        _env_checks,
        "not keyed",
    ),
    ("state dir before its variables", _reorder_state_dir, _env_checks, "not defined before it"),
    (
        "/dev/shm on disk",
        lambda pod: _volume(pod, "dshm").update(emptyDir={"sizeLimit": "32Gi"}),
        _volumes,
        "medium Memory",
    ),
    (
        "/dev/shm unbounded",
        lambda pod: _volume(pod, "dshm").update(emptyDir={"medium": "Memory"}),
        _volumes,
        "sizeLimit",
    ),
    (
        "state in the container",
        lambda pod: _to_empty_dir(_volume(pod, "state")),
        _volumes,
        "hostPath",
    ),
    ("no IPC_LOCK", _drop_ipc_lock, _volumes, "IPC_LOCK"),
    (
        "config by subPath",
        _mount("config", subPath="config.toml", mountPath="/etc/sglang-supervisor/config.toml"),
        _config_mount,
        "no subPath",
    ),
    (
        "config from another ConfigMap",
        lambda pod: _volume(pod, "config").update(configMap={"name": "other"}),
        _config_mount,
        "is not on the ConfigMap",
    ),
    (
        "not the supervisor",
        lambda pod: _container(pod).update(
            command=["sglang-supervisor", "run", "--config", "/etc/sglang-supervisor/config.toml"]
        ),
        _config_mount,
        "not `sglang-supervisor run",
    ),
    ("4 GPUs for 8 ranks", _gpus("4"), _resources, "16 ranks on 2 nodes"),
    ("burstable", _gpus("8", "7"), _resources, "Guaranteed"),
]


@pytest.mark.parametrize(
    ("mutate", "check", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_a_manifest_that_drifts_from_the_supervisor_is_caught(
    mutate, check, expected, tmp_path: Path
):
    config = m.load_configmap_config(m.one("configmap.yaml", "ConfigMap"), tmp_path)
    lws = m.one("leaderworkerset.yaml", "LeaderWorkerSet")
    pod = dict(m.templates(lws))["workerTemplate"]
    assert check(pod, config) == []
    mutate(pod)
    problems = check(pod, config)
    assert any(expected in p for p in problems), problems


@pytest.mark.parametrize(
    "flag",
    [
        ["--nnodes", "2"],
        ["--node-rank", "1"],
        ["--dist-init-addr", "x:20000"],
        ["--gated-launch-port", "30100"],
        ["--nnode", "2"],
    ],
)
def test_launch_arguments_that_set_the_group_flags_by_hand_are_caught(flag, tmp_path):
    config = m.load_configmap_config(m.one("configmap.yaml", "ConfigMap"), tmp_path)
    lws = m.one("leaderworkerset.yaml", "LeaderWorkerSet")
    c = m.container(dict(m.templates(lws))["leaderTemplate"])
    c["args"] = [*c["args"], *flag]
    assert m.group_flags_given(config, c) != m.NONE_GIVEN
