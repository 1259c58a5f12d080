"""The stand-in for sgl-kernel's CPU names (scripts/real_sglang/sgl_kernel_standin), run in the
lane's venv: the one function plain serving calls writes what SGLang's triton kernel writes,
and every other name says it is not implemented, naming itself."""

from __future__ import annotations

import subprocess

from tests.real_sglang.lane import LANE, LANE_MARKS, LANE_PYTHON

pytestmark = LANE_MARKS

CHECK = """
import torch, sgl_kernel
table = torch.zeros((4, 10), dtype=torch.int32)
rows = torch.tensor([2, 0, 3])
start = torch.tensor([1, 0, 5])
end = torch.tensor([4, 0, 7])  # request 2 of 3 adds nothing
locs = torch.tensor([11, 12, 13, 21, 22], dtype=torch.int64)
sgl_kernel.assign_req_to_token_pool_cpu(rows, table, start, end, locs, table.shape[1])
assert table[2, 1:4].tolist() == [11, 12, 13], table
assert table[3, 5:7].tolist() == [21, 22], table
assert int(table.sum()) == 11 + 12 + 13 + 21 + 22, table
try:
    sgl_kernel.verify_tree_greedy_cpu()
except NotImplementedError as exc:
    assert "verify_tree_greedy_cpu" in str(exc), exc
else:
    raise AssertionError("no NotImplementedError")
assert not hasattr(torch.ops.sgl_kernel, "convert_weight_packed")
print("ok")
"""


def test_the_stand_in_writes_the_token_table_as_sglang_s_kernel_does():
    done = subprocess.run(
        [str(LANE_PYTHON), "-c", CHECK],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=LANE,
        check=False,
    )
    assert (done.returncode, done.stdout.strip()) == (0, "ok"), done.stderr[-2000:]
