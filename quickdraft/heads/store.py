"""Where trained heads are found: a folder the user names, or the heads shipped in this package
for the embedded default target (made by `quickdraft train`; the command is in their README)."""

from __future__ import annotations

from pathlib import Path

import torch

from quickdraft.errors import QuickdraftError
from quickdraft.heads.eagle3 import Eagle3Head
from quickdraft.heads.eagle_head import EagleHead
from quickdraft.heads.export import export_summary, is_export, read_export
from quickdraft.heads.format import CONFIG_FILE, HEADS_FILE, load_eagle, load_medusa, read_config
from quickdraft.heads.medusa_heads import MedusaHeads
from quickdraft.models.loading import LoadedModel
from quickdraft.models.weights import EMBED, LM_HEAD

SHIPPED = Path(__file__).parent / "shipped"  # SHIPPED / <target name> / <kind> / heads.safetensors


def head_folder(kind: str, target: LoadedModel, path: str | Path | None) -> Path:
    """The folder of a `kind` head for `target`: `path` if given, else the shipped one."""
    folder = Path(path) if path is not None else SHIPPED / target.name / kind
    exported = kind == "eagle" and is_export(folder)  # an EAGLE-3 head exported for vLLM or SGLang
    if not exported and (not (folder / HEADS_FILE).is_file() or not (folder / CONFIG_FILE).is_file()):
        if path is not None:
            raise QuickdraftError(f"no {kind} head in {folder} (expected {HEADS_FILE} and {CONFIG_FILE})")
        raise QuickdraftError(
            f"no {kind} head is shipped for {target.name!r}; train one with `quickdraft train {kind} "
            f"--target ... --data ... --output DIR` and pass head=DIR (--head DIR)"
        )
    config = export_summary(folder) if exported else read_config(folder)
    shape = (target.vocab_size, int(target.config.hidden_size))
    if config.get("kind") != kind:
        raise QuickdraftError(f"{folder} holds a {config.get('kind')!r} head, not {kind!r}")
    if (config["vocab"], config["hidden"]) != shape:
        raise QuickdraftError(
            f"the {kind} head in {folder} was trained for {config.get('target')!r} (vocabulary {config['vocab']}, "
            f"hidden size {config['hidden']}); {target.name!r} has {shape[0]} and {shape[1]}"
        )
    return folder


def load_head(
    kind: str, target: LoadedModel, path: str | Path | None, full_vocab: bool = False
) -> MedusaHeads | EagleHead | Eagle3Head:
    """The head, over the target's LM head sliced to the head's draft vocabulary, or over all of
    it with full_vocab (the head's layers predict states, not ids, so either works)."""
    folder = head_folder(kind, target, path)
    lm_head = target.tensor(LM_HEAD).float()
    if kind == "medusa":
        head = load_medusa(folder, lm_head)
    elif is_export(folder):
        head = read_export(folder, target.tensor(EMBED).float())
    else:
        head = load_eagle(folder, lm_head, target.tensor(EMBED).float())
    if full_vocab:
        if isinstance(head, Eagle3Head):
            raise QuickdraftError(
                f"the EAGLE-3 head in {folder} has its own LM head over {len(head.vocab)} tokens; "
                "full_vocab applies to heads that use the target's LM head (EAGLE-1, Medusa)"
            )
        head.vocab = torch.arange(lm_head.shape[0])
        head.lm_head = lm_head.float()
    return head


def has_head(kind: str, target: LoadedModel) -> bool:
    """Whether a `kind` head for `target` is shipped (bench "all" runs the head methods only then)."""
    try:
        head_folder(kind, target, None)
    except QuickdraftError:
        return False
    return True
