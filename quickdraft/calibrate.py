"""Choose the self-speculative drafter's depth by measuring it: a short run per candidate."""

from __future__ import annotations

from tqdm import tqdm

CALIBRATION_PROMPT = "Explain in a few sentences why the sky is blue, then list three colours of the rainbow."


def candidate_depths(total_layers: int) -> list[int]:
    """Depths from a twelfth to half of the stack (1, 2, 3, 4 or 6 twelfths)."""
    return sorted({max(1, total_layers * twelfths // 12) for twelfths in (1, 2, 3, 4, 6)})


def calibrate_self_spec(base, method: str, k: int | None, *, tokens: int = 40, **settings):
    """The decoder (built from `base`'s models) whose first-L-layers drafter generated fastest.

    base: a Decoder over the target; settings: the other Decoder options. The measured tokens/s
    per depth are kept in the returned decoder's `calibration` attribute.
    """
    settings = {name: value for name, value in settings.items() if name != "layers"}
    depths = candidate_depths(base.target.layers)
    prompt = base.encode(CALIBRATION_PROMPT) if base.tokenizer is not None else list(range(1, 17))
    speeds: dict[int, float] = {}
    decoders = {}
    for depth in tqdm(depths, desc="calibrating self-spec depth", unit="depth"):
        decoder = base.with_method(method, k, layers=depth, **settings)
        decoder.generate(prompt, max_new_tokens=4)  # warm-up
        speeds[depth] = decoder.generate(prompt, max_new_tokens=tokens).stats.tokens_per_second
        decoders[depth] = decoder
    best = max(speeds, key=speeds.get)
    chosen = decoders[best]
    chosen.calibration = speeds
    return chosen
