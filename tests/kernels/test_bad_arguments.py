"""Wrong arguments to the C++ kernels raise RuntimeError, never read or write outside their
tensors (a segfault or heap corruption would take the engine down): the metadata a runner bug
could produce (query_start_loc beyond the rows, seq_len shorter than a request's query rows, LoRA
indices out of range, cos/sin of the wrong length), tensors on another device, wrong ranks. The
cases run in a child process, so a crash fails this test instead of ending the test run."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kvserve.kernels import cpu_kernels_available

pytestmark = pytest.mark.skipif(not cpu_kernels_available(), reason="no C++ compiler for the kernels")

CASES = r'''
import torch
from kvserve.kernels import cpu_kernels
k = cpu_kernels()
i32, i64 = torch.int32, torch.int64

def attn(T=2, qsl=None, lens=None, qshape=None, cshape=None):
    q = torch.randn(qshape or (T, 2, 16))
    kv = torch.randn(cshape or (2, 4, 16, 2, 16))
    k.paged_attention(torch.zeros_like(q), q, kv, torch.tensor([[0]], dtype=i32), torch.tensor(lens or [T], dtype=i32),
                      torch.tensor(qsl or [0, T], dtype=i32), 0.25, 0, 16)

def lora(order=None, seg_starts=(0, 4), seg_slots=(0,), shard_offsets=(0, 8)):
    x, y, a, b = torch.randn(4, 8), torch.zeros(4, 8), torch.randn(2, 8, 2), torch.randn(2, 2, 8)
    k.lora_apply(x, y, a, b, torch.tensor(order or [0, 1, 2, 3]), torch.tensor(seg_starts), torch.tensor(seg_slots),
                 torch.tensor(shard_offsets), 2)

def decoder(cos_rows=3, qsl=None, lens=None):
    from kvserve.kernels.ops_decoder import LinearPart
    def part(n, kk):
        return LinearPart(kind=0, packed=k.pack_linear_weight(torch.randn(n, kk)), scales=None, neg_offsets=None,
                          bias=None, input_perm=None, in_features=kk, out_features=n, group_size=0, bits=0)
    stack = k.DecoderStack(num_heads=2, num_kv_heads=1, head_dim=16, eps=1e-6, scale=0.25, mlp_tile_rows=512,
                           max_kernel_query_len=1 << 30, final_norm=torch.ones(32))
    stack.add_layer(window=0, input_norm=torch.ones(32), post_norm=torch.ones(32), q_norm=None, k_norm=None,
                    qkv=[part(64, 32)], o=[part(32, 32)], gate_up=[part(64, 32)], down=[part(32, 32)])
    T = 3
    cos = torch.ones(cos_rows, 16)
    stack.forward(torch.randn(T, 32), cos, cos.clone(), [torch.zeros(2, 4, 16, 1, 16)],
                  torch.tensor([[0, 1, 2, 3]], dtype=i32), torch.tensor(lens or [T], dtype=i32),
                  torch.tensor(qsl or [0, T], dtype=i32), torch.arange(T))

meta = torch.empty(4, 64, device="meta")
CASES = {
    "query_start_loc beyond the rows": lambda: attn(qsl=[1000000, 1000001], lens=[1]),
    "a request past the last row": lambda: attn(qsl=[0, 16], lens=[16]),
    "negative query_start_loc": lambda: attn(qsl=[-1000000, -999999], lens=[1]),
    "seq_len under the query rows": lambda: attn(qsl=[0, 2], lens=[1]),
    "decreasing query_start_loc": lambda: attn(qsl=[2, 0], lens=[1]),
    "a 2-D query": lambda: attn(qshape=(2, 32)),
    "a 4-D cache": lambda: attn(cshape=(2, 4, 16, 32)),
    "lora token out of range": lambda: lora(order=[0, 1, 2, 100000]),
    "lora slot out of range": lambda: lora(seg_slots=(99,)),
    "lora segment past order": lambda: lora(seg_starts=(0, 100000)),
    "lora shard past N": lambda: lora(shard_offsets=(0, 100000)),
    "decoder cos of one row": lambda: decoder(cos_rows=1),
    "decoder cos of no row": lambda: decoder(cos_rows=0),
    "decoder query_start_loc beyond": lambda: decoder(qsl=[0, 13], lens=[13]),
    "argmax of a meta tensor": lambda: k.argmax_rows(meta),
    "rms_norm of a meta tensor": lambda: k.rms_norm(meta, torch.ones(64), None, 1e-6),
    "rms_norm of a meta weight": lambda: k.rms_norm(torch.randn(4, 64), torch.empty(64, device="meta"), None, 1e-6),
    "silu_and_mul of a meta tensor": lambda: k.silu_and_mul(meta),
    "bitmask on meta logits": lambda: k.apply_token_bitmask(meta.float(), torch.zeros(4, 2, dtype=i32),
                                                            torch.tensor([0])),
}
for name, run in CASES.items():
    try:
        run()
    except RuntimeError as error:
        print("refused:", name, "|", str(error)[:100], flush=True)
    else:
        print("ACCEPTED:", name, flush=True)
print("all cases ran")
'''


def test_bad_arguments_raise_instead_of_crashing():
    result = subprocess.run([sys.executable, "-c", CASES], capture_output=True, text=True, timeout=300)
    lines = result.stdout.splitlines()
    assert result.returncode == 0 and lines[-1] == "all cases ran", result.stdout[-2000:] + result.stderr[-2000:]
    accepted = [line for line in lines if line.startswith("ACCEPTED")]
    assert not accepted, accepted
    assert sum(line.startswith("refused:") for line in lines) == 19
