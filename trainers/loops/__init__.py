"""The gradient engines inside other people's training loops: the Hugging Face Trainer (``trainers.loops.hf``) and
PyTorch Lightning (``trainers.loops.lightning``). Each is an optional extra, imported only by its own module."""
