"""One training run: the Trainer, its configuration, optimizers, run directory, checkpoints,
logs, HParams, progress, memory and thread checks, gradient agreement."""
