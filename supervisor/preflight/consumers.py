"""SGLang's opt-in host consumers for the pre-flight: the facts they are sized from (the
checkpoint's tensors, the file backend's filesystem, the server's environment), core's
arithmetic (core/host_consumers.py, core/storage_consumers.py), bad values as ConfigError.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from supervisor.adapters.host import HostProbe
from supervisor.core import model_geometry, offload
from supervisor.core.checks import Check
from supervisor.core.host_consumers import (
    Consumer,
    ConsumerError,
    ConsumerFacts,
    StorageDir,
    cpu_offload,
    feature_consumers,
)
from supervisor.core.hybrid_geometry import HybridLayout
from supervisor.core.sglang_args import LaunchPlan
from supervisor.core.storage_consumers import file_backend_dir, storage_consumers
from supervisor.errors import ConfigError


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class HostConsumers:
    """What the launch takes on the host beside its KV pools and runtime overheads."""

    counted: tuple[Consumer, ...]
    cpu_offload_bytes_per_rank: int  # --cpu-offload-gb, pinned (its own line of the budget)
    checks: tuple[Check, ...]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ModelFacts:
    """The model and device pool as the pre-flight sized them."""

    config: Mapping[str, Any]
    tensor_bytes: Mapping[str, int] | None
    bytes_per_token: int
    indexer_bytes_per_token: int
    weights_per_rank_bytes: int | None
    device_tokens: int | None
    layout: HybridLayout | None = None  # a hybrid model's pools


def _int(config: Mapping[str, Any], *keys: str) -> int | None:
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _storage_dir(
    plan: LaunchPlan, env: Mapping[str, str], probe: HostProbe, planning: bool
) -> StorageDir | None:
    """The file backend's directory on this host; None when planning another box."""
    if planning or not plan.uses_hicache or plan.hicache_storage_backend != "file":
        return None
    return probe.read_filesystem(file_backend_dir(plan, env))


def consumer_facts(
    plan: LaunchPlan,
    model: ModelFacts,
    env: Mapping[str, str],
    *,
    main_overhead_bytes: int,
    storage_dir: StorageDir | None,
) -> ConsumerFacts:
    """Core's inputs: the rank's parameters from the safetensors headers when they were read."""
    num_layers = _int(model.config, "num_hidden_layers") or 0
    layers = None
    if model.tensor_bytes:
        layers = offload.rank_layer_blocks(
            model.tensor_bytes, tp_size=plan.tp_size, pp_size=plan.pp_size, num_layers=num_layers
        )
    return ConsumerFacts(
        env=env,
        weights_per_rank_bytes=model.weights_per_rank_bytes,
        device_tokens=model.device_tokens,
        bytes_per_token=model.bytes_per_token,
        indexer_bytes_per_token=model.indexer_bytes_per_token,
        rank_replicated_kv=model_geometry.is_mla(model.config),
        main_overhead_bytes=main_overhead_bytes,
        layers=layers,
        stage_layer_count=offload.stage_layers(num_layers, plan.pp_size),
        routed_experts=_int(model.config, "n_routed_experts", "num_experts", "num_local_experts"),
        storage_dir=storage_dir,
        layout=model.layout,
    )


def host_consumers(
    plan: LaunchPlan,
    model: ModelFacts,
    env: Mapping[str, str],
    *,
    probe: HostProbe,
    planning: bool,
    main_overhead_bytes: int,
) -> HostConsumers:
    """Every opt-in consumer of the argv, counted or warned about.

    Raises:
        ConfigError: a size in the server's environment or the argv that SGLang would refuse
            or silently ignore (exit 2, the variable or flag named).
    """
    facts = consumer_facts(
        plan,
        model,
        env,
        main_overhead_bytes=main_overhead_bytes,
        storage_dir=_storage_dir(plan, env, probe, planning),
    )
    try:
        features = feature_consumers(plan, facts)
        storage = storage_consumers(plan, facts)
    except ConsumerError as exc:
        raise ConfigError(f"the server's environment or arguments: {exc}") from None
    offloaded, offload_check = cpu_offload(plan, facts)
    checks = [*features.checks, *storage.checks, *([offload_check] if offload_check else [])]
    return HostConsumers(
        counted=(*features.counted, *storage.counted),
        cpu_offload_bytes_per_rank=offloaded,
        checks=tuple(checks),
    )
