"""Random-number state: seed everything from one seed, capture and restore it.

States are tensors and plain values only (NumPy's key array as a tensor), so a
checkpoint holding them loads with ``torch.load(weights_only=True)``.
"""

import os
import random

import numpy as np
import torch

__all__ = ["seed_everything", "rng_state", "set_rng_state", "torch_rng_state", "set_torch_rng_state"]


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (CPU and CUDA) and ask for deterministic kernels."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)


def torch_rng_state() -> dict:
    """The torch generators that dropout and initializers draw from (CPU, CUDA)."""
    state = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_torch_rng_state(state: dict) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])


def rng_state() -> dict:
    """All generators, for checkpoints."""
    name, key, pos, has_gauss, gauss = np.random.get_state(legacy=True)
    numpy_state = (name, torch.from_numpy(key.astype(np.int64)), int(pos), int(has_gauss), float(gauss))
    return {"python": random.getstate(), "numpy": numpy_state, "torch": torch_rng_state()}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    name, key, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, np.asarray(key, dtype=np.int64).astype(np.uint32), pos, has_gauss, gauss))
    set_torch_rng_state(state["torch"])
