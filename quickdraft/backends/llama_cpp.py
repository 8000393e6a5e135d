"""The llama.cpp backend: a GGUF model on ggml's CPU kernels, through llama-cpp-python's low-level API.

One llama.cpp context holds every sequence's cache in one unified pool of cells; a sequence
owns a sequence id. A pass of several sequences is one llama_decode. Rolling back removes the
sequence's cells past the accepted length. A tree (or any masked pass) gets temporary "view"
sequence ids: llama.cpp lets a token attend the cells that carry its first sequence id at
positions up to its own, so each new token is put in the views of the tokens that attend it,
and each view starts as a copy of the sequence's cached prefix (a copy adds an id to cells; no
data moves). Keeping an accepted path copies the path's cells into the sequence, then drops
the views.

Cell order matters for exactness (docs/llama-cpp.md): attention sums a row over its cells in
cell order, so a sequence's cells must stay in position order. A tree pass puts its most likely
chain (each node's first child) first; a kept path that leaves that chain is cut where it leaves
it, and its remaining tokens are decoded again at the front of the sequence's next pass, into
cells in order ("pending").
"""

from __future__ import annotations

import ctypes
import functools
import importlib.metadata
import importlib.util
import re
import sys
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm
from transformers import PretrainedConfig, PreTrainedTokenizerBase

from quickdraft.backends.backend import PassCostsOnFirstRead, PassOutput, SeqPass, check_passes, tapped_layers
from quickdraft.errors import QuickdraftError


def llama_cpp_installed() -> bool:
    """Whether llama-cpp-python can be imported (found without importing it)."""
    return importlib.util.find_spec("llama_cpp") is not None


def require_llama_cpp() -> object:
    """llama-cpp-python's low-level API, with llama.cpp's log messages off and read by a LogTap
    (or a clear error)."""
    if not llama_cpp_installed():
        raise QuickdraftError(
            "backend 'llama.cpp' needs llama-cpp-python (./setup.sh installs it; or "
            "pip install llama-cpp-python==0.3.36)"
        )
    import llama_cpp  # optional dependency

    _silence(llama_cpp)
    return llama_cpp


class LogTap:
    """What llama.cpp's log said about the weight buffers of the model loaded last: the buffers
    beside the mapped file (its CPU back end repacks some types into a copy for its kernels, e.g.
    Q4_0 on AVX2: "CPU_REPACK model buffer size = 573.75 MiB"), by name, in bytes."""

    BUFFER = re.compile(r"(\S+) model buffer size\s*=\s*([\d.]+) MiB")

    def __init__(self) -> None:
        self.buffers: dict[str, int] = {}
        self.callback: object = None  # the C callback that feeds it, kept alive with it

    def read(self, text: str) -> None:
        found = self.BUFFER.search(text)
        if found and found.group(1) not in ("CPU_Mapped", "CPU"):  # the file itself, and small unmapped tensors
            self.buffers[found.group(1)] = int(float(found.group(2)) * (1 << 20))


# What a stock llama.cpp's CPU back end repacks on an x86 CPU with AVX2 (ggml-cpu's repack.cpp): these
# types, in matrices whose rows come in whole groups of 8. setup.sh's build repacks nothing (its
# row-exact kernels read ggml's own layout). Checked against the buffer sizes llama.cpp logs at load
# by tests/test_llama_cpp_backend.py, so a build that repacks otherwise fails it.
REPACKED_TYPES = ("Q4_0", "Q4_K", "IQ4_NL")
REPACK_ROWS = 8


def repacked_bytes(tensors: list, capability: str | None = None, repacks: bool | None = None) -> int:
    """Bytes llama.cpp's CPU back end copies beside the mapped file for its kernels, from a GGUF
    tensor table (gguf's ReaderTensors): the matrices of REPACKED_TYPES it multiplies (not the
    token embedding, which it only looks up, unless the file ties the output head to it) on a
    CPU with AVX2 (capability: torch's name for this CPU's vector unit; elsewhere none counted).
    repacks: whether the build repacks (default: all but setup.sh's, which lists ROW_EXACT_MATMUL)."""
    capability = capability or torch.backends.cpu.get_cpu_capability()
    if repacks is None:
        repacks = ROW_EXACT_MATMUL not in installed_patches()
    if capability not in ("AVX2", "AVX512") or not repacks:
        return 0
    tied = not any(t.name == "output.weight" for t in tensors)
    return sum(
        int(t.n_bytes)
        for t in tensors
        if t.tensor_type.name in REPACKED_TYPES
        and len(t.shape) == 2
        and int(t.shape[1]) % REPACK_ROWS == 0
        and (t.name != "token_embd.weight" or tied)
    )


@functools.cache
def _silence(lib) -> LogTap:
    """Drop llama.cpp's log messages, once per process, reading what they say of weight buffers
    (LogTap): llama.cpp keeps the callback in a global, so it must outlive every backend (cached
    here with its tap, never freed)."""
    tap = LogTap()

    @lib.llama_log_callback
    def quiet(level, text, user_data):  # noqa: ARG001 - the C signature
        tap.read(text.decode(errors="replace") if text else "")

    lib.llama_log_set(quiet, ctypes.c_void_p())
    tap.callback = quiet  # kept alive with the tap
    return tap


@dataclass
class _Layout:
    """One sequence's share of a decode, in batch (and cell) order: its pending tokens, then its pass's."""

    tokens: list[int]
    positions: list[int]
    ids: list[list[int]]  # each token's sequence ids, the one it attends through first
    outputs: list[bool]  # whether a token makes an output row
    slots: list[int]  # each pass token's place among the pass's own tokens
    views: list[int] = field(default_factory=list)
    first_view: list[int] = field(default_factory=list)  # each pass token's own view
    attends: list[frozenset[int]] = field(default_factory=list)  # each pass token's attended pass tokens


# ggml's CPU flash attention tiles passes of 64 rows or more (GGML_FA_TILE_Q), which sums in
# another order than the row-by-row path, and in tiles of cells counted from the pool's first
# cell, so a row's bits depend on where its sequence's cells sit, i.e. on what else holds cells:
# every decode, a prompt's too, stays below that.
ROW_INVARIANT_ROWS = 63
# Rows of a decode get one-token bits only up to a size that depends on the file's tensor types and
# the build's kernels. setup.sh's build (ROW_EXACT_MATMUL) multiplies Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K and
# Q6_K matrices row-exactly up to ROW_INVARIANT_ROWS; a stock build repacks Q4_K/Q4_0 weights for
# kernels that take 4 rows at once and takes Q5_0/Q8_0 rows in sgemm blocks (Gemma 3 270M's Q4_K_M
# file: exact up to 3 rows there). So each file's exact size is measured at load (exact_rows), a guard
# for types the row-exact kernels do not cover: a pass is decoded in parts of that size.
# Each size checked costs a pass, and the check as many one-token passes as its largest size.
EXACT_GRID = (2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 48, ROW_INVARIANT_ROWS)
EXACT_CONTEXT = 300  # cached tokens before the checked rows (fewer where sequences are shorter)


class NoRoom(ValueError):
    """The shared pool has no cells (or no sequence id) left for a pass."""


class NoCells(NoRoom):
    """llama.cpp found no free cells for a decode (with ordered cells: none above a sequence's)."""


# The patches scripts/build-llama-cpp.sh applies, as it lists them in the installed package: with
# ORDERED_CELLS a token takes a cell above every cell of its sequences, so each sequence's cells stay
# in position order in a pool shared with other sequences (docs/llama-cpp.md, "Exactness").
PATCHES_FILE = "quickdraft-patches.txt"
ORDERED_CELLS = "llama-cpp-ordered-cells.patch"
# With ROW_EXACT_MATMUL, Q4_0/Q4_1/Q5_0/Q8_0/Q4_K/Q5_K/Q6_K products of 1-63 rows take one kernel that sums
# each row in the same order whatever the pass holds (and nothing is repacked); files of other types
# still rely on the exactness check (exact_rows) to split passes.
ROW_EXACT_MATMUL = "llama-cpp-row-exact-matmul.patch"


# GGUF architectures whose llama.cpp graph records each layer's input (llm_graph_result's t_layer_inp,
# read in llama-cpp-python 0.3.36's vendored src/models/), so a pass can return them (EAGLE-3's
# features): by GGUF name, with transformers' model_type for the same architecture.
LAYER_INPUT_ARCHITECTURES = {"llama": "llama", "qwen3": "qwen3", "qwen3moe": "qwen3_moe"}


def records_layer_inputs(config: PretrainedConfig) -> bool:
    """Whether llama.cpp returns the inputs of inner layers for a model of this config."""
    return getattr(config, "model_type", None) in LAYER_INPUT_ARCHITECTURES.values()


@dataclass(frozen=True)
class _LayerInputCalls:
    """llama.cpp's staging API for layer inputs (src/llama-ext.h, C++ linkage, so found by its
    mangled name): set(context, layer, on) records layer `layer`'s input rows [n_batch, H] for every
    token of later decodes; get(context, layer) points at the last decode's."""

    set: Callable
    get: Callable

    SET = ("llama_set_embeddings_layer_inp", "_Z30llama_set_embeddings_layer_inpP13llama_contextjb")
    GET = ("llama_get_embeddings_layer_inp", "_Z30llama_get_embeddings_layer_inpP13llama_contextj")

    @classmethod
    def find(cls, lib) -> _LayerInputCalls | None:
        """The two calls in llama-cpp-python's library, or None where this build lacks them."""
        shared = getattr(getattr(lib, "llama_cpp", None), "_lib", None)
        found = [next((getattr(shared, n) for n in names if hasattr(shared, n)), None) for names in (cls.SET, cls.GET)]
        if shared is None or None in found:
            return None
        setter, getter = found
        setter.argtypes, setter.restype = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_bool], None
        getter.argtypes, getter.restype = [ctypes.c_void_p, ctypes.c_uint32], ctypes.POINTER(ctypes.c_float)
        return cls(setter, getter)


def installed_patches() -> frozenset[str]:
    """The quickdraft patches the installed llama-cpp-python was built with (none for a stock build or
    none installed), read beside its package without importing it."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.origin:
        return frozenset()
    listed = Path(spec.origin).parent / PATCHES_FILE
    return frozenset(listed.read_text().split()) if listed.is_file() else frozenset()


def build_description() -> str | None:
    """Which llama-cpp-python is installed (None: none): its version, and whether it is setup.sh's
    build (the patches it lists) or a stock one. Reports name it beside llama.cpp's figures."""
    if not llama_cpp_installed():
        return None
    version = importlib.metadata.version("llama_cpp_python")
    patches = sorted(installed_patches())
    return f"llama-cpp-python {version}, " + (f"setup.sh's build ({', '.join(patches)})" if patches else "stock build")


class LlamaCppCache:
    """One sequence: its id in the shared pool of cells and its length. Of its entries, the last
    len(pending) have no cells yet (a kept tree branch's tokens, decoded again by the next pass).
    A masked pass leaves its views until keep() or truncate()."""

    def __init__(self, backend: LlamaCppBackend, seq: int) -> None:
        self.backend, self.seq, self.length = backend, seq, 0
        self.pending: list[int] = []  # tokens at positions length - len(pending) .. length - 1, no cells yet
        self.start = 0  # the length before the last pass
        self.tokens: list[int] = []  # the last pass's tokens
        self.slots: list[int] = []  # each of them: its place in the pass's cells (masked passes)
        self.views: list[int] = []  # view ids of the last pass, if masked
        self.first_view: list[int] = []  # each new token's view (the one it attends through)
        self.attends: list[frozenset[int]] = []  # each new token's attended new tokens
        # Released into the shared handles, not the backend: after the context is freed it does nothing.
        weakref.finalize(self, backend.handles.release, seq).atexit = False

    @property
    def placed(self) -> int:
        """Entries that have cells: the first length - len(pending)."""
        return self.length - len(self.pending)

    def _drop_views(self) -> None:
        for view in self.views:
            self.backend._release(view)
        self.views, self.first_view, self.attends = [], [], []

    def truncate(self, length: int) -> None:
        self._drop_views()
        length = max(0, length)
        if length < self.placed:
            self.backend._remove(self.seq, length)
            self.pending = []
        elif length < self.length:
            self.pending = self.pending[: length - self.placed]
        self.length = min(self.length, length)
        self.start = min(self.start, self.length)

    def keep(self, indices: list[int]) -> None:
        start = self.start
        # Ascending indices whose index start - 1 is start - 1 begin with the whole cached prefix.
        prefix = len(indices) >= start and (start == 0 or indices[start - 1] == start - 1)
        if not prefix or (indices and indices[-1] >= self.length):
            raise ValueError("keep() takes the cached prefix and then an accepted path of the last pass")
        new = [i - start for i in indices[start:]]
        if not self.views or not new:
            if new != list(range(len(new))):
                raise ValueError("only a masked pass can keep a path that is not a prefix")
            self.truncate(len(indices))
            return
        if set(new) != self.attends[new[-1]]:
            raise ValueError("a kept path must be exactly what its last token attended")
        # The path's first `ordered` tokens sit in cells start, start + 1, ... (the pass's first chain);
        # a view holding one of them holds exactly the path up to it: copy those cells.
        ordered = 0
        while ordered < len(new) and self.slots[new[ordered]] == ordered:
            ordered += 1
        if ordered:
            self.backend._copy(self.first_view[new[ordered - 1]], self.seq, start, start + ordered)
        self._drop_views()
        self.pending = [self.tokens[i] for i in new[ordered:]]  # decoded again, in order, by the next pass
        self.length = start + len(new)
        self.start = self.length


# Cache cells llama.cpp allocates up front when none are asked for: the model's trained context,
# at most this many. An 8B model trained on 128k tokens would otherwise hold 16 GiB of KV
# before its first token (4,096 cells: 512 MiB at Llama-3-8B's shape, 92 MiB at SmolLM2's).
DEFAULT_CELLS = 4096


class LlamaCppBackend:
    """A GGUF model run by llama.cpp for many caches. cells: cache cells shared by all sequences
    (each sequence may hold up to max_length of them; default: the trained context, at most
    DEFAULT_CELLS); threads: llama.cpp's CPU threads. check_exact_rows(backend): the exactness
    check's result (default: measure_exact_rows; backends/select.py keeps it per machine and file),
    run the first time a pass needs it."""

    pass_ms = PassCostsOnFirstRead()

    def __init__(
        self,
        gguf: str | Path,
        name: str,
        tokenizer: PreTrainedTokenizerBase | None = None,
        eos_ids: frozenset[int] = frozenset(),
        threads: int | None = None,
        cells: int | None = None,
        max_sequences: int = 256,
        check_exact_rows: Callable[[LlamaCppBackend], int] | None = None,
    ) -> None:
        lib = require_llama_cpp()
        self._lib = lib
        lib.llama_backend_init()
        path = Path(gguf)
        if not path.is_file():
            raise QuickdraftError(f"GGUF file not found: {path}")
        model_params = lib.llama_model_default_params()
        model_params.load_mode = (
            lib.LLAMA_LOAD_MODE_MMAP
        )  # as llama-cpp-python asks: "auto" read 8B files 1.2-2x slower
        tap = _silence(lib)
        tap.buffers = {}
        model = lib.llama_model_load_from_file(str(path).encode(), model_params)
        if not model:
            raise QuickdraftError(f"llama.cpp could not load {path}")
        self.extra_weight_bytes = sum(tap.buffers.values())  # copies beside the mapped file (repacked types)
        self.name, self.tokenizer, self.eos_ids, self.gguf = name, tokenizer, eos_ids, path
        self.threads = threads or torch.get_num_threads()
        trained = int(lib.llama_model_n_ctx_train(model))
        self.max_sequences = min(max_sequences, int(lib.llama_max_parallel_sequences()))
        params = lib.llama_context_default_params()
        params.n_ctx = cells or min(trained, DEFAULT_CELLS)
        # No more sequences than cells (each holds one at least): llama.cpp aborts on a pool smaller than n_seq_max.
        self.max_sequences = min(self.max_sequences, int(params.n_ctx))
        params.n_batch = params.n_ctx  # decodes take at most ROW_INVARIANT_ROWS tokens (_run), never more
        params.n_ubatch = 512
        params.n_seq_max = self.max_sequences
        params.kv_unified = True  # one pool of cells: sequences share cells by id, nothing is copied
        params.n_threads = params.n_threads_batch = self.threads
        params.no_perf = True
        params.embeddings = False
        # Exactness (docs/llama-cpp.md): flash attention sums each query row over its cells in cell
        # order, one row at a time, in the build setup.sh makes (patches/: no KV split for a lone
        # row) and in decodes of under 64 rows (ROW_INVARIANT_ROWS). So a row does not depend on
        # the pass it is in, and while a sequence's cells stay in position order (see "pending")
        # its rows equal plain decoding's bit for bit.
        params.flash_attn_type = lib.LLAMA_FLASH_ATTN_TYPE_ENABLED
        context = lib.llama_init_from_model(model, params)
        if not context:
            lib.llama_model_free(model)
            raise QuickdraftError(f"llama.cpp could not make a context for {path}")
        self.max_sequences = min(self.max_sequences, int(lib.llama_n_seq_max(context)))
        self.handles = _Handles(lib, model, context, self.max_sequences)
        self._context, self._memory = context, self.handles.memory
        weakref.finalize(self, self.handles.close)
        self.cells = int(lib.llama_n_ctx(context))
        self.max_length = min(trained, self.cells)
        vocab = lib.llama_model_get_vocab(model)
        self.vocab_size = int(lib.llama_vocab_n_tokens(vocab))
        self.hidden_size = int(lib.llama_model_n_embd(model))
        self.layers = int(lib.llama_model_n_layer(model))
        named = ctypes.create_string_buffer(64)
        lib.llama_model_meta_val_str(model, b"general.architecture", named, len(named))
        self.architecture = named.value.decode()
        # Inputs of inner layers (EAGLE-3's features), recorded from the first pass that asks for them
        # on: recording costs a pass nothing measurable (docs/llama-cpp.md, "Taps"), and switching it
        # makes llama.cpp plan its graph again.
        self._layer_inputs = _LayerInputCalls.find(lib) if self.architecture in LAYER_INPUT_ARCHITECTURES else None
        self.recorded_layers: frozenset[int] = frozenset()
        self.device, self.dtype = torch.device("cpu"), torch.float32
        self.precision = "gguf"
        self.time_passes = None  # backends/select.py: times pass_ms when first read
        self._embeddings = False
        self._check_exact_rows = check_exact_rows or LlamaCppBackend.measure_exact_rows
        self._exact_rows: int | None = None  # checked when first needed
        # Whether sequences sharing the pool keep their cells in order (the patched build): without
        # it a sequence's rows can depend on the others', so only one sequence at a time is exact.
        self.ordered_cells = ORDERED_CELLS in installed_patches()
        self.compactions = 0  # times the pool was compacted to make room above a sequence
        self._caches: weakref.WeakSet[LlamaCppCache] = weakref.WeakSet()  # the live ones

    def set_threads(self, threads: int) -> None:
        """Run later passes on `threads` CPU threads (benchmarks/real_sizes.py times 1 and 2 in one run)."""
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self._lib.llama_set_n_threads(self._context, threads, threads)
        self.threads = threads

    @property
    def exact_rows(self) -> int:
        """The most rows a later decode takes: checked (check_exact_rows) the first time a pass
        has several later rows, so plain decoding never pays for the check. Where the pool has no
        room for the check, this pass decodes one row at a time (exact) and a later one checks."""
        if self._exact_rows is None:
            try:
                self._exact_rows = int(self._check_exact_rows(self))
            except NoRoom:
                return 1
        return self._exact_rows

    @exact_rows.setter
    def exact_rows(self, rows: int) -> None:
        self._exact_rows = rows

    def measure_exact_rows(self) -> int:
        """The largest decode size in EXACT_GRID up to which every row of a pass equals the same
        token's row in one-token passes bit for bit, after EXACT_CONTEXT cached tokens (one length:
        with the patched build, a decode of under 64 rows takes attention row by row whatever the
        cache holds; the tests check 40 and 300). An exactness check, not a timing: the same on a
        busy machine as on a quiet one. Raises NoRoom where the pool cannot hold its sequence."""
        kept, self._exact_rows = self._exact_rows, ROW_INVARIANT_ROWS  # while checking, passes are single decodes
        try:
            return self._exact_decode_size()
        finally:
            self._exact_rows = kept

    def _exact_decode_size(self) -> int:
        generator = torch.Generator().manual_seed(0)
        top = min(self.vocab_size, 32000)
        exact = EXACT_GRID[-1]
        length = min(EXACT_CONTEXT, self.max_length - exact)  # a shorter context where sequences are short
        if length < 1:
            return 1  # no sequence can hold the check: one row per decode is exact
        context = torch.randint(top // 100, top, (length,), generator=generator).tolist()
        new = torch.randint(top // 100, top, (exact,), generator=generator).tolist()
        with tqdm(
            total=1 + len(new) + len(EXACT_GRID),
            unit="pass",
            file=sys.stderr,
            desc=f"quickdraft: checking which llama.cpp pass sizes are exact for {self.name} (once)",
        ) as bar:
            cache = self.new_cache()
            try:
                self.forward([SeqPass(cache, context, logits="none")])
                bar.update()
                one = self._rows_after(cache, length, [[token] for token in new])
                bar.update(len(new))
                for size in EXACT_GRID:
                    bar.update()
                    if not torch.equal(self._rows_after(cache, length, [new[:size]]), one[:size]):
                        return max([1] + [n for n in EXACT_GRID if n < size])
            finally:
                cache.truncate(0)
        return exact

    def _rows_after(self, cache: LlamaCppCache, length: int, passes: list[list[int]]) -> torch.Tensor:
        """Logits [tokens, V] of `passes` run one after another after the first `length` entries of
        `cache`, rolled back there after (its cells stay in position order)."""
        rows = torch.cat([self.forward([SeqPass(cache, tokens)])[0].logits for tokens in passes])
        cache.truncate(length)
        return rows

    # -- sequence ids -------------------------------------------------------------------------

    def _take_id(self) -> int:
        if not self.handles.free_ids:
            raise NoRoom(f"llama.cpp backend: all {self.max_sequences} sequence ids are in use")
        return self.handles.free_ids.pop()

    def new_cache(self, length: int | None = None) -> LlamaCppCache:
        cache = LlamaCppCache(self, self._take_id())
        self._caches.add(cache)
        return cache

    def _release(self, seq: int) -> None:
        self.handles.release(seq)

    def _remove(self, seq: int, start: int) -> None:
        if not self._lib.llama_memory_seq_rm(self._memory, seq, start, -1):
            raise RuntimeError("llama.cpp refused to remove cache cells")

    def _copy(self, source: int, target: int, start: int, end: int) -> None:
        self._lib.llama_memory_seq_cp(self._memory, source, target, start, end)

    # -- passes -------------------------------------------------------------------------------

    def forward(self, passes: list[SeqPass]) -> list[PassOutput]:
        check_passes(passes, self.max_length)
        self._record_layer_inputs(tapped_layers(passes, range(self.layers)))
        for p in passes:
            if not isinstance(p.cache, LlamaCppCache) or p.cache.backend is not self:
                raise ValueError("a cache from another backend was passed to this one")
            if p.cache.views:
                raise ValueError("keep() or truncate() the previous masked pass before the next pass")
            if not p.tokens:
                raise ValueError("a pass needs at least one token")
        later = sum(len(p.tokens) + len(p.cache.pending) for p in passes if p.cache.length > 0)
        step = self.exact_rows if later > 1 else 1  # the first such pass runs the exactness check
        try:
            layouts, (logits, hidden) = self._laid_out_and_run(passes, step)  # per pass: {batch place: row}
        except NoCells:
            # With ordered cells a token needs a free cell above its sequence's: there may be room
            # below. Moving every sequence down in order (bits kept) makes it, then try once more.
            if not self._compact():
                raise
            layouts, (logits, hidden) = self._laid_out_and_run(passes, step)
        results = []
        for k, (p, layout) in enumerate(zip(passes, layouts)):
            cache, n = p.cache, len(p.tokens)
            cache.pending = []  # decoded now, into cells in order
            cache.start, cache.length = cache.length, cache.length + n
            cache.tokens, cache.slots = list(p.tokens), layout.slots
            cache.views, cache.first_view, cache.attends = layout.views, layout.first_view, layout.attends
            places = [len(layout.tokens) - n + slot for slot in layout.slots]  # each token's place in the layout
            wanted = places if p.logits == "all" else places[-1:] if p.logits == "last" else []
            rows = torch.from_numpy(np.stack([logits[k][i] for i in wanted])) if wanted else None  # [rows, V]
            states = torch.from_numpy(np.stack([hidden[k][i] for i in places])) if p.hidden else None  # [n, H]
            results.append(PassOutput(rows, states))
        return results

    def _record_layer_inputs(self, layers: set[int]) -> None:
        """Have later decodes record these layers' inputs (beside those recorded already)."""
        if not layers - self.recorded_layers:
            return
        if self._layer_inputs is None:
            raise ValueError(
                f"llama.cpp does not return the inputs of inner layers for this {self.architecture!r} file "
                f"(it does for {', '.join(LAYER_INPUT_ARCHITECTURES)}); EAGLE-3 heads need them: use "
                f"backend='native' (or 'hf')"
            )
        for layer in sorted(layers - self.recorded_layers):
            self._layer_inputs.set(self._context, layer, True)
        self.recorded_layers |= layers

    def _laid_out_and_run(self, passes: list[SeqPass], step: int) -> tuple[list[_Layout], tuple[list, list]]:
        """Lay out and run the passes (the views a failure leaves released)."""
        layouts: list[_Layout] = []
        try:
            for p in passes:
                layouts.append(self._layout(p))
            return layouts, self._run(passes, layouts, step)
        except BaseException:
            for layout in layouts:
                for view in layout.views:
                    self._release(view)
            raise

    def _compact(self) -> bool:
        """Move every sequence's cells to the bottom of the pool, in sequence id and cell order: each
        sequence's state (its cells' keys and values, bits unchanged) is read out, the pool emptied
        and the states written back, each into the lowest free cells. Only between passes (no
        views), with ordered cells. Returns whether it ran."""
        lib, context = self._lib, self._context
        held = sorted(set(range(self.max_sequences)) - set(self.handles.free_ids))
        if not self.ordered_cells or not held or any(cache.views for cache in self._caches):
            return False  # a kept path's views share its sequence's cells: not moved apart
        states = []
        for seq in held:
            size = int(lib.llama_state_seq_get_size(context, seq))
            data = (ctypes.c_uint8 * size)()
            if int(lib.llama_state_seq_get_data(context, data, size, seq)) != size:
                raise RuntimeError(f"llama.cpp could not read sequence {seq}'s cells")
            states.append((seq, data, size))
        for seq, _, _ in states:
            self._remove(seq, 0)
        for seq, data, size in states:
            if int(lib.llama_state_seq_set_data(context, data, size, seq)) != size:
                raise RuntimeError(f"llama.cpp could not write sequence {seq}'s cells back")
        self.compactions += 1
        return True

    def _layout(self, p: SeqPass) -> _Layout:
        """Where each token of the pass goes: the cache's pending tokens first (in the sequence and in
        every view), then the pass's tokens, for a masked pass its first chain first."""
        cache, n = p.cache, len(p.tokens)
        positions = list(range(cache.length, cache.length + n)) if p.positions is None else list(p.positions)
        wanted = range(n) if _last_state(p) or p.logits == "all" else [n - 1] if p.logits == "last" else []
        outputs = [i in wanted for i in range(n)]
        pending = [(token, cache.placed + i) for i, token in enumerate(cache.pending)]
        if p.mask is None:
            return _Layout(
                [t for t, _ in pending] + list(p.tokens),
                [q for _, q in pending] + positions,
                [[cache.seq]] * (len(pending) + n),
                [False] * len(pending) + outputs,
                list(range(n)),
            )
        mask = p.mask.cpu()
        if mask.shape != (n, cache.length + n) or not bool(mask[:, : cache.length].all()):
            raise ValueError("a masked pass must see its whole cached prefix ([n, cached + n] mask)")
        attends = [frozenset(torch.nonzero(row).flatten().tolist()) for row in mask[:, cache.length :]]  # [n] sets
        for i, seen in enumerate(attends):
            if i not in seen or max(seen) > i or any(positions[j] > positions[i] for j in seen):
                raise ValueError("a masked pass's tokens must attend themselves and only earlier tokens and positions")
        order = _chain_first(attends)
        # A token shares the view of a token w when it is in w's view and attends exactly the part of
        # w's view up to its own position; the most attending tokens take views first.
        owner: dict[int, int] = {}
        for i in sorted(range(n), key=lambda t: -len(attends[t])):
            owner[i] = next(
                (
                    w
                    for w in dict.fromkeys(owner.values())
                    if i in attends[w] and attends[i] == {j for j in attends[w] if positions[j] <= positions[i]}
                ),
                i,
            )
        owners = list(dict.fromkeys(owner.values()))
        views: list[int] = []
        try:
            for _ in owners:
                views.append(self._take_id())
                if cache.placed:
                    self._copy(cache.seq, views[-1], 0, cache.placed)
        except BaseException:
            for view in views:
                self._release(view)
            raise
        view_of = dict(zip(owners, views))
        # Token j is in the view of every owner that attends it; its own view comes first.
        ids = [
            [view_of[owner[j]], *(view_of[w] for w in owners if w != owner[j] and j in attends[w])] for j in range(n)
        ]
        slots = [0] * n
        for place, i in enumerate(order):
            slots[i] = place
        return _Layout(
            [t for t, _ in pending] + [p.tokens[i] for i in order],
            [q for _, q in pending] + [positions[i] for i in order],
            [[cache.seq, *views]] * len(pending) + [ids[i] for i in order],
            [False] * len(pending) + [outputs[i] for i in order],
            slots,
            views,
            [row[0] for row in ids],
            attends,
        )

    def _run(self, passes: list[SeqPass], layouts: list[_Layout], step: int) -> tuple[list[dict], list[dict]]:
        """Decode every layout: the first pass of each sequence (its prompt, the same pass whatever
        the method or the batch) alone, in decodes of ROW_INVARIANT_ROWS tokens counted from the
        prompt's start, so its rows take the same kernels whatever shares the pool; every later
        pass in decodes of at most `step` (exact_rows) tokens, where each row gets the bits a
        one-token pass gives it. Returns, per pass, its logits rows and hidden rows by place in its
        layout."""
        entries = [(k, i) for k, layout in enumerate(layouts) for i in range(len(layout.tokens))]
        first = [(k, i) for k, i in entries if passes[k].cache.length == 0]
        later = [(k, i) for k, i in entries if passes[k].cache.length > 0]
        most = ROW_INVARIANT_ROWS
        chunks = []
        for k in sorted({k for k, _ in first}):  # a prompt alone: its rows' bits do not depend on others'
            own = [entry for entry in first if entry[0] == k]
            chunks += [own[j : j + most] for j in range(0, len(own), most)]
        chunks += [later[j : j + step] for j in range(0, len(later), step)]
        logits: list[dict] = [{} for _ in passes]
        hidden: list[dict] = [{} for _ in passes]
        try:
            for chunk in chunks:
                self._decode(passes, layouts, chunk)
                inputs = self._layer_input_rows(passes, chunk)  # layer -> [len(chunk), H], no copy
                for t, (k, i) in enumerate(chunk):
                    p = passes[k]
                    if p.hidden and p.taps:  # every token of the decode has its layers' inputs
                        hidden[k][i] = np.concatenate([inputs[layer][t] for layer in p.taps])  # [len(taps) H]
                    if not layouts[k].outputs[i]:
                        continue
                    if p.logits != "none":
                        logits[k][i] = self._row(self._lib.llama_get_logits_ith, t, self.vocab_size)
                    if _last_state(p):
                        hidden[k][i] = self._row(self._lib.llama_get_embeddings_ith, t, self.hidden_size)
        except BaseException:
            for p in passes:  # cells a failed pass left behind
                self._remove(p.cache.seq, p.cache.placed)
            raise
        return logits, hidden

    def _layer_input_rows(self, passes: list[SeqPass], chunk: list[tuple[int, int]]) -> dict[int, np.ndarray]:
        """The last decode's recorded layer inputs that this chunk's passes asked for: layer ->
        [len(chunk), H] fp32, a view of llama.cpp's buffer (valid until the next decode)."""
        layers = {layer for k, _ in chunk if passes[k].hidden for layer in passes[k].taps}
        rows = {}
        for layer in layers:
            pointer = self._layer_inputs.get(self._context, layer)
            if not pointer:
                raise RuntimeError(f"llama.cpp returned no inputs of layer {layer}")
            rows[layer] = np.ctypeslib.as_array(pointer, shape=(len(chunk), self.hidden_size))
        return rows

    def _decode(self, passes: list[SeqPass], layouts: list[_Layout], chunk: list[tuple[int, int]]) -> None:
        """One llama_decode of these (pass, place) entries, in order."""
        lib = self._lib
        batch = self._batch_for(len(chunk), max(len(layouts[k].ids[i]) for k, i in chunk))
        for t, (k, i) in enumerate(chunk):
            layout, ids = layouts[k], layouts[k].ids[i]
            batch.token[t], batch.pos[t] = layout.tokens[i], layout.positions[i]
            batch.n_seq_id[t], batch.logits[t] = len(ids), layout.outputs[i]
            for s, seq in enumerate(ids):
                batch.seq_id[t][s] = seq
        batch.n_tokens = len(chunk)
        hidden = any(_last_state(passes[k]) for k, _ in chunk)
        if hidden != self._embeddings:
            lib.llama_set_embeddings(self._context, hidden)
            self._embeddings = hidden
        code = lib.llama_decode(self._context, batch)
        if code == 1:
            raise NoCells("llama.cpp decode failed: no room left in the cache cells")
        if code != 0:
            raise ValueError(f"llama.cpp decode failed: error {code}")

    def _batch_for(self, tokens: int, width: int):
        handles = self.handles
        held_tokens, held_width = handles.batch_size
        if tokens > held_tokens or width > held_width:
            if handles.batch is not None:
                self._lib.llama_batch_free(handles.batch)
                handles.batch = None
            size = (max(tokens, 2 * held_tokens, 64), max(width, held_width, 1))
            handles.batch = self._lib.llama_batch_init(size[0], 0, size[1])
            handles.batch_size = size
        return handles.batch

    def _row(self, read, index: int, width: int) -> np.ndarray:
        """The output row [width] fp32 of the last decode's batch token `index`, copied out of llama.cpp."""
        pointer = read(self._context, index)
        if not pointer:
            raise RuntimeError(f"llama.cpp returned no output row for batch token {index}")
        return np.ctypeslib.as_array(pointer, shape=(width,)).copy()


def _last_state(p: SeqPass) -> bool:
    """Whether a pass asks for the last hidden state (llama.cpp's embeddings, output rows only),
    not for layer inputs (recorded for every row)."""
    return p.hidden and not p.taps


def _chain_first(attends: list[frozenset[int]]) -> list[int]:
    """The order a masked pass's tokens take cells in: its first chain (the first token, then each
    time the first token that attends exactly the chain so far and itself: a tree's most likely
    path, each node's first child), then the rest in their order. Every token still comes after
    what it attends, so its cells are in position order."""
    chain: list[int] = []
    seen: frozenset[int] = frozenset()
    for i, attended in enumerate(attends):
        if attended == seen | {i}:
            chain.append(i)
            seen = attended
    return chain + [i for i in range(len(attends)) if i not in seen]


class _Handles:
    """llama.cpp's model, context and batch, freed once, and the free sequence ids. Caches release
    their ids here (not into the backend), so whichever the garbage collector frees first, a
    release after close() does nothing."""

    def __init__(self, lib, model, context, max_sequences: int) -> None:
        self.lib, self.model, self.context = lib, model, context
        self.memory = lib.llama_get_memory(context)
        self.free_ids = list(range(max_sequences - 1, -1, -1))  # a stack: the lowest id first
        self.batch = None
        self.batch_size = (0, 0)  # (tokens, ids per token) the batch holds
        self.closed = False

    def release(self, seq: int) -> None:
        """A cache or view is done: free its cells and its id."""
        if not self.closed:
            self.lib.llama_memory_seq_rm(self.memory, seq, -1, -1)
            self.free_ids.append(seq)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.batch is not None:
            self.lib.llama_batch_free(self.batch)
        self.lib.llama_free(self.context)
        self.lib.llama_model_free(self.model)
