"""The load meters the supervisor reads (core/load_progress.py) and the simulation draws
(supervisor/testing/progress_bar.py) are the release's own: its tqdm descriptions and format."""

from __future__ import annotations

import ast
from pathlib import Path

from supervisor.core.load_progress import Phase, read_meter
from supervisor.testing.progress_bar import BAR_FORMAT, DESC
from tests.contract.conftest import source_of


def _calls(path: Path, name: str) -> list[ast.Call]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and (getattr(node.func, "id", None) == name or getattr(node.func, "attr", None) == name)
    ]


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def test_the_weight_shards_meter_is_the_one_read_and_drawn(version: str):
    root = source_of(version)
    common = ast.parse((root / "srt" / "utils" / "common.py").read_text(encoding="utf-8"))
    formats = [
        node.value.value
        for node in common.body
        if isinstance(node, ast.Assign)
        and any(getattr(t, "id", None) == "BAR_FORMAT" for t in node.targets)
        and isinstance(node.value, ast.Constant)
    ]
    assert formats == [BAR_FORMAT]
    loader = root / "srt" / "model_loader" / "weight_utils.py"
    meters = [
        call
        for call in _calls(loader, "tqdm")
        if isinstance(desc := _keyword(call, "desc"), ast.Constant) and desc.value == DESC
    ]
    assert meters, f"SGLang {version}: no tqdm(desc={DESC!r}) in {loader}"
    for call in meters:
        bar_format = _keyword(call, "bar_format")
        assert isinstance(bar_format, ast.Name)
        assert bar_format.id == "BAR_FORMAT"
    drawn = BAR_FORMAT.format(
        desc=DESC,
        percentage=45.0,
        n_fmt="27",
        total_fmt="60",
        elapsed="00:31",
        remaining="00:38",
        rate_fmt=" 1.16s/it",
    )
    meter = read_meter(drawn)
    assert meter is not None
    assert (meter.phase, meter.done, meter.total, meter.remaining_s) == (
        Phase.WEIGHTS,
        27,
        60,
        38.0,
    )


def test_the_graph_capture_meter_is_tqdms_default_with_capturing_in_its_description(
    version: str,
):
    runner = source_of(version) / "srt" / "model_executor"
    found = []
    for path in runner.rglob("*cuda_graph_runner.py"):
        for call in _calls(path, "set_description"):
            text = call.args[0] if call.args else None
            if isinstance(text, ast.JoinedStr) and isinstance(text.values[0], ast.Constant):
                found.append(str(text.values[0].value))
    assert any(prefix.startswith("Capturing batches (") for prefix in found), found
    # tqdm's default bar: "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [...]"
    meter = read_meter(
        "Capturing batches (bs=8 avail_mem=10.30 GB):  40%|████  | 21/52 [00:03<00:04]"
    )
    assert meter is not None
    assert meter.phase is Phase.CUDA_GRAPHS
