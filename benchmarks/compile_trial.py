"""Does compiling an int4 decode step pay on this CPU? Eager vs torch.compile (inductor).

One-token passes over the default target's 30 int4 layers (its own Q4_1 blocks), context 100,
with the layer written out flat: the int4 matmul wrapped as an opaque custom op so inductor
calls the same kernel, the rest (norms, rotary, cache writes, row-invariant attention) left to
inductor to fuse. Modes: per-layer graph (static shapes, one graph called 30 times) and, with
--whole, the 30-layer pass as one graph (slow to compile). Prints ms per pass for each.

    python benchmarks/compile_trial.py [--whole] [--cpp-wrapper]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

import quickdraft
from quickdraft.backends.select import make_backend
from quickdraft.models.native_weights import rms_norm
from quickdraft.models.rotary import rotate

CONTEXT, BUCKET, BLOCK = 100, 256, 16


@torch.library.custom_op("quickdraft_trial::int4_mm", mutates_args=())
def int4_mm(x: torch.Tensor, packed: torch.Tensor, group: int, scales_and_zeros: torch.Tensor) -> torch.Tensor:
    return torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, group, scales_and_zeros)


@int4_mm.register_fake
def _(x, packed, group, scales_and_zeros):
    return x.new_empty(x.shape[0], packed.shape[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--whole", action="store_true", help="also compile the whole pass as one graph")
    parser.add_argument("--cpp-wrapper", action="store_true", help="inductor's C++ wrapper")
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    if args.cpp_wrapper:
        import torch._inductor.config as inductor_config

        inductor_config.cpp_wrapper = True
    torch.set_num_threads(2)
    decoder = quickdraft.load(method="none")
    w = make_backend(decoder.target, "native", precision="int4").weights
    heads, kv_heads, dim, group = w.heads, w.kv_heads, w.head_dim, w.heads // w.kv_heads
    keys = torch.zeros(len(w.layers), kv_heads, BUCKET, dim)  # [layers, KV, L, D]
    values = torch.ones(len(w.layers), kv_heads, BUCKET, dim + 1)
    layers = [
        (
            layer.input_norm,
            layer.qkv.packed,
            layer.qkv.scales_and_zeros,
            layer.o.packed,
            layer.o.scales_and_zeros,
            layer.post_norm,
            layer.gate_up.packed,
            layer.gate_up.scales_and_zeros,
            layer.down.packed,
            layer.down.scales_and_zeros,
        )
        for layer in w.layers
    ]
    hidden = (torch.arange(BUCKET) > CONTEXT)[:, None, None]  # [L, 1, 1]: keys after the token are masked

    def layer(x, cos, sin, k_cache, v_cache, n1, qkv, qkvs, o, os_, n2, gu, gus, dn, dns):
        h = int4_mm(rms_norm(x, n1, w.eps), qkv, 32, qkvs)  # [1, (H + 2 KV) D]
        qk = rotate(h[:, : (heads + kv_heads) * dim].view(1, heads + kv_heads, dim).transpose(0, 1), cos, sin)
        k_cache[:, CONTEXT : CONTEXT + 1] = qk[heads:]
        v = h[:, (heads + kv_heads) * dim :].view(1, kv_heads, dim).transpose(0, 1)  # [KV, 1, D]
        v_cache[:, CONTEXT : CONTEXT + 1, :dim] = v
        columns = F.pad(qk[:heads].float().reshape(kv_heads, group, dim).transpose(1, 2), (0, BLOCK - group))
        scores = torch.matmul(k_cache, columns)[..., :group].view(kv_heads, BUCKET, group, 1)
        scores = scores.mul(dim**-0.5).masked_fill(hidden, float("-inf"))
        weights = F.pad(
            torch.exp(scores - scores.amax(dim=1, keepdim=True)).view(kv_heads, BUCKET, group), (0, BLOCK - group)
        )
        summed = torch.matmul(v_cache.transpose(1, 2), weights)[..., :group]
        attn = (summed[:, :dim] / summed[:, dim:]).permute(0, 2, 1).reshape(1, heads * dim).to(x.dtype)
        x = x + int4_mm(attn, o, 32, os_)
        gate, up = int4_mm(rms_norm(x, n2, w.eps), gu, 32, gus).chunk(2, -1)
        return x + int4_mm(F.silu(gate) * up, dn, 32, dns)

    def whole(x, cos, sin):
        for i, weights in enumerate(layers):
            x = layer(x, cos, sin, keys[i], values[i], *weights)
        return x

    x = torch.randn(1, w.embed.shape[1]).bfloat16()
    cos, sin = torch.randn(1, dim).bfloat16(), torch.randn(1, dim).bfloat16()
    compiled_layer = torch.compile(layer, dynamic=False)
    modes = {
        "eager": lambda: [layer(x, cos, sin, keys[i], values[i], *p) for i, p in enumerate(layers)],
        "compiled per layer": lambda: [
            compiled_layer(x, cos, sin, keys[i], values[i], *p) for i, p in enumerate(layers)
        ],
    }
    if args.whole:
        compiled_whole = torch.compile(whole, dynamic=False)
        modes["compiled whole pass"] = lambda: compiled_whole(x, cos, sin)
    with torch.inference_mode():
        for name, run in modes.items():
            start = time.time()
            run()
            warm = time.time() - start
            start = time.perf_counter()
            for _ in range(args.repeats):
                run()
            print(
                f"{name}: {(time.perf_counter() - start) / args.repeats * 1e3:.2f} ms per pass "
                f"(first call {warm:.1f} s)",
                flush=True,
            )


if __name__ == "__main__":
    main()
