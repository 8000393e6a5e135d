"""Self-distillation: replace each training response with the target's own greedy continuation.

Heads draft what the target will say, so they learn best from the target's outputs rather
than from the dataset's (often a bigger model's) wording. Prompts run in batches through
transformers' generate (left-padded), which is many times faster per token than one at a time.
"""

from __future__ import annotations

import torch
from tqdm import tqdm
from transformers import PreTrainedModel

from quickdraft.heads.features import Sequence


@torch.inference_mode()
def regenerate(model: PreTrainedModel, sequences: list[Sequence], pad_id: int, eos_ids: list[int],
               max_new_tokens: int, batch_size: int = 32, progress: bool = True) -> list[Sequence]:
    """Each sequence's prompt followed by the target's greedy response (ending at EOS or the cap)."""
    # Similar lengths share a batch, so little compute goes to padding.
    order = sorted(range(len(sequences)), key=lambda i: sequences[i][1])
    result: list[Sequence | None] = [None] * len(sequences)
    bar = tqdm(total=len(sequences), desc="self-distill", unit="example", disable=not progress)
    for first in range(0, len(order), batch_size):
        chosen = order[first : first + batch_size]
        prompts = [sequences[i][0][: sequences[i][1]] for i in chosen]
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts])  # [B, width], left-padded
        attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])  # [B, width]
        out = model.generate(input_ids=ids.to(model.device), attention_mask=attention.to(model.device),
                             max_new_tokens=max_new_tokens,
                             do_sample=False, eos_token_id=eos_ids, pad_token_id=pad_id).cpu()
        for row, i in enumerate(chosen):
            response = out[row, width:].tolist()
            ends = [n for n, token in enumerate(response) if token in eos_ids]
            response = response[: ends[0] + 1] if ends else response  # keep the EOS: heads learn to stop
            result[i] = (prompts[row] + response, len(prompts[row]))
        bar.update(len(chosen))
    bar.close()
    return [r for r in result if r is not None]
