"""`quickdraft serve`: an OpenAI-compatible HTTP server with batched speculative decoding."""

from quickdraft.serve.app import create_app
from quickdraft.serve.scheduler import Job, Scheduler

__all__ = ["Job", "Scheduler", "create_app"]
