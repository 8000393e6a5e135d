"""Draft heads on the target's own hidden states (Medusa, EAGLE-1, EAGLE-3) as drafting reads them:
the models, their on-disk format, where they are found, drafting copies and export. Training
them is quickdraft/training/, which nothing here imports."""
