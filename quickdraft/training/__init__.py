"""`quickdraft train`: training data -> self-distilled sequences -> cached target features -> a
trained draft head, written in the on-disk format the runtime reads (quickdraft/heads/format.py)."""
