"""Memory: what the target, the draft (or heads), the KV caches and the working buffers take.

Two ways to the same report. `plan_memory` predicts it from shapes alone (a config.json or a
GGUF header: no weights loaded), for `quickdraft plan`; `loaded_memory` counts the bytes of the
tensors a loaded decoder actually holds, for `generate --verbose` and the server's gauges. Both
follow how the backends lay memory out:

- each backend's weights, read from the model's file tensor by tensor: native/static weights
  cast, fused (q/k/v, gate/up) or quantized once, oneDNN's packed copies of fp32 linears where
  the CPU has it; llama.cpp's GGUF tensors (memory-mapped) and the copies its CPU kernels repack
  (Q4_0, Q4_K, IQ4_NL matrices on AVX2); the hf backend's transformers model in its precision
  (the checkpoint's own by default). A transformers model passed in memory is counted beside
  them (the backend shares what it can of it);
- KV cache per token: native fp32 keys and values (plus a ones column in values below fp32),
  static and transformers in the activations' dtype, llama.cpp f16; the
  native backend's cache grows by doubling up to the context, static reserves the context
  (plus one pass) per slot, llama.cpp holds one pool of context cells for all sequences;
- working buffers: one pass's activations and fp32 logits (an estimate).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from quickdraft.backends.kinds import NATIVE, TRAITS, traits_for
from quickdraft.drafters.suffix_store import BYTES_PER_TOKEN as POOL_BYTES_PER_TOKEN
from quickdraft.errors import QuickdraftError
from quickdraft.models.precision import precision_of

GIB = 1 << 30


@dataclass(frozen=True)
class ModelShape:
    """A Llama-family model's sizes, read without its weights."""

    name: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    context: int
    tied: bool
    file_bytes: int | None = None  # a GGUF file's tensor bytes (what llama.cpp maps)
    gguf: Path | None = None  # the GGUF file the shape was read from
    config: object = field(default=None, compare=False, repr=False)  # the transformers config, where read
    stored: str = "fp32"  # the precision its weights are stored in (a GGUF file's read as fp32)
    repacked_bytes: int = 0  # what llama.cpp's CPU back end copies beside the mapped file (llama_cpp.repacked_bytes)

    @property
    def layer_linear_params(self) -> int:
        """q, k, v, o, gate, up, down of one layer."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return self.hidden * (q + 2 * kv) + q * self.hidden + 3 * self.hidden * self.intermediate

    @property
    def params(self) -> int:
        embed = self.vocab * self.hidden
        norms = (2 * self.layers + 1) * self.hidden
        return embed * (1 if self.tied else 2) + self.layers * self.layer_linear_params + norms

    def kv_entry_values(self) -> int:
        """Numbers one token's keys and values take, all layers."""
        return self.layers * self.kv_heads * 2 * self.head_dim


def shape_from_config(config, name: str = "model", file_bytes: int | None = None) -> ModelShape:
    """A transformers config (Llama, Mistral, Qwen2, SmolLM) -> its ModelShape."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return ModelShape(
        name,
        config.num_hidden_layers,
        config.hidden_size,
        config.intermediate_size,
        config.num_attention_heads,
        getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
        head_dim,
        config.vocab_size,
        int(config.max_position_embeddings),
        bool(getattr(config, "tie_word_embeddings", False)),
        file_bytes,
        config=config,
    )


def shape_from_gguf(path: Path) -> ModelShape:
    """The header of a GGUF file (its metadata and tensor table; the weights stay on disk)."""
    from gguf import GGUFReader

    from quickdraft.backends.llama_cpp import repacked_bytes
    from quickdraft.models.gguf_convert import gguf_config

    reader = GGUFReader(path)

    def field_value(key: str, default=None):
        found = reader.fields.get(key)
        if found is None or not found.data:
            if default is None:
                raise QuickdraftError(f"{path.name}: its header has no {key!r}")
            return default
        return found.parts[found.data[0]].tolist()[0]

    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    hidden, heads = field_value(f"{arch}.embedding_length"), field_value(f"{arch}.attention.head_count")
    names = {t.name for t in reader.tensors}
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    vocab = field_value(f"{arch}.vocab_size", len(tokens.data) if tokens is not None else 0)
    return ModelShape(
        path.stem,
        field_value(f"{arch}.block_count"),
        hidden,
        field_value(f"{arch}.feed_forward_length"),
        heads,
        field_value(f"{arch}.attention.head_count_kv", heads),
        field_value(f"{arch}.attention.key_length", hidden // heads),
        vocab,
        field_value(f"{arch}.context_length"),
        "output.weight" not in names,
        sum(int(t.n_bytes) for t in reader.tensors),
        path,
        gguf_config(path)[0],
        repacked_bytes=repacked_bytes(reader.tensors),
    )


def read_shape(source: str | os.PathLike | None) -> ModelShape:
    """A model's shape from a GGUF header, a folder's config.json or a hub id's config (None: the
    embedded default target), without loading weights."""
    from quickdraft.models import default_gguf_path

    if source is None:
        shape = shape_from_gguf(default_gguf_path())
        return ModelShape(**{**shape.__dict__, "name": "SmolLM2-135M-Instruct"})
    path = Path(source)
    if path.suffix == ".gguf" and path.is_file():
        return shape_from_gguf(path)
    if path.is_dir():
        ggufs = sorted(path.glob("*.gguf"))
        if (path / "config.json").is_file():
            from transformers import AutoConfig

            shape = shape_from_config(AutoConfig.from_pretrained(path), path.name)
            if any(path.glob("*.safetensors")):  # the headers say what the weights are stored in
                from quickdraft.models.weights import SafetensorsWeights, stored_precision

                shape = replace(shape, stored=stored_precision(SafetensorsWeights(path)))
            return shape
        if len(ggufs) == 1:
            return shape_from_gguf(ggufs[0])
        raise QuickdraftError(f"{path} has no config.json and not exactly one .gguf file")
    if path.exists() or str(source).startswith((".", "/")):
        raise QuickdraftError(f"model not found: no such file or folder {source}")
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(str(source))
        shape = shape_from_config(config, str(source).split("/")[-1])
        stored = getattr(config, "dtype", None)  # a hub config names its weights' dtype
        return replace(shape, stored=precision_of(stored)) if isinstance(stored, torch.dtype) else shape
    except OSError as error:
        raise QuickdraftError(f"could not read the config of {source!r}: {error}") from None


ACTIVATION_BYTES = {"fp32": 4, "bf16": 2, "int8": 2, "int4": 2, "fp16": 2}


def backend_weight_bytes(
    shape: ModelShape, backend: str, precision: str, device: str = "cpu", packed: bool | None = None
) -> int:
    """Bytes of a backend's weights, read from the model's file.
    packed: oneDNN keeps a packed copy of each fp32 linear weight (None: where this torch has it)."""
    packed = torch.backends.mkldnn.is_available() if packed is None else packed
    traits = TRAITS[backend]
    if traits.weights == "file":  # mapped, and the types its CPU kernels want repacked copied beside it
        return (shape.file_bytes or 0) + (shape.repacked_bytes if device == "cpu" else 0)
    if traits.weights == "transformers":
        return shape.params * ACTIVATION_BYTES[precision]  # the transformers model it builds
    act = ACTIVATION_BYTES[precision]
    embed = shape.vocab * shape.hidden
    norms = (2 * shape.layers + 1) * shape.hidden
    linear = shape.layers * shape.layer_linear_params
    head = 0 if shape.tied else embed
    if precision in ("fp32", "bf16"):
        total = (embed + norms + linear + head) * act  # every tensor at the precision
        if traits.packed and precision == "fp32" and device == "cpu" and packed:
            total += (linear + (embed if shape.tied else head)) * 4  # oneDNN's packed copies beside them
        return total
    # Quantized: embeddings and norms cast to bf16; linears int8 (a scale per output) or int4 (a
    # scale and zero per 32 inputs); the LM head int8 (int4 costs the logits too much).
    rows = shape.layers * (
        shape.heads * shape.head_dim + 2 * shape.kv_heads * shape.head_dim + 2 * shape.hidden + 2 * shape.intermediate
    )  # output channels of every layer's linears
    quantized = linear + rows * act if precision == "int8" else linear // 2 + linear // 32 * 2 * act
    return (embed + norms) * act + quantized + embed + shape.vocab * act


def kv_bytes_per_token(shape: ModelShape, backend: str, precision: str) -> int:
    """One token's keys and values, all layers, as the backend stores them."""
    per, traits = shape.kv_entry_values(), TRAITS[backend]
    if traits.kv == "f16":
        return per * 2
    if traits.kv == "activations":
        return per * ACTIVATION_BYTES[precision]
    ones = traits.kv_ones and precision != "fp32"  # values carry a ones column below fp32
    return (per + (shape.layers * shape.kv_heads if ones else 0)) * 4


def buffer_bytes(shape: ModelShape, rows: int) -> int:
    """An estimate of one pass's working memory over `rows` rows: fp32 logits and hidden states,
    the MLP's intermediate activations and attention scores over the context."""
    per_row = shape.vocab * 4 + shape.hidden * 4 * 4 + shape.intermediate * 3 * 4
    scores = shape.heads * shape.context * 4 * 2
    return rows * (per_row + scores)


@dataclass
class MemoryReport:
    """Bytes by part; `total` is what `max_batch` sequences at `context` tokens need together."""

    target_weights: int
    draft_weights: int
    kv_per_token: int
    kv_per_sequence: int  # at `context` tokens
    buffers: int
    max_batch: int
    context: int
    transformers_copy: int = 0  # transformers models passed in memory, beyond what backends share of them (CPU)
    shared_kv: bool = False  # one KV pool for all sequences (llama.cpp)
    pool: int = 0  # suffix decoding's earlier outputs, at most, per tenant
    device: str = "cpu"  # where weights, caches and buffers live (the transformers copy stays on the CPU)
    notes: list[str] = field(default_factory=list)

    @property
    def kv_total(self) -> int:
        return self.kv_per_sequence * (1 if self.shared_kv else self.max_batch)

    @property
    def total(self) -> int:
        return (
            self.transformers_copy + self.target_weights + self.draft_weights + self.kv_total + self.buffers + self.pool
        )

    @property
    def on_device(self) -> int:
        """What must fit on the device: everything on a CPU; all but the transformers copy on a GPU."""
        return self.total if self.device == "cpu" else self.total - self.transformers_copy

    def gauges(self) -> dict[str, int]:
        """Every figure by name (the server's Prometheus gauge labels)."""
        return {
            "transformers_copy": self.transformers_copy,
            "target_weights": self.target_weights,
            "draft_weights": self.draft_weights,
            "kv_per_token": self.kv_per_token,
            "kv_per_sequence": self.kv_per_sequence,
            "kv_total": self.kv_total,
            "buffers": self.buffers,
            "suffix_pool": self.pool,
            "total": self.total,
            "on_device": self.on_device,
        }

    def lines(self) -> list[str]:
        pool = "one pool for all sequences" if self.shared_kv else f"x {self.max_batch} sequences"
        rows = [
            ("transformers model passed in (not shared)", self.transformers_copy),
            ("target weights (the backend's)", self.target_weights),
            ("draft model or heads", self.draft_weights),
            ("KV cache per token", self.kv_per_token),
            (f"KV cache per sequence at {self.context} tokens", self.kv_per_sequence),
            (f"KV caches ({pool})", self.kv_total),
            ("working buffers (estimate)", self.buffers),
            *([("earlier outputs to draft from (per tenant, most)", self.pool)] if self.pool else []),
            (f"total at {self.max_batch} sequences", self.total),
        ]
        if self.device != "cpu":
            rows.append((f"  of which on {self.device}", self.on_device))
        return [f"{label:<48} {human(value):>10}" for label, value in rows] + self.notes


def human(n: int) -> str:
    """Bytes in the largest unit that keeps a digit before the point (KiB, MiB, GiB)."""
    for unit, size in (("GiB", GIB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


def parse_bytes(text: str) -> int:
    """'8GiB', '512MiB', '8GB', '1.5G', '123' -> bytes."""
    units = {"k": 1 << 10, "m": 1 << 20, "g": GIB, "t": 1 << 40}
    cleaned = text.strip().lower().replace("ib", "").replace("b", "")
    try:
        if cleaned and cleaned[-1] in units:
            return int(float(cleaned[:-1]) * units[cleaned[-1]])
        return int(float(cleaned))
    except ValueError:
        raise QuickdraftError(f"memory must be a size like 8GiB or 512MiB, got {text!r}", "memory") from None


def plan_memory(
    target: ModelShape,
    draft: ModelShape | None = None,
    *,
    backend: str = NATIVE,
    precision: str = "fp32",
    device: str = "cpu",
    max_batch: int = 1,
    context: int | None = None,
    head_bytes: int = 0,
    rows: int = 16,
    packed: bool | None = None,
    pool_tokens: int = 0,
) -> MemoryReport:
    """What `max_batch` sequences of `context` tokens need on `backend` at `precision`, from shapes alone.
    rows: tokens per pass per sequence (the static backend: always its 64); pool_tokens: earlier
    outputs suffix decoding keeps per tenant."""
    traits = TRAITS[backend]
    if context is None and traits.pool_cells is not None:  # its pool is allocated up front, capped
        context = min(target.context, traits.pool_cells)
    context = min(context or target.context, target.context)
    rows = traits.rows or rows
    per_token = kv_bytes_per_token(target, backend, precision)
    slots = context + rows if traits.rows else context
    draft_bytes = head_bytes
    if draft is not None:
        draft_backend = NATIVE if traits.needs_gguf and draft.gguf is None else backend
        draft_bytes += backend_weight_bytes(draft, draft_backend, precision, device, packed)
        per_token += kv_bytes_per_token(draft, draft_backend, precision)
    return MemoryReport(
        backend_weight_bytes(target, backend, precision, device, packed),
        draft_bytes,
        per_token,
        per_token * slots,
        buffer_bytes(target, rows * max_batch),
        max_batch,
        context,
        shared_kv=traits.shared_kv,
        device=device,
        pool=pool_tokens * POOL_BYTES_PER_TOKEN,
    )


def available_memory() -> int:
    """Bytes of memory free for a new allocation now (Linux's MemAvailable; else all of it)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def tensor_bytes(*roots: object) -> int:
    """Bytes of every distinct tensor reachable from `roots` (attributes, lists, tuples, dicts, modules)."""
    seen_objects: set[int] = set()
    storages: dict[int, int] = {}

    def visit(obj: object) -> None:
        if id(obj) in seen_objects or obj is None or isinstance(obj, (str, int, float, bool, type)):
            return
        seen_objects.add(id(obj))
        if isinstance(obj, torch.Tensor):
            if obj.is_mkldnn:
                storages[id(obj)] = obj.numel() * obj.element_size()
            else:
                storage = obj.untyped_storage()
                storages[storage.data_ptr()] = storage.nbytes()
            return
        if isinstance(obj, torch.nn.Module):
            for tensor in [*obj.parameters(), *obj.buffers()]:
                visit(tensor)
            for value in vars(obj).values():
                if not isinstance(value, dict):  # _parameters, _modules: covered above
                    visit(value)
            return
        if isinstance(obj, dict):
            for value in obj.values():
                visit(value)
            return
        if isinstance(obj, (list, tuple, set)):
            for value in obj:
                visit(value)
            return
        if hasattr(obj, "__dict__"):
            for value in vars(obj).values():
                visit(value)

    for root in roots:
        visit(root)
    return sum(storages.values())


def loaded_memory(decoder, max_batch: int = 1, context: int | None = None) -> MemoryReport:
    """The report for a loaded decoder: weight bytes counted from the tensors it holds; KV and
    buffers from its target's shape (they are allocated per sequence, as sequences come)."""
    target = decoder.target_backend
    shape = shape_from_config(decoder.target.config, decoder.target.name)
    kind, precision = decoder.backend_kind, decoder.precision
    traits = TRAITS[kind]
    own = _backend_bytes(target)
    heads = tensor_bytes(*[head for key, head in decoder.target.heads.items()]) if decoder.target.heads else 0
    drafter_backend = getattr(decoder.drafter, "backend", None)
    draft_bytes = heads
    per_token = kv_bytes_per_token(shape, kind, precision)
    held = [_weights(target)]
    if decoder.draft is not None and drafter_backend is not None and drafter_backend is not target:
        held.append(_weights(drafter_backend))
        draft_bytes += _backend_bytes(drafter_backend)
        draft_precision = getattr(drafter_backend, "precision", "fp32")
        per_token += kv_bytes_per_token(
            shape_from_config(decoder.draft.config), traits_for(drafter_backend).name, draft_precision
        )
    models = [model for m in (decoder.target, decoder.draft) if m is not None for model in m.built.values()]
    transformers = tensor_bytes(*models, *held) - tensor_bytes(*held)  # what the backends do not share
    context = min(context or decoder.context_length, decoder.context_length)
    rows = getattr(target, "rows", 16)
    slots = context + rows if traits.rows else context
    return MemoryReport(
        own,
        draft_bytes,
        per_token,
        per_token * slots,
        buffer_bytes(shape, rows * max_batch),
        max_batch,
        context,
        transformers,
        shared_kv=traits.shared_kv,
        device=decoder.device.type,
        pool=getattr(getattr(decoder.drafter, "pools", None), "capacity", 0) * POOL_BYTES_PER_TOKEN,
    )


def _backend_bytes(backend: object) -> int:
    """Bytes of a backend's weights: its GGUF file (llama.cpp maps it) and the copies beside it that
    llama.cpp's log named at load, or the tensors it holds."""
    gguf = getattr(backend, "gguf", None)
    if gguf is not None:
        from gguf import GGUFReader

        return sum(int(t.n_bytes) for t in GGUFReader(gguf).tensors) + getattr(backend, "extra_weight_bytes", 0)
    return tensor_bytes(_weights(backend))


def _weights(backend: object) -> object:
    """What holds a backend's weights: its native weights, or the transformers model it runs."""
    return getattr(backend, "weights", None) or getattr(backend, "model", None)


def fit_advice(
    report: MemoryReport,
    budget: int,
    target: ModelShape,
    draft: ModelShape | None,
    backend: str,
    precision: str,
    device: str,
    head_bytes: int = 0,
) -> tuple[bool, list[str]]:
    """Whether `report` fits in `budget` bytes, and if not what would: fewer sequences, a shorter
    context, or a smaller precision (native backend) at the same batch and context."""
    where = "" if report.device == "cpu" else f" on {report.device}"
    if report.on_device <= budget:
        return True, [
            f"fits{where}: {human(report.on_device)} of {human(budget)} ({human(budget - report.on_device)} to spare)"
        ]
    lines = [f"does not fit{where}: needs {human(report.on_device)}, has {human(budget)}"]
    fixed = report.on_device - report.kv_total - report.buffers
    per_sequence = report.kv_per_sequence + report.buffers // report.max_batch
    if not report.shared_kv and budget > fixed + per_sequence:
        lines.append(f"  --max-batch {(budget - fixed) // per_sequence} fits at this context")
    sequences = 1 if report.shared_kv else report.max_batch
    room = budget - fixed - report.buffers
    if room > 0 and room // (sequences * report.kv_per_token) >= 1:
        context = min(report.context, room // (sequences * report.kv_per_token))
        lines.append(f"  --context {context} fits at this batch")
    if device == "cpu":
        for smaller in ("bf16", "int8", "int4"):
            if smaller == precision or smaller not in TRAITS[backend].precisions:
                continue
            other = plan_memory(
                target,
                draft,
                backend=backend,
                precision=smaller,
                device=device,
                max_batch=report.max_batch,
                context=report.context,
                head_bytes=head_bytes,
            )
            if other.on_device <= budget:
                lines.append(f"  --precision {smaller} fits ({human(other.on_device)})")
                break
    if fixed > budget:
        lines.append("  the weights alone are over it: a smaller model or more memory")
    return False, lines
