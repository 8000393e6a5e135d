"""Drafters, one file per method, all behind the Drafter interface in drafter.py."""

from quickdraft.drafters.draft_model import DraftModelDrafter
from quickdraft.drafters.drafter import Draft, Drafter, DraftRequest, NoDrafter, StepOutcome
from quickdraft.drafters.lookahead import LookaheadDrafter
from quickdraft.drafters.prompt_lookup import PromptLookupDrafter, lookup_continuation

__all__ = [
    "Draft",
    "DraftModelDrafter",
    "DraftRequest",
    "Drafter",
    "LookaheadDrafter",
    "NoDrafter",
    "PromptLookupDrafter",
    "StepOutcome",
    "lookup_continuation",
]
