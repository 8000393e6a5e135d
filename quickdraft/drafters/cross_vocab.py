"""Drafting with a model whose tokenizer differs from the target's (for example a SmolLM2 draft for a
Gemma 3 target), lossless: the token-level intersection of Timor et al. 2025 ("Accelerating LLM
inference with lossless speculative decoding algorithms for heterogeneous vocabularies", TLI).

Tokens are matched by the bytes they spell inside a text (a leading space included, byte-fallback
pieces as their byte), so boundaries and spaces mean the same on both sides. The draft model
drafts only tokens the target also has: its distribution is renormalised over that intersection,
q, and each drafted token maps to one target token. Verification is the usual rejection sampler
with that q (any q keeps the target's distribution exactly), and greedy output is the target's
greedy output token for token.

The draft reads the text in its own tokens: accepted drafts are its own ids; a target token it
has no id for is re-tokenised from its bytes (bytes that are not yet whole characters wait for
the rest); a special token is re-tokenised from its text.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedTokenizerBase

from quickdraft.backends.backend import Backend, Cache, SeqPass
from quickdraft.drafters.drafter import Draft, DraftRequest, SequenceDrafter, StepOutcome
from quickdraft.sampling import gumbel_pick, logits_to_probs, sample

BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece's byte fallback


def _byte_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet: each printable stand-in character -> the byte it spells."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = list(kept), 0
    for byte in range(256):
        if byte not in kept:
            kept.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(kept, chars)}


def token_bytes(tokenizer: PreTrainedTokenizerBase) -> list[bytes | None]:
    """The bytes each token id spells inside a text (None: a special token, or one that spells
    nothing), for byte-level BPE (GPT-2, Llama 3, SmolLM), SentencePiece-style (Gemma, Llama 2:
    '▁' for a space, <0xNN> byte pieces) and plain vocabularies."""
    tokenizer_json = json.loads(tokenizer.backend_tokenizer.to_str())
    decoder = tokenizer_json.get("decoder") or {}
    parts = decoder.get("decoders") or [decoder]
    byte_level = any(part.get("type") == "ByteLevel" for part in parts)
    metaspace = any(
        part.get("type") == "Metaspace"
        or (part.get("type") == "Replace" and part.get("pattern", {}).get("String") == "▁")
        for part in parts
    )
    special = set(tokenizer.all_special_ids) | {i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
    alphabet = _byte_alphabet() if byte_level else {}
    spelled: list[bytes | None] = []
    for token_id, piece in enumerate(tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))):
        if piece is None or token_id in special:
            spelled.append(None)
        elif byte_level:
            try:
                spelled.append(bytes(alphabet[c] for c in piece))
            except KeyError:  # an added token written as plain text
                spelled.append(piece.encode())
        elif metaspace and BYTE_PIECE.fullmatch(piece):
            spelled.append(bytes([int(BYTE_PIECE.fullmatch(piece).group(1), 16)]))
        else:
            spelled.append((piece.replace("▁", " ") if metaspace else piece).encode())
    return [b if b else None for b in spelled]


@dataclass
class VocabMap:
    """The intersection of two vocabularies by spelled bytes."""

    draft_to_target: torch.Tensor  # [draft logits] long: the target id spelling the same bytes, or -1
    target_to_draft: dict[int, int]
    target_spelling: list[bytes | None]  # bytes of each target id (None: special)
    target_text: list[str]  # each target id as its tokenizer writes it (special tokens re-tokenised from this)

    @classmethod
    def build(cls, target: PreTrainedTokenizerBase, draft: PreTrainedTokenizerBase, draft_logits: int) -> VocabMap:
        target_spelling, draft_spelling = token_bytes(target), token_bytes(draft)
        by_bytes: dict[bytes, int] = {}
        for token_id, spelled in enumerate(target_spelling):
            if spelled is not None:
                by_bytes.setdefault(spelled, token_id)
        draft_to_target = torch.full((draft_logits,), -1, dtype=torch.long)
        target_to_draft: dict[int, int] = {}
        for token_id, spelled in enumerate(draft_spelling[:draft_logits]):
            target_id = by_bytes.get(spelled) if spelled is not None else None
            if target_id is not None and target_id not in target_to_draft:
                draft_to_target[token_id] = target_id
                target_to_draft[target_id] = token_id
        return cls(
            draft_to_target,
            target_to_draft,
            target_spelling,
            target.convert_ids_to_tokens(list(range(len(target_spelling)))),
        )

    @property
    def shared(self) -> int:
        return len(self.target_to_draft)


@dataclass
class CrossState:
    """One sequence on the draft's side: the text in draft ids, how many target tokens they spell,
    bytes still waiting to be whole characters, and the last proposal."""

    cache: Cache  # holds a prefix of `tokens`
    tokens: list[int] = field(default_factory=list)
    synced: int = 0
    waiting: bytes = b""
    drafted: list[int] = field(default_factory=list)
    base: int = 0  # len(tokens) when the proposal was made


class CrossVocabDrafter(SequenceDrafter):
    """A draft model of another vocabulary, drafting over the intersection (TLI)."""

    def __init__(
        self,
        backend: Backend,
        tokenizer: PreTrainedTokenizerBase,
        vocab: VocabMap,
        target_vocab: int,
        confidence: float | None = None,
    ) -> None:
        self.backend, self.tokenizer, self.vocab = backend, tokenizer, vocab
        self.target_vocab, self.confidence = target_vocab, confidence
        self.outside = (vocab.draft_to_target < 0).to(backend.device)  # [V'] draft ids the target lacks
        self.shared_ids = (vocab.draft_to_target >= 0).nonzero()[:, 0]  # [S] draft ids in the intersection
        self.shared_targets = vocab.draft_to_target[self.shared_ids]  # [S] their target ids

    def begin(self, prompt_ids: list[int], hidden: torch.Tensor | None) -> CrossState:
        state = CrossState(self.backend.new_cache())
        self._sync(state, prompt_ids)
        return state

    def _sync(self, state: CrossState, target_tokens: list[int]) -> None:
        """Append the target tokens the draft has not read yet, in draft ids."""
        for token in target_tokens[state.synced :]:
            own = self.vocab.target_to_draft.get(token)
            spelled = self.vocab.target_spelling[token] if token < len(self.vocab.target_spelling) else None
            if own is not None and not state.waiting:
                state.tokens.append(own)
            elif spelled is None:  # a special token: its text, as the draft tokenizer reads it
                self._flush(state, errors="replace")
                state.tokens += self._encode(
                    self.vocab.target_text[token] if token < len(self.vocab.target_text) else ""
                )
            else:
                state.waiting += spelled
                self._flush(state)
        state.synced = len(target_tokens)

    def _flush(self, state: CrossState, errors: str = "strict") -> None:
        """Re-tokenise waiting bytes once they are whole characters (or now, with stand-ins)."""
        if not state.waiting:
            return
        try:
            text = state.waiting.decode("utf-8", errors=errors)
        except UnicodeDecodeError:
            return  # part of a character: wait for the rest
        state.waiting = b""
        state.tokens += self._encode(text)

    def _encode(self, text: str) -> list[int]:
        ids = self.tokenizer.encode(text, add_special_tokens=False) if text else []
        return [t for t in ids if t < self.backend.vocab_size]

    @torch.inference_mode()
    def draft(self, request: DraftRequest) -> Draft:
        state = request.state
        self._sync(state, request.tokens)
        state.drafted, state.base = [], len(state.tokens)
        room = self.backend.max_length - len(state.tokens)
        if request.k < 1 or not state.tokens or state.waiting or room < 1:
            return Draft()  # nothing to draft from, or half a character pending
        cache = state.cache
        cache.truncate(min(cache.length, len(state.tokens) - 1))  # feed at least the newest token
        feed = state.tokens[cache.length :]
        targets, probs = [], []
        for _ in range(min(request.k, room)):
            logits = self.backend.forward([SeqPass(cache, feed, logits="last")])[0].logits[0]  # [V']
            logits = logits.masked_fill(self.outside, float("-inf"))  # the intersection only
            if request.sampling.greedy:
                token = int(logits.argmax())
                top = torch.softmax(logits, -1)[token] if self.confidence is not None else None
            else:
                q = logits_to_probs(logits.cpu(), request.sampling)  # [V'], processed exactly like p
                if request.noise is None:
                    token = sample(q, request.generator)
                else:  # each draft id reads the noise of the target id it drafts
                    position = len(request.tokens) + len(targets)
                    token = gumbel_pick(q, request.noise.row(position)[self.vocab.draft_to_target.clamp_min(0)])
                spread = torch.zeros(self.target_vocab)  # q over the target's ids: the same numbers, moved
                spread[self.shared_targets] = q[self.shared_ids]
                probs.append(spread)
                top = q.max()
            state.drafted.append(token)
            targets.append(int(self.vocab.draft_to_target[token]))
            if self.confidence is not None and float(top) < self.confidence:
                break
            feed = [token]
        return Draft(targets, torch.stack(probs) if probs else None)

    def update(self, state: CrossState, outcome: StepOutcome) -> None:
        """Accepted drafts are the draft's own ids (one per target token); the rest is synced next time."""
        accepted = len(outcome.path)
        state.tokens = state.tokens[: state.base] + state.drafted[:accepted]
        state.synced += accepted
        state.cache.truncate(min(state.cache.length, len(state.tokens)))
        state.drafted = []
