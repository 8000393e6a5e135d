"""Sampling noise drawn from (seed, position) alone, so a seed means the same text.

Gumbel-max: with g ~ Gumbel(0, 1) drawn independently per token, argmax(log p + g) is an exact
sample of p. If each position's g depends only on the seed and the position, the token chosen
there depends only on the prefix and the seed: not on how many tokens were drafted, which tree,
which sequences shared the pass, or when. Speculative decoding then accepts a drafted token
exactly when it equals that argmax, and its text is plain seeded decoding's, token for token.

g is a hash of (seed, position, token id), computed for a whole row in a few vectorised integer
operations (a CPU generator seeded per position measured 2-4x slower here), and each row is kept
until the sequence has passed its position: the drafter and the verifier read the same rows, and a
position is hashed once however often it is drafted and verified.
"""

from __future__ import annotations

import torch

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15  # splitmix64's increment: consecutive positions land far apart


def _signed(value: int) -> int:
    """A 64-bit pattern as the int64 torch stores."""
    value &= _MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


_MIX1, _MIX2 = _signed(0xBF58476D1CE4E5B9), _signed(0x94D049BB133111EB)


def _mix(x: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser on int64 (shifts masked to be logical): every input bit moves every output bit."""
    x = x ^ ((x >> 30) & ((1 << 34) - 1))
    x = x * _MIX1  # wraps modulo 2^64, as the finaliser wants
    x = x ^ ((x >> 27) & ((1 << 37) - 1))
    x = x * _MIX2
    return x ^ ((x >> 31) & ((1 << 33) - 1))


def position_key(seed: int, position: int) -> int:
    """One 64-bit key per (seed, position), as int64: the seed mixed, then its stream's step at `position`
    mixed again (two seeds' streams do not meet at shifted positions)."""
    mixed_seed = _mix(torch.tensor([_signed(seed)], dtype=torch.int64))
    return int(_mix(mixed_seed + _signed((position + 1) * _GOLDEN))[0])  # int64 addition wraps, as uint64's


def gumbel_row(seed: int, position: int, vocab: int) -> torch.Tensor:
    """[V] Gumbel(0, 1) noise for every token id at `position`, from (seed, position) alone."""
    x = _mix(torch.arange(vocab, dtype=torch.int64) * _signed(_GOLDEN) ^ position_key(seed, position))  # [V]
    return gumbel_of_bits((x >> 41) & ((1 << 23) - 1))


def gumbel_of_bits(bits: torch.Tensor) -> torch.Tensor:
    """Integers in [0, 2^23) -> Gumbel(0, 1) noise, always finite: u = (bits + 1/2) / 2^23 has 24
    significant bits, so float32 holds it exactly, strictly between 0 and 1 (with 24 random bits
    the largest u would round to 1.0, and -log(-log 1) is +inf, which argmax takes over any p)."""
    u = (bits.float() + 0.5) * 2.0**-23
    return -torch.log(-torch.log(u))


class PositionNoise:
    """One sequence's noise: rows [V] by position, for the target's `vocab` ids, kept until forgotten."""

    def __init__(self, seed: int, vocab: int) -> None:
        self.seed, self.vocab = seed, vocab
        self._rows: dict[int, torch.Tensor] = {}

    def row(self, position: int) -> torch.Tensor:
        """[V] the noise at `position` (a token's position: its index in the sequence)."""
        if position not in self._rows:
            self._rows[position] = gumbel_row(self.seed, position, self.vocab)
        return self._rows[position]

    def rows(self, positions: list[int]) -> torch.Tensor:
        """[len(positions), V] the noise at each position."""
        return torch.stack([self.row(p) for p in positions]) if positions else torch.empty(0, self.vocab)

    def forget_before(self, position: int) -> None:
        """Drop the rows of positions already decoded: they are never read again."""
        for old in [p for p in self._rows if p < position]:
            del self._rows[old]
