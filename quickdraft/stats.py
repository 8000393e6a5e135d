"""What one generation did: a record per target pass, and the totals a user reads."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from quickdraft.sampling import TokenLogprob


@dataclass
class StepRecord:
    """One target pass."""

    k: int  # draft tokens asked for this step (the drafter may propose fewer)
    draft_tokens: list[int]  # what the drafter proposed (K of them, possibly fewer)
    accepted: int  # how many leading draft tokens the target accepted
    next_token: int  # the recovered token, or the bonus token when all were accepted
    bonus: bool  # True when next_token is a bonus token
    emitted: list[int]  # tokens this step added to the output (cut at a stop condition)
    draft_time: float  # seconds spent drafting
    verify_time: float  # seconds in the target pass and the rejection sampler
    tree_depth: int | None = None  # deepest draft node when the draft was a tree (None: a chain)
    logprobs: list[TokenLogprob] | None = None  # each emitted token's, when the generation asked for them

    @property
    def draft_positions(self) -> int:
        """Positions drafted: K for a chain, the depth for a tree (whose accepted path has one
        node per depth), so acceptance by position means the same for both."""
        return len(self.draft_tokens) if self.tree_depth is None else self.tree_depth

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Stats:
    """Totals over one generation. Times are wall-clock seconds."""

    prompt_tokens: int = 0
    new_tokens: int = 0
    target_passes: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    prefill_time: float = 0.0
    draft_time: float = 0.0
    verify_time: float = 0.0
    wall_time: float = 0.0
    finish_reason: str = ""
    accepted_by_position: list[int] = field(default_factory=list)  # accepted count at draft position i
    drafted_by_position: list[int] = field(default_factory=list)  # drafts reaching position i (tree: depth)

    @property
    def acceptance_rate(self) -> float:
        """alpha: accepted draft tokens / drafted tokens."""
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0

    @property
    def mean_accepted_tokens(self) -> float:
        """tau: new tokens per target pass (>= 1), Spec-Bench's 'mean accepted tokens'."""
        return self.new_tokens / self.target_passes if self.target_passes else 0.0

    @property
    def tokens_per_second(self) -> float:
        """New tokens over the whole generation's wall time, prefill included."""
        return self.new_tokens / self.wall_time if self.wall_time > 0 else 0.0

    def add_step(self, step: StepRecord) -> None:
        self.target_passes += 1
        self.new_tokens += len(step.emitted)
        self.drafted_tokens += len(step.draft_tokens)
        self.accepted_tokens += step.accepted
        self.draft_time += step.draft_time
        self.verify_time += step.verify_time
        for position in range(step.draft_positions):
            if position == len(self.drafted_by_position):
                self.drafted_by_position.append(0)
                self.accepted_by_position.append(0)
            self.drafted_by_position[position] += 1
            self.accepted_by_position[position] += int(position < step.accepted)

    def to_dict(self) -> dict:
        data = asdict(self)
        data["acceptance_rate"] = self.acceptance_rate
        data["mean_accepted_tokens"] = self.mean_accepted_tokens
        data["tokens_per_second"] = self.tokens_per_second
        return data

    def summary(self) -> str:
        """One line for a terminal."""
        return (
            f"{self.new_tokens} tokens in {self.wall_time:.2f}s ({self.tokens_per_second:.1f} tok/s), "
            f"{self.target_passes} target passes, mean accepted length {self.mean_accepted_tokens:.2f}, "
            f"acceptance rate {self.acceptance_rate:.1%} ({self.accepted_tokens}/{self.drafted_tokens})"
        )
