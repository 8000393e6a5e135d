"""Draft heads trained on the target's own hidden states (Medusa, EAGLE): data, features, training."""
