"""quickdraft: lossless speculative decoding for Hugging Face causal language models."""

from quickdraft.decoder import Decoder, GenerationOutput, load
from quickdraft.drafters import Draft, Drafter
from quickdraft.engine import Generation
from quickdraft.errors import QuickdraftError
from quickdraft.methods import METHODS
from quickdraft.models import LoadedModel, load_model
from quickdraft.sampling import SamplingParams
from quickdraft.stats import Stats, StepRecord
from quickdraft.verify import Verdict, verify

__version__ = "0.1.0"

__all__ = [
    "METHODS",
    "Decoder",
    "Draft",
    "Drafter",
    "Generation",
    "GenerationOutput",
    "LoadedModel",
    "QuickdraftError",
    "SamplingParams",
    "Stats",
    "StepRecord",
    "Verdict",
    "load",
    "load_model",
    "verify",
]
