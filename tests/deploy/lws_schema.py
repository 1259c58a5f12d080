"""The LeaderWorkerSet v1 field schema, as far as deploy/kubernetes/ uses it, to check manifests
without a cluster.

Written from kubernetes-sigs/lws: api/leaderworkerset/v1/leaderworkerset_types.go (the fields,
their JSON names, the kubebuilder enums, defaults and bounds), the CRD generated from it,
config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml (the Pod templates' OpenAPI
schema: required fields and types, the Downward API field paths), and the admission webhook,
pkg/webhooks/leaderworkerset_webhook.go (size >= 1, a DNS-1035 name). The Pod template is
core/v1's PodTemplateSpec (k8s.io/api/core/v1/types.go): the fields the manifests use are typed;
the other field names of the CRD are accepted untyped, and any other name is refused, as
`kubectl apply` (strict field validation) refuses it. The Service, ConfigMap and Secret below
are core/v1 too, checked as far as deploy/kubernetes/ fills them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from tests.deploy.schema_nodes import (
    DNS1035,
    DNS1123_LABEL,
    FIELD_PATH,
    IANA_SVC_NAME,
    Anything,
    Arr,
    Bool,
    Int,
    IntOrPercent,
    Map,
    Node,
    Obj,
    Port,
    Quantity,
    Str,
    quantity,
)

__all__ = ["SCHEMAS", "data_keys_problems", "quantity", "validate"]

STRINGS = Arr(Str())
OBJECT_META = Obj(
    {
        "name": Str(pattern=DNS1123_LABEL),
        "namespace": Str(pattern=DNS1123_LABEL),
        "labels": Map(Str()),
        "annotations": Map(Str()),
    },
    untyped=("finalizers", "generateName", "ownerReferences"),
)
KEY_REF = Obj({"key": Str(), "name": Str(), "optional": Bool()}, required=("key",))
ENV_VAR = Obj(
    {
        "name": Str(pattern=re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")),
        "value": Str(),
        "valueFrom": Obj(
            {
                "fieldRef": Obj(
                    {"fieldPath": Str(pattern=FIELD_PATH), "apiVersion": Str()},
                    required=("fieldPath",),
                ),
                "secretKeyRef": KEY_REF,
                "configMapKeyRef": KEY_REF,
            },
            untyped=("resourceFieldRef", "fileKeyRef"),
            one_of=(
                "fieldRef",
                "secretKeyRef",
                "configMapKeyRef",
                "resourceFieldRef",
                "fileKeyRef",
            ),
        ),
    },
    required=("name",),
    at_most_one=("value", "valueFrom"),
)
PROBE = Obj(
    {
        "httpGet": Obj(
            {
                "path": Str(pattern=re.compile(r"^/")),
                "port": Port(),
                "host": Str(),
                "scheme": Str(enum=("HTTP", "HTTPS")),
                "httpHeaders": Arr(Obj({"name": Str(), "value": Str()}, ("name", "value"))),
            },
            required=("port",),
        ),
        "tcpSocket": Obj({"port": Port(), "host": Str()}, required=("port",)),
        "exec": Obj({"command": STRINGS}),
        "grpc": Obj({"port": Int(1, 65535), "service": Str()}, required=("port",)),
        "initialDelaySeconds": Int(0),
        "periodSeconds": Int(1),
        "timeoutSeconds": Int(1),
        "successThreshold": Int(1),
        "failureThreshold": Int(1),
        "terminationGracePeriodSeconds": Int(1, None),
    },
    one_of=("httpGet", "tcpSocket", "exec", "grpc"),
)
CONTAINER_UNTYPED = (
    "envFrom", "lifecycle", "resizePolicy", "restartPolicy", "restartPolicyRules", "stdin",
    "stdinOnce", "terminationMessagePath", "terminationMessagePolicy", "tty", "volumeDevices",
)  # fmt: skip
CONTAINER = Obj(
    {
        "name": Str(pattern=DNS1123_LABEL),
        "image": Str(),
        "imagePullPolicy": Str(enum=("Always", "IfNotPresent", "Never")),
        "command": STRINGS,
        "args": STRINGS,
        "workingDir": Str(),
        "env": Arr(ENV_VAR),
        "ports": Arr(
            Obj(
                {
                    "containerPort": Int(1, 65535),
                    "name": Str(pattern=IANA_SVC_NAME),
                    "protocol": Str(enum=("TCP", "UDP", "SCTP")),
                    "hostPort": Int(1, 65535),
                    "hostIP": Str(),
                },
                required=("containerPort",),
            )
        ),
        "resources": Obj(
            {"limits": Map(Quantity()), "requests": Map(Quantity())}, untyped=("claims",)
        ),
        "securityContext": Obj(
            {
                "capabilities": Obj({"add": STRINGS, "drop": STRINGS}),
                "privileged": Bool(),
                "allowPrivilegeEscalation": Bool(),
                "readOnlyRootFilesystem": Bool(),
                "runAsNonRoot": Bool(),
                "runAsUser": Int(0, None),
                "runAsGroup": Int(0, None),
            },
            untyped=("appArmorProfile", "procMount", "seLinuxOptions", "seccompProfile"),
        ),
        "startupProbe": PROBE,
        "livenessProbe": PROBE,
        "readinessProbe": PROBE,
        "volumeMounts": Arr(
            Obj(
                {
                    "name": Str(),
                    "mountPath": Str(pattern=re.compile(r"^/")),
                    "readOnly": Bool(),
                    "subPath": Str(),
                    "subPathExpr": Str(),
                    "mountPropagation": Str(enum=("None", "HostToContainer", "Bidirectional")),
                },
                required=("name", "mountPath"),
                untyped=("recursiveReadOnly",),
            )
        ),
    },
    required=("name",),
    untyped=CONTAINER_UNTYPED,
)
HOST_PATH_TYPES = (
    "", "DirectoryOrCreate", "Directory", "FileOrCreate", "File", "Socket", "CharDevice",
    "BlockDevice",
)  # fmt: skip
ITEMS = Arr(Obj({"key": Str(), "path": Str(), "mode": Int(0, 0o777)}, ("key", "path")))
OTHER_SOURCES = (
    "awsElasticBlockStore", "azureDisk", "azureFile", "cephfs", "cinder", "csi", "downwardAPI",
    "ephemeral", "fc", "flexVolume", "flocker", "gcePersistentDisk", "gitRepo", "glusterfs",
    "image", "iscsi", "nfs", "photonPersistentDisk", "portworxVolume", "projected", "quobyte",
    "rbd", "scaleIO", "storageos", "vsphereVolume",
)  # fmt: skip
TYPED_SOURCES: dict[str, Node] = {
    "emptyDir": Obj(
        {
            "medium": Str(pattern=re.compile(r"^(|Memory|HugePages|HugePages-\d+[KMG]i)$")),
            "sizeLimit": Quantity(),
        }
    ),
    "hostPath": Obj(
        {"path": Str(pattern=re.compile(r"^/")), "type": Str(enum=HOST_PATH_TYPES)},
        required=("path",),
    ),
    "configMap": Obj(
        {"name": Str(), "items": ITEMS, "defaultMode": Int(0, 0o777), "optional": Bool()}
    ),
    "secret": Obj(
        {"secretName": Str(), "items": ITEMS, "defaultMode": Int(0, 0o777), "optional": Bool()}
    ),
    "persistentVolumeClaim": Obj({"claimName": Str(), "readOnly": Bool()}, required=("claimName",)),
}
VOLUME = Obj(
    {"name": Str(pattern=DNS1123_LABEL), **TYPED_SOURCES},
    required=("name",),
    untyped=OTHER_SOURCES,
    one_of=(*TYPED_SOURCES, *OTHER_SOURCES),
)
POD_SPEC_UNTYPED = (
    "activeDeadlineSeconds", "affinity", "automountServiceAccountToken", "dnsConfig",
    "enableServiceLinks", "ephemeralContainers", "hostAliases", "hostUsers", "hostname",
    "hostnameOverride", "imagePullSecrets", "nodeName", "os", "overhead", "preemptionPolicy",
    "priority", "readinessGates", "resourceClaims", "resources", "schedulingGates",
    "schedulingGroup", "securityContext", "serviceAccount", "setHostnameAsFQDN",
    "shareProcessNamespace", "subdomain", "topologySpreadConstraints",
)  # fmt: skip
POD_SPEC = Obj(
    {
        "containers": Arr(CONTAINER, min_items=1),
        "initContainers": Arr(CONTAINER),
        "volumes": Arr(VOLUME),
        "terminationGracePeriodSeconds": Int(0, None),
        "restartPolicy": Str(enum=("Always", "OnFailure", "Never")),
        "nodeSelector": Map(Str()),
        "tolerations": Arr(Map(Anything())),
        "hostNetwork": Bool(),
        "hostIPC": Bool(),
        "hostPID": Bool(),
        "dnsPolicy": Str(enum=("ClusterFirst", "ClusterFirstWithHostNet", "Default", "None")),
        "serviceAccountName": Str(),
        "priorityClassName": Str(),
        "runtimeClassName": Str(),
        "schedulerName": Str(),
    },
    required=("containers",),
    untyped=POD_SPEC_UNTYPED,
)
POD_TEMPLATE = Obj({"metadata": OBJECT_META, "spec": POD_SPEC}, required=("spec",))
LEADER_WORKER_TEMPLATE = Obj(
    {
        "leaderTemplate": POD_TEMPLATE,
        "workerTemplate": POD_TEMPLATE,
        "size": Int(1),  # the webhook: "size must be equal or greater than 1"
        "restartPolicy": Str(
            enum=("Default", "RecreateGroupOnPodRestart", "RecreateGroupAfterStart", "None")
        ),
        "subGroupPolicy": Obj(
            {
                "subGroupPolicyType": Str(enum=("LeaderWorker", "LeaderExcluded")),
                "subGroupSize": Int(1),
            }
        ),
    },
    required=("workerTemplate",),
    untyped=("volumeClaimTemplates", "persistentVolumeClaimRetentionPolicy"),
)
LWS_SPEC = Obj(
    {
        "replicas": Int(0, 1_000_000),
        "leaderWorkerTemplate": LEADER_WORKER_TEMPLATE,
        "rolloutStrategy": Obj(
            {
                "type": Str(enum=("RollingUpdate",)),
                "rollingUpdateConfiguration": Obj(
                    {
                        "partition": Int(0),
                        "maxUnavailable": IntOrPercent(),
                        "maxSurge": IntOrPercent(),
                    }
                ),
            },
            required=("type",),
        ),
        "startupPolicy": Str(enum=("LeaderCreated", "LeaderReady")),
        "networkConfig": Obj(
            {"subdomainPolicy": Str(enum=("Shared", "UniquePerReplica"))},
            required=("subdomainPolicy",),
        ),
    },
    required=("leaderWorkerTemplate",),
)


def _kind(api_version: str, kind: str, fields: Mapping[str, Node], name: re.Pattern[str]) -> Obj:
    meta = Obj({**OBJECT_META.fields, "name": Str(pattern=name)}, ("name",), OBJECT_META.untyped)
    return Obj(
        {"apiVersion": Str(enum=(api_version,)), "kind": Str(enum=(kind,)), "metadata": meta}
        | dict(fields),
        required=("apiVersion", "kind", "metadata", *fields),
    )


# The LWS name names the group's headless Service: DNS-1035 (the webhook's generalValidate).
LEADER_WORKER_SET = _kind(
    "leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", {"spec": LWS_SPEC}, DNS1035
)
SERVICE = _kind(
    "v1",
    "Service",
    {
        "spec": Obj(
            {
                "type": Str(enum=("ClusterIP", "NodePort", "LoadBalancer", "ExternalName")),
                "selector": Map(Str()),
                "ports": Arr(
                    Obj(
                        {
                            "name": Str(pattern=DNS1123_LABEL),
                            "port": Int(1, 65535),
                            "targetPort": Port(),
                            "protocol": Str(enum=("TCP", "UDP", "SCTP")),
                        },
                        required=("port",),
                    ),
                    min_items=1,
                ),
            },
            untyped=("clusterIP", "sessionAffinity", "externalTrafficPolicy"),
        )
    },
    DNS1035,
)
_DATA_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
CONFIG_MAP = _kind("v1", "ConfigMap", {"data": Map(Str())}, DNS1123_LABEL)
SECRET = _kind(
    "v1", "Secret", {"type": Str(), "stringData": Map(Str(pattern=re.compile(".")))}, DNS1123_LABEL
)
SCHEMAS: dict[str, Obj] = {
    "LeaderWorkerSet": LEADER_WORKER_SET,
    "Service": SERVICE,
    "ConfigMap": CONFIG_MAP,
    "Secret": SECRET,
}


def validate(document: Any) -> list[str]:
    """What is wrong with one manifest document, by its kind; [] when it is valid."""
    kind = document.get("kind") if isinstance(document, dict) else None
    schema = SCHEMAS.get(kind) if isinstance(kind, str) else None
    if schema is None:
        return [f"kind {kind!r}: not one of {', '.join(SCHEMAS)}"]
    return schema.errors(document, kind or "")


def data_keys_problems(documents: Sequence[Mapping[str, Any]]) -> list[str]:
    """ConfigMap and Secret keys must be valid file names (they become files when mounted)."""
    return [
        f"{doc['kind']} {doc['metadata']['name']}: key {key!r} is not a valid data key"
        for doc in documents
        for section in ("data", "stringData")
        for key in doc.get(section, {})
        if not _DATA_KEY.match(key)
    ]
