"""Find and read a model's config.json: a local directory or the local HF cache, no network.

Merges a multimodal wrapper's `text_config` into the top level, folds `hf_quant_config.json` into
`quantization_config`, and sums the `*.safetensors` sizes. Never imports transformers or sglang.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from supervisor.atomic_file import NotRegularFile, open_regular
from supervisor.core.bounded import TooDeep, parse_json, shown
from supervisor.errors import ConfigError

_MAX_JSON_BYTES = 16 << 20  # a config.json is kilobytes; anything this large is not one


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelInfo:
    """What the pre-flight needs from a model: its language-model keys and the weight size."""

    path: str  # the model directory, or the override file when the model is not on this host
    config: dict[str, Any]  # language-model keys (text_config merged), quantization folded in
    config_file: str  # the config.json actually read
    weights_bytes: int | None  # total *.safetensors size; None when no shard is on this host
    largest_shard_bytes: int | None = None  # the biggest *.safetensors file (load buffers)
    # Bytes of each tensor, from the shards' headers (None: no readable shard on this host).
    tensor_bytes: Mapping[str, int] | None = None
    # Why the shards' headers gave no tensor list (a damaged one, named), or None.
    shard_problem: str | None = None
    model_dir: str | None  # None: the model itself is not on this host (planning another box)


def hf_cache_dirs(env: Mapping[str, str] | None = None) -> tuple[Path, ...]:
    """Where huggingface_hub keeps models: $HF_HUB_CACHE, $HF_HOME/hub, ~/.cache/huggingface/hub."""
    env = os.environ if env is None else env
    dirs: list[Path] = []
    if env.get("HF_HUB_CACHE"):
        dirs.append(Path(env["HF_HUB_CACHE"]))
    if env.get("HUGGINGFACE_HUB_CACHE"):
        dirs.append(Path(env["HUGGINGFACE_HUB_CACHE"]))
    if env.get("HF_HOME"):
        dirs.append(Path(env["HF_HOME"]) / "hub")
    home = env.get("HOME")
    base = Path(home) if home else Path.home()
    dirs.append(base / ".cache" / "huggingface" / "hub")
    return tuple(dirs)


def _snapshot_in_cache(repo_id: str, cache_dirs: tuple[Path, ...]) -> Path | None:
    """The snapshot directory of `org/name` in a local HF cache (refs/main first, else newest)."""
    folder = "models--" + repo_id.replace("/", "--")
    for cache in cache_dirs:
        repo = cache / folder
        snapshots = repo / "snapshots"
        if not snapshots.is_dir():
            continue
        try:
            with open_regular(repo / "refs" / "main") as fh:
                revision = fh.read(256).decode("utf-8").strip()
        except (OSError, UnicodeDecodeError):
            revision = ""
        if revision and not _is_snapshot_name(revision):
            raise ConfigError(
                f"Hugging Face cache ref {repo / 'refs' / 'main'} names {shown(revision)}, not a "
                f"snapshot of {snapshots} (a commit hash): the cache is damaged; delete the ref "
                "or download the model again"
            )
        if revision and (snapshots / revision).is_dir():
            return snapshots / revision
        candidates = sorted(
            (p for p in snapshots.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime
        )
        if candidates:
            return candidates[-1]
    return None


def _is_snapshot_name(revision: str) -> bool:
    """One name inside snapshots/ (huggingface_hub writes a commit hash): no separator, no
    '..', so that the ref cannot lead out of the cache."""
    return not any(c in revision for c in "/\\\0") and revision.strip(".") != ""


def resolve_model_dir(model_path: str, env: Mapping[str, str] | None = None) -> Path | None:
    """A local directory for `--model-path`: the path itself, or its snapshot in the HF cache."""
    path = Path(model_path).expanduser()
    if path.is_dir():
        return path
    if model_path.count("/") == 1 and not model_path.startswith((".", "/", "~")):
        return _snapshot_in_cache(model_path, hf_cache_dirs(env))
    return None


def _read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        with open_regular(path) as fh:
            raw = fh.read(_MAX_JSON_BYTES + 1)
        text = raw.decode("utf-8")
    except NotRegularFile as exc:
        raise ConfigError(f"{what} {path} is {exc}") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {_why(exc)}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{what} {path} is not UTF-8 text: {exc.reason}") from None
    if len(raw) > _MAX_JSON_BYTES:
        raise ConfigError(f"{what} {path} is larger than 16 MiB: not a model's config")
    try:
        data = parse_json(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{what} {path} is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
        ) from None
    except TooDeep as exc:
        raise ConfigError(f"{what} {path} is not a model's config: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{what} {path} must hold a JSON object, got {type(data).__name__}")
    return data


def _why(exc: OSError) -> str:
    """An OSError for a message: a symlink loop by that name (ELOOP's text is obscure)."""
    if exc.errno == errno.ELOOP:
        return "it is a symlink loop (or too many levels of symlinks)"
    return exc.strerror or str(exc)


def _exists(path: Path, what: str) -> bool:
    """Whether `path` is there: False only for "no such file"; anything else that stops the
    lookup (a symlink loop, a permission) is refused by name, not taken for "missing".

    Raises:
        ConfigError: the path cannot be looked up (names it and why).
    """
    try:
        path.stat()
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {_why(exc)}") from None
    except ValueError:  # a NUL in the path (from a YAML --config, say)
        raise ConfigError(f"{what} {shown(str(path))} is not a path: it holds a NUL") from None
    return True


def merge_language_config(raw: Mapping[str, Any]) -> dict[str, Any]:
    """Top-level keys overlaid with `text_config` (multimodal wrappers such as Kimi-K2.5)."""
    merged = {k: v for k, v in raw.items() if k != "text_config"}
    text = raw.get("text_config")
    if isinstance(text, Mapping):
        merged.update(text)
    return merged


def _fold_hf_quant(config: dict[str, Any], hf_quant: Mapping[str, Any]) -> None:
    """ModelOpt checkpoints declare FP8 KV in hf_quant_config.json under `quantization`."""
    section = hf_quant.get("quantization", hf_quant)
    if not isinstance(section, Mapping):
        return
    algo = section.get("kv_cache_quant_algo")
    quant = dict(config.get("quantization_config") or {})  # a mapping: checked by the caller
    if algo is not None and "kv_cache_quant_algo" not in quant:
        quant["kv_cache_quant_algo"] = algo
    if section.get("quant_algo") is not None and "quant_algo" not in quant:
        quant["quant_algo"] = section["quant_algo"]
    config["quantization_config"] = quant


def safetensors_sizes(model_dir: Path) -> tuple[int, ...]:
    """Sizes of the `*.safetensors` shards (following HF cache symlinks)."""
    sizes: list[int] = []
    for shard in model_dir.glob("*.safetensors"):
        try:
            sizes.append(shard.stat().st_size)
        except OSError:
            continue
    return tuple(sizes)


_MAX_HEADER_BYTES = 100 * 1024 * 1024  # safetensors' own limit on the JSON header


def _header_tensors(shard: Path) -> dict[str, int]:
    """{tensor name: bytes} from one shard's header: 8-byte little-endian length, then JSON.

    Every value is checked before any arithmetic: the header is the checkpoint's, and a list
    where an object belongs or `"data_offsets": [0, 1e400]` (a float overflow) must not end a
    pre-flight.

    Raises:
        OSError: unreadable. ValueError: not a safetensors header (what is wrong, named).
    """
    with open_regular(shard) as fh:
        length = int.from_bytes(fh.read(8), "little")
        if not 0 < length <= _MAX_HEADER_BYTES:
            raise ValueError(f"header length {length} is not 1 byte to 100 MiB")
        header = parse_json(fh.read(length))
    if not isinstance(header, dict):
        raise ValueError(f"the header is a JSON {type(header).__name__}, not an object")
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (
            isinstance(offsets, list)
            and len(offsets) == 2
            and all(isinstance(x, int) and not isinstance(x, bool) for x in offsets)
            and 0 <= offsets[0] <= offsets[1]
        ):
            raise ValueError(f"tensor {shown(name)} has no data_offsets [start, end] of integers")
        out[name] = offsets[1] - offsets[0]
    return out


def tensor_sizes(model_dir: Path) -> tuple[dict[str, int] | None, str | None]:
    """Every tensor's size over the `*.safetensors` shards, and why there is none: None if any
    header is unreadable (a partial list would under-count what is replicated), with the shard
    and its problem named."""
    sizes: dict[str, int] = {}
    shards = sorted(model_dir.glob("*.safetensors"))
    for shard in shards:
        try:
            sizes.update(_header_tensors(shard))
        except OSError as exc:
            return None, f"shard {shard} is unreadable: {_why(exc)}"
        except ValueError as exc:  # JSONDecodeError and TooDeep are ValueErrors
            return None, f"shard {shard} has a damaged header: {exc}"
    return sizes or None, None


def load_model_config(
    model_path: str, override: str | None = None, *, env: Mapping[str, str] | None = None
) -> ModelInfo:
    """Read the model's config: `override` (a config.json or a directory holding one) wins.

    Raises:
        ConfigError: the model is neither a local directory nor in the local HF cache (and no
            override is given), or a config file is unreadable or malformed (names the file).
    """
    try:
        model_dir = resolve_model_dir(model_path, env) if model_path else None
    except OSError as exc:  # a cache folder name past NAME_MAX, a loop in the cache
        raise ConfigError(f"cannot look up model path {shown(model_path)}: {_why(exc)}") from None
    if override is not None:
        config_file = Path(override).expanduser()
        if config_file.is_dir():
            config_file = config_file / "config.json"
        if not _exists(config_file, "model config override"):
            raise ConfigError(
                f"model config override {config_file} does not exist ([server] model_config "
                "or --model-config)"
            )
    elif model_dir is None:
        raise ConfigError(
            f"model path {model_path!r} is neither a local directory nor in the local Hugging "
            "Face cache (the pre-flight never downloads); download it first, or give its "
            "config.json as --model-config PATH or [server] model_config in the config file"
        )
    else:
        config_file = model_dir / "config.json"
        if not _exists(config_file, "model config"):
            raise ConfigError(f"model directory {model_dir} has no config.json")
    config = _language_config(config_file, model_dir)
    shards = safetensors_sizes(model_dir) if model_dir is not None else ()
    tensors, shard_problem = (None, None)
    if shards and model_dir is not None:
        tensors, shard_problem = tensor_sizes(model_dir)
    return ModelInfo(
        path=str(model_dir if model_dir is not None else config_file),
        config=config,
        config_file=str(config_file),
        weights_bytes=sum(shards) if shards else None,
        largest_shard_bytes=max(shards) if shards else None,
        tensor_bytes=tensors,
        shard_problem=shard_problem,
        model_dir=str(model_dir) if model_dir is not None else None,
    )


def _language_config(config_file: Path, model_dir: Path | None) -> dict[str, Any]:
    """config.json's language-model keys with hf_quant_config.json folded in (beside the
    config, else in the model directory).

    Raises:
        ConfigError: a file unreadable or malformed, or a quantization_config that is not an
            object (SGLang reads it as a mapping and stops at load).
    """
    config = merge_language_config(_read_json(config_file, "model config"))
    quant = config.get("quantization_config")
    if quant is not None and not isinstance(quant, Mapping):
        raise ConfigError(
            f"model config {config_file}: quantization_config must be a JSON object, got "
            f"{type(quant).__name__} {shown(quant)} (SGLang reads it as a mapping)"
        )
    hf_quant_file = config_file.parent / "hf_quant_config.json"
    if not _exists(hf_quant_file, "quantization config") and model_dir is not None:
        hf_quant_file = model_dir / "hf_quant_config.json"
    if _exists(hf_quant_file, "quantization config"):
        _fold_hf_quant(config, _read_json(hf_quant_file, "quantization config"))
    return config
