"""The model as the pre-flight plans it: its config, its KV geometry on one rank (one pool, or a
hybrid model's pools), and the report's list of pools.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

from supervisor.adapters.model_config import ModelInfo, load_model_config
from supervisor.config import SupervisorConfig
from supervisor.core import hybrid_geometry, model_geometry
from supervisor.core.assess import HostAssessment
from supervisor.core.checks import Check, Status
from supervisor.core.hybrid_geometry import HybridLayout
from supervisor.core.pools import one_pool
from supervisor.core.sglang_args import LaunchPlan
from supervisor.errors import ConfigError
from supervisor.preflight.inputs import resolve_relative


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Model:
    """The model's KV geometry on one rank."""

    info: ModelInfo
    bytes_per_token: int
    indexer_bytes_per_token: int
    layers: int
    kv_dtype: str
    layout: HybridLayout | None = None  # a hybrid model's pools (core/hybrid_geometry.py)


def read_model(
    config: SupervisorConfig, plan: LaunchPlan, config_dir: Path | None, env: Mapping[str, str]
) -> Model:
    """The model's config and its KV geometry on one rank (bad keys: ConfigError, exit 2)."""
    override = resolve_relative(config.server.model_config, config_dir)
    info = load_model_config(plan.model_path or "", override)
    try:
        problem = model_geometry.shape_problem(info.config)
        if problem is not None:
            raise model_geometry.GeometryError(problem)
        model = Model(
            info=info,
            bytes_per_token=model_geometry.bytes_per_token_per_rank(info.config, plan),
            indexer_bytes_per_token=model_geometry.indexer_bytes_per_token_per_rank(
                info.config, plan
            ),
            layers=model_geometry.layers_per_rank(info.config, plan),
            kv_dtype=model_geometry.kv_cache_dtype(info.config, plan),
        )
        layout = hybrid_geometry.hybrid_layout(info.config, plan, env)
    except model_geometry.GeometryError as exc:
        raise ConfigError(f"model config {info.config_file}: {exc}") from None
    if layout is None:
        return model
    # The report's cell is the full pool's row; the other pools are listed beside it.
    return dataclasses.replace(
        model,
        bytes_per_token=layout.full_row_bytes,
        layers=layout.full_layers + layout.swa_layers,
        layout=layout,
    )


def split_checks(model: Model, plan: LaunchPlan) -> list[Check]:
    """A TP that SGLang cannot split the attention heads over: a property of argv and model, so
    a failed check (`run` refuses it, exit 1), not bad input: each is valid on its own."""
    problem = model_geometry.tp_split_problem(model.info.config, plan)
    if problem is None and model.layout is not None:
        problem = hybrid_geometry.mamba_split_problem(model.info.config, plan)
    if problem is None:
        return []
    detail = f"{problem}: SGLang stops at load when it splits the attention layers over TP"
    return [Check("attention_heads", Status.FAIL, detail)]


def report_pools(
    plan: LaunchPlan, model: Model, device_tokens: int | None, host: HostAssessment
) -> tuple[dict[str, object], ...]:
    """Each pool of a rank for the report: a hybrid model's as sized, else the one KV pool."""
    pooled = host.pools or one_pool(
        cell_bytes=model.bytes_per_token,
        indexer_bytes=model.indexer_bytes_per_token,
        device_tokens=device_tokens,
        host_tokens=None if host.mode == "off" else host.pool_tokens,
        page=plan.effective_page_size,
    )
    return tuple(p.to_json() for p in pooled)
