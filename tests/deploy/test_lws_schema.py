"""Each rule of tests/deploy/lws_schema.py catches the mistake it is there for: the shipped
manifest, changed in one place, is refused with a message naming the path."""

from __future__ import annotations

from typing import Any

import pytest

from tests.deploy import manifests as m
from tests.deploy.lws_schema import data_keys_problems, quantity, validate

_DEL = object()  # the value that deletes the key
T = ("spec", "leaderWorkerTemplate")
W = (*T, "workerTemplate", "spec")
L = (*T, "leaderTemplate", "spec")
C = (*W, "containers", 0)
V = (*W, "volumes")  # 0: dshm (emptyDir), 2: state (hostPath)

# (id, path, value, what the error says)
LWS_CASES: list[tuple[str, tuple[Any, ...], Any, str]] = [
    ("apiVersion", ("apiVersion",), "leaderworkerset.x-k8s.io/v1alpha1", "is not one of"),
    ("no metadata", ("metadata",), _DEL, "metadata: required"),
    ("no name", ("metadata", "name"), _DEL, "metadata.name: required"),
    ("name not DNS-1035", ("metadata", "name"), "0-kimi", "does not match"),
    ("no spec", ("spec",), _DEL, "spec: required"),
    ("no leaderWorkerTemplate", T, _DEL, "leaderWorkerTemplate: required"),
    ("no workerTemplate", (*T, "workerTemplate"), _DEL, "workerTemplate: required"),
    ("size 0", (*T, "size"), 0, "below the minimum 1"),
    ("size a string", (*T, "size"), "2", "expected an integer"),
    ("size beyond int32", (*T, "size"), 2**31, "above the maximum"),
    ("replicas negative", ("spec", "replicas"), -1, "below the minimum 0"),
    ("replicas above 1e6", ("spec", "replicas"), 1_000_001, "above the maximum"),
    ("restartPolicy", (*T, "restartPolicy"), "Always", "is not one of"),
    ("startupPolicy", ("spec", "startupPolicy"), "Eager", "is not one of"),
    ("unknown LWS field", (*T, "sizes"), 2, "sizes: unknown field"),
    ("rollout without type", ("spec", "rolloutStrategy"), {}, "type: required"),
    ("rollout type", ("spec", "rolloutStrategy"), {"type": "Recreate"}, "is not one of"),
    (
        "maxSurge",
        ("spec", "rolloutStrategy"),
        {"type": "RollingUpdate", "rollingUpdateConfiguration": {"maxSurge": "1x"}},
        "does not match",
    ),
    ("networkConfig", ("spec", "networkConfig"), {}, "subdomainPolicy: required"),
    ("subdomainPolicy", ("spec", "networkConfig"), {"subdomainPolicy": "Own"}, "is not one of"),
    (
        "subGroupPolicyType",
        (*T, "subGroupPolicy"),
        {"subGroupPolicyType": "Leader", "subGroupSize": 1},
        "is not one of",
    ),
    ("template without spec", (*T, "leaderTemplate", "spec"), _DEL, "spec: required"),
    ("no containers", (*W, "containers"), _DEL, "containers: required"),
    ("empty containers", (*W, "containers"), [], "at least 1"),
    ("unknown pod field", (*W, "terminationGracePeriodSecond"), 240, "unknown field"),
    ("grace a string", (*W, "terminationGracePeriodSeconds"), "240", "expected an integer"),
    ("pod restartPolicy", (*L, "restartPolicy"), "Sometimes", "is not one of"),
    ("nodeSelector value", (*W, "nodeSelector", "gpus"), 8, "expected a string"),
    (
        "label value not a string",
        (*T, "workerTemplate", "metadata", "labels", "worker"),
        0,
        "expected a string",
    ),
    ("container without name", (*C, "name"), _DEL, "name: required"),
    ("container name", (*C, "name"), "SGLang", "does not match"),
    ("unknown container field", (*C, "livenesProbe"), {}, "unknown field"),
    ("imagePullPolicy", (*C, "imagePullPolicy"), "Sometimes", "is not one of"),
    ("command a string", (*C, "command"), "sglang-supervisor run", "expected a list"),
    ("an unquoted number in args", (*C, "args", 3), 16, "expected a string"),
    ("env without name", (*C, "env", 0, "name"), _DEL, "name: required"),
    ("env value a number", (*C, "env", 4, "value"), 240, "expected a string"),
    ("env value and valueFrom", (*C, "env", 0, "value"), "10.0.0.1", "at most one"),
    (
        "valueFrom with two sources",
        (*C, "env", 0, "valueFrom", "secretKeyRef"),
        {"name": "s", "key": "k"},
        "exactly one",
    ),
    ("fieldPath", (*C, "env", 1, "valueFrom", "fieldRef", "fieldPath"), "labels.x", "match"),
    ("secretKeyRef without key", (*C, "env", 5, "valueFrom", "secretKeyRef", "key"), _DEL, "key"),
    ("optional not a bool", (*C, "env", 6, "valueFrom", "secretKeyRef", "optional"), "yes", "true"),
    ("containerPort", (*L, "containers", 0, "ports", 0, "containerPort"), 70000, "maximum"),
    ("port name", (*L, "containers", 0, "ports", 0, "name"), "sglang-openai-api", "match"),
    ("protocol", (*L, "containers", 0, "ports", 0, "protocol"), "HTTP", "is not one of"),
    ("memory quantity", (*C, "resources", "limits", "memory"), "1600 GiB", "not a quantity"),
    ("gpu quantity", (*C, "resources", "limits", "nvidia.com/gpu"), "eight", "not a quantity"),
    ("capabilities not a list", (*C, "securityContext", "capabilities", "add"), "IPC_LOCK", "list"),
    ("probe port 0", (*C, "livenessProbe", "httpGet", "port"), 0, "below the minimum 1"),
    ("probe path", (*C, "livenessProbe", "httpGet", "path"), "healthz", "does not match"),
    ("probe scheme", (*C, "readinessProbe", "httpGet", "scheme"), "TCP", "is not one of"),
    ("probe handlers", (*C, "startupProbe", "tcpSocket"), {"port": 9400}, "exactly one"),
    ("probe without handler", (*C, "startupProbe", "httpGet"), _DEL, "exactly one"),
    ("periodSeconds 0", (*C, "livenessProbe", "periodSeconds"), 0, "below the minimum 1"),
    ("mount without path", (*C, "volumeMounts", 0, "mountPath"), _DEL, "mountPath: required"),
    ("relative mountPath", (*C, "volumeMounts", 0, "mountPath"), "dev/shm", "does not match"),
    ("volume name", (*V, 0, "name"), "DSHM", "does not match"),
    ("volume without source", (*V, 0, "emptyDir"), _DEL, "exactly one"),
    ("volume with two sources", (*V, 0, "hostPath"), {"path": "/x"}, "exactly one"),
    ("emptyDir medium", (*V, 0, "emptyDir", "medium"), "RAM", "does not match"),
    ("sizeLimit", (*V, 0, "emptyDir", "sizeLimit"), "32 gigs", "not a quantity"),
    ("hostPath without path", (*V, 2, "hostPath", "path"), _DEL, "path: required"),
    ("hostPath relative", (*V, 2, "hostPath", "path"), "var/lib", "does not match"),
    ("hostPath type", (*V, 2, "hostPath", "type"), "Dir", "is not one of"),
]


def _mutated(doc: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    parent: Any = doc
    for key in path[:-1]:
        parent = parent[key]
    if value is _DEL:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return doc


def test_the_shipped_leaderworkerset_is_valid():
    assert validate(m.one("leaderworkerset.yaml", "LeaderWorkerSet")) == []


@pytest.mark.parametrize(
    ("path", "value", "expected"), [c[1:] for c in LWS_CASES], ids=[c[0] for c in LWS_CASES]
)
def test_a_leaderworkerset_broken_in_one_place_is_refused(path, value, expected):
    lws = _mutated(m.one("leaderworkerset.yaml", "LeaderWorkerSet"), path, value)
    errors = validate(lws)
    assert any(expected in e for e in errors), errors


OTHER_CASES = [
    ("kind", "service.yaml", "Service", ("kind",), "Deployment", "not one of"),
    ("selector value", "service.yaml", "Service", ("spec", "selector", "x"), 0, "a string"),
    ("service port", "service.yaml", "Service", ("spec", "ports", 0, "port"), 0, "minimum"),
    (
        "targetPort name",
        "service.yaml",
        "Service",
        ("spec", "ports", 0, "targetPort"),
        "-",
        "match",
    ),
    ("service type", "service.yaml", "Service", ("spec", "type"), "Internal", "is not one of"),
    ("no ports", "service.yaml", "Service", ("spec", "ports"), [], "at least 1"),
    ("config data", "configmap.yaml", "ConfigMap", ("data", "config.toml"), 1, "a string"),
    ("no data", "configmap.yaml", "ConfigMap", ("data",), _DEL, "data: required"),
    (
        "empty secret value",
        "secret.example.yaml",
        "Secret",
        ("stringData", "hf-token"),
        "",
        "match",
    ),
    ("secret name", "secret.example.yaml", "Secret", ("metadata", "name"), "Secrets", "match"),
]


@pytest.mark.parametrize(
    ("name", "kind", "path", "value", "expected"),
    [c[1:] for c in OTHER_CASES],
    ids=[c[0] for c in OTHER_CASES],
)
def test_a_service_configmap_or_secret_broken_in_one_place_is_refused(
    name, kind, path, value, expected
):
    errors = validate(_mutated(m.one(name, kind), path, value))
    assert any(expected in e for e in errors), errors


def test_a_data_key_that_cannot_be_a_file_name_is_refused():
    configmap = m.one("configmap.yaml", "ConfigMap")
    configmap["data"]["config toml"] = configmap["data"].pop("config.toml")
    assert data_keys_problems([configmap]) != []


@pytest.mark.parametrize(
    ("text", "value"),
    [("1600Gi", 1600 * 2**30), ("96", 96), ("500m", 0.5), ("1.5G", 1.5e9), ("1e3", 1000), (8, 8)],
)
def test_quantities_are_read_as_kubernetes_reads_them(text, value):
    assert quantity(text) == value


@pytest.mark.parametrize("text", ["1600 GiB", "1.6TB", "", "Gi", "-", True])
def test_what_is_not_a_quantity_is_refused(text):
    with pytest.raises(ValueError, match="not a quantity"):
        quantity(text)
