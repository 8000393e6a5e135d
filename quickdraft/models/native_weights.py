"""Llama-family models (Llama, SmolLM, Mistral, Qwen2) in plain PyTorch: the weights of the native
backend (quickdraft/backends/native.py runs the passes; models/row_attention.py holds the
attention below fp32).

Why: a transformers forward spends much of a small model's decode step in Python and
bookkeeping. Here each layer is a handful of fused operations over weights read once from
a weight source (a GGUF file, safetensors, a transformers model); the KV cache
(backends/kv_cache.py) is preallocated and indexed by a length pointer, so a rollback is free
and a token tree needs only an explicit mask and positions.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch
from tqdm import tqdm
from transformers import PretrainedConfig, PreTrainedModel

from quickdraft.errors import QuickdraftError
from quickdraft.models.linear import ColumnLinear, PackedLinear, RowLinear
from quickdraft.models.precision import Precision, get_precision
from quickdraft.models.quantize import stack_int4
from quickdraft.models.quantized_linear import Int4Linear, Int8Linear, fused_quantized_linear, int4_fits
from quickdraft.models.row_attention import RowGroup
from quickdraft.models.weights import (
    EMBED,
    LM_HEAD,
    ModuleWeights,
    WeightSource,
    fused,
    give_back_freed_memory,
    rotary_embedding,
    stored_name,
)

Linear = PackedLinear | ColumnLinear | RowLinear | Int8Linear | Int4Linear

SUPPORTED_ARCHITECTURES = ("llama", "mistral", "qwen2", "gemma3_text")
GEMMA3 = "gemma3_text"  # Gemma 3: (1 + w) norms, q/k norms, norms after attention and MLP, a scaled
# embedding, GELU, sliding-window layers with their own rotary base; fp32 only for now (below fp32
# the native backend's row-invariant attention has no windows yet)


@dataclass
class LayerWeights:
    input_norm: torch.Tensor  # [hidden]
    qkv: Linear  # [(heads + 2 * kv_heads) * head_dim, hidden]: q, k, v fused (+ Qwen2's biases)
    o: Linear  # [hidden, heads * head_dim]
    post_norm: torch.Tensor  # [hidden]: the norm before the MLP
    gate_up: Linear  # [2 * intermediate, hidden]: gate and up projections fused
    down: Linear  # [hidden, intermediate]
    # Gemma 3 (None elsewhere): norms of q and k per head [head_dim], of the attention's and the
    # MLP's outputs [hidden]; the window of a sliding-attention layer; which rotary table it uses.
    q_norm: torch.Tensor | None = None
    k_norm: torch.Tensor | None = None
    attn_out_norm: torch.Tensor | None = None
    mlp_out_norm: torch.Tensor | None = None
    window: int | None = None
    rotary: int = 0  # index into NativeWeights.inv_freqs


@dataclass
class NativeWeights:
    """Everything a forward needs, read once from a weight source (models/weights.py); shared by backends."""

    embed: torch.Tensor  # [V, hidden]
    layers: list[LayerWeights]
    norm: torch.Tensor  # [hidden]
    lm_head: Linear  # [V, hidden]
    inv_freq: torch.Tensor  # [head_dim / 2] rotary frequencies (any HF rope scaling already applied)
    rope_scale: float  # HF's attention_scaling of cos and sin
    eps: float
    heads: int
    kv_heads: int
    head_dim: int
    max_length: int
    dtype: torch.dtype  # of activations, norms and the KV cache
    precision: str = "fp32"
    embed_scale: float = 1.0  # Gemma 3 multiplies embeddings by sqrt(hidden)
    activation: str = "silu"  # or "gelu_tanh" (Gemma 3)
    attn_scale: float | None = None  # softmax scale (None: head_dim ** -0.5)
    inv_freqs: list[torch.Tensor] | None = None  # more rotary schedules (Gemma 3's local layers): index 1, ...

    @property
    def device(self) -> torch.device:
        return self.embed.device

    @classmethod
    def from_model(
        cls,
        model: PreTrainedModel,
        precision: str | Precision = "fp32",
        pack: bool = True,
        device: torch.device | str = "cpu",
        dense_kernel: str = "bf16",
    ) -> NativeWeights:
        """from_source over a loaded transformers model's parameters."""
        return cls.from_source(model.config, ModuleWeights(model), precision, pack, device, dense_kernel)

    @classmethod
    def from_source(
        cls,
        config: PretrainedConfig,
        source: WeightSource,
        precision: str | Precision = "fp32",
        pack: bool = True,
        device: torch.device | str = "cpu",
        dense_kernel: str = "bf16",
        progress: bool = False,
    ) -> NativeWeights:
        """The weights of the model `config` describes, read from `source` one tensor at a time
        (a quantized precision never holds more than one layer's matrices at full width).
        `pack=False` keeps plain dense weights (F.linear), which torch.compile can trace.
        int4 takes a GGUF file's own 4-bit blocks where it has them (no second rounding).
        `device`: where every weight lives (int8/int4 kernels: CPU only).
        `dense_kernel` (bf16 only): "bf16" multiplies rows as bf16 matrix columns (ColumnLinear);
        "rows" one row at a time (RowLinear), for CPUs without bf16 arithmetic (backends/kernel_timing.py
        measures which is faster); "fp32" widens the weights to fp32 (twice the memory); "linear" (any dense
        precision): plain F.linear, as the static backend's fixed shapes want."""
        if not supports(config):
            raise QuickdraftError(
                f"the native backend supports {', '.join(SUPPORTED_ARCHITECTURES)}, not {config.model_type!r}"
            )
        precision = get_precision(precision) if isinstance(precision, str) else precision
        device = torch.device(device)
        if precision.weights != "dense" and device.type != "cpu":
            raise QuickdraftError(
                f"precision {precision.name} uses PyTorch's CPU kernels; on {device.type} use bf16 or fp32"
            )
        dtype = precision.dtype
        gemma = config.model_type == GEMMA3
        if gemma and precision.name != "fp32":
            raise QuickdraftError(
                f"Gemma 3 runs on the native backend at fp32 for now, not {precision.name} "
                f"(backend='hf' runs it at any dtype transformers takes)"
            )
        present = source.names()

        def cast(tensor: torch.Tensor) -> torch.Tensor:
            return tensor.detach().to(device=device, dtype=dtype).contiguous()

        def dense(weight: torch.Tensor, bias: torch.Tensor | None) -> Linear:
            # bf16: row-invariant, so greedy speculation stays exact; fp32 differs only in rounding.
            if dtype == torch.float32 or dense_kernel == "linear":
                return PackedLinear(weight, bias, pack and dense_kernel != "linear")
            if dense_kernel == "rows":
                return RowLinear(weight, bias)
            return ColumnLinear(weight.float() if dense_kernel == "fp32" else weight, bias)

        def linear(stems: list[str], requantize_as: str = precision.weights) -> Linear:
            """One layer for the weights `stems` name, fused along outputs (and their biases, if all
            have one). Quantized: the file's 4-bit blocks when it has them, else `requantize_as`."""
            biases = [f"{stem}.bias" for stem in stems]
            bias = cast(torch.cat([source.get(b) for b in biases])) if all(b in present for b in biases) else None
            if precision.weights == "int4" and requantize_as == "int4":
                found = [source.int4_blocks(f"{stem}.weight") for stem in stems]
                if all(b is not None for b in found):
                    blocks = stack_int4(found)
                    if int4_fits(*blocks.q.shape, blocks.group):
                        return Int4Linear(blocks, bias, dtype)
            names = [stored_name(source, config, f"{stem}.weight") for stem in stems]
            if precision.weights == "dense":  # each part read straight into its rows of the fused matrix
                return dense(fused(source, names, dtype).to(device), bias)
            shape = (sum(source.shape(name)[0] for name in names), source.shape(names[0])[1])
            # Rounded ROWS_AT_ONCE rows at a time (rows are rounded on their own): a vocab-sized head
            # never sits in memory at full width (400 MB of fp32 at 1B, more than a layer's budget).
            parts = (block for name in names for block in source.row_blocks(name))
            return fused_quantized_linear(parts, shape, bias, requantize_as, dtype)

        def norm(name: str) -> torch.Tensor:
            # Gemma's norms scale by (1 + w), computed in fp32 as transformers does.
            weight = source.get(f"{name}.weight")
            return cast(1.0 + weight.float()) if gemma else cast(weight)

        layer_types = getattr(config, "layer_types", None) if gemma else None
        layers = []
        for index in tqdm(
            range(config.num_hidden_layers),
            desc="quickdraft: reading layers",
            unit="layer",
            disable=not progress,
            file=sys.stderr,
        ):
            at = f"model.layers.{index}"
            attn, mlp = f"{at}.self_attn", f"{at}.mlp"
            sliding = layer_types is not None and layer_types[index] == "sliding_attention"
            layers.append(
                LayerWeights(
                    input_norm=norm(f"{at}.input_layernorm"),
                    qkv=linear([f"{attn}.q_proj", f"{attn}.k_proj", f"{attn}.v_proj"]),
                    o=linear([f"{attn}.o_proj"]),
                    post_norm=norm(f"{at}.pre_feedforward_layernorm" if gemma else f"{at}.post_attention_layernorm"),
                    gate_up=linear([f"{mlp}.gate_proj", f"{mlp}.up_proj"]),
                    down=linear([f"{mlp}.down_proj"]),
                    q_norm=norm(f"{attn}.q_norm") if gemma else None,
                    k_norm=norm(f"{attn}.k_norm") if gemma else None,
                    attn_out_norm=norm(f"{at}.post_attention_layernorm") if gemma else None,
                    mlp_out_norm=norm(f"{at}.post_feedforward_layernorm") if gemma else None,
                    window=int(config.sliding_window) if sliding else None,
                    rotary=1 if sliding else 0,
                )
            )
            give_back_freed_memory()
        rotary = rotary_embedding(config)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        max_length = int(config.max_position_embeddings)
        window = getattr(config, "sliding_window", None)
        if window and getattr(config, "use_sliding_window", True) and not gemma:
            max_length = min(max_length, int(window))  # beyond the window the model attends differently
        tied = LM_HEAD not in present and getattr(config, "tie_word_embeddings", False)
        if tied and precision.weights == "dense":
            embed = source.read(EMBED, dtype).to(device)
            lm_head = dense(embed, None)
        else:  # the head before the embedding: its full-width read then meets one fewer vocab-sized tensor
            # The head's error goes straight into the logits: rounding it to 4 bits from scratch raised
            # the default target's KL from fp32 from 0.004 (int8 head) to 0.066, so it gets int8.
            lm_head = linear(["lm_head"], "int8")
            give_back_freed_memory()
            embed = source.read(EMBED, dtype).to(device)
        if gemma:
            full, local = rotary.full_attention_inv_freq, rotary.sliding_attention_inv_freq
            return cls(
                embed,
                layers,
                norm("model.norm"),
                lm_head,
                full.detach().float(),
                float(rotary.full_attention_attention_scaling),
                float(config.rms_norm_eps),
                config.num_attention_heads,
                config.num_key_value_heads,
                head_dim,
                max_length,
                dtype,
                precision.name,
                embed_scale=float(config.hidden_size) ** 0.5,
                activation="gelu_tanh",
                attn_scale=float(config.query_pre_attn_scalar) ** -0.5,
                inv_freqs=[full.detach().float(), local.detach().float()],
            )
        return cls(
            embed,
            layers,
            norm("model.norm"),
            lm_head,
            rotary.inv_freq.detach().float(),
            float(getattr(rotary, "attention_scaling", 1.0)),
            float(config.rms_norm_eps),
            config.num_attention_heads,
            config.num_key_value_heads,
            head_dim,
            max_length,
            dtype,
            precision.name,
        )


def supports(config: PretrainedConfig, precision: str | None = None) -> bool:
    """True for the architectures the native backend computes exactly like transformers (at
    `precision`; None: at some precision)."""
    if getattr(config, "model_type", None) == GEMMA3:
        return (
            getattr(config, "hidden_activation", None) == "gelu_pytorch_tanh"
            and getattr(config, "final_logit_softcapping", None) is None
            and getattr(config, "attn_logit_softcapping", None) is None
            and not getattr(config, "use_bidirectional_attention", False)
            and precision in (None, "fp32")
        )
    return (
        getattr(config, "model_type", None) in SUPPORTED_ARCHITECTURES
        and getattr(config, "hidden_act", "silu") == "silu"
        and not getattr(config, "mlp_bias", False)
    )


@dataclass
class Attention:
    """What one sequence's attention needs in a pass: fp32 passes use SDPA with `mask`
    [1, 1, n, keys] (None: all visible); low-precision passes use row-invariant `groups`."""

    mask: torch.Tensor | None
    groups: list[RowGroup]
    window_mask: torch.Tensor | None = None  # [1, 1, n, keys]: `mask` within a sliding layer's window (Gemma 3)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / rms(x) * weight, computed in fp32 as transformers does."""
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * normed.to(x.dtype)
