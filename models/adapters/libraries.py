"""A Hugging Face transformers architecture by name, randomly initialised and sized to the task.

    python scripts/train.py --model transformers:GPT2LMHeadModel --model-option n_layer=2 \\
        --model-option n_embd=64 --model-option n_head=2 --task ptb-word
    models.build("transformers:BertForTokenClassification", input_vocab=10, out_features=9, num_hidden_layers=2)

A reference to a transformers model class (``transformers:NAME`` or its own module) builds
``NAME(NAMEConfig(**options))``: never ``from_pretrained``, so nothing is downloaded. The options
are the config's fields (one not in the config is refused in one line: a config class would
silently keep any keyword). Sizes the options leave out are read from the task:

* token inputs: ``vocab_size`` = the number of input ids; a causal LM's (and an
  encoder-decoder's: ``...ForConditionalGeneration``, ``...MTModel``) outputs are its
  vocabulary, so there it is the task's number of classes (a task whose input ids exceed its
  classes is refused; the ``reverse`` task has one vocabulary);
* a classifier (``...For*Classification``): ``num_labels`` = the task's classes;
* image inputs (C, H, W): ``num_channels`` and ``image_size`` where the config has them;
* positions: ``n_positions`` / ``max_position_embeddings`` raised to the sequence length.

timm needs nothing of this: ``--model timm:create_model --model-option model_name=resnet18
--model-option num_classes=10 --model-option in_chans=1`` calls its factory with those options
(``pretrained`` stays False).
"""

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from torch import nn

from gradengines.models.errors import ModelConfigError, one_line

__all__ = ["is_transformers_class", "transformers_factory", "LAYER_COUNTS"]

LAYER_COUNTS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "encoder_layers", "decoder_layers",
                "num_decoder_layers")
"""Config fields that count identical layers: a model's memory grows linearly in each."""

_POSITIONS = ("n_positions", "max_position_embeddings")


def is_transformers_class(target: Any) -> bool:
    """Whether ``target`` is a transformers model class (a ``PreTrainedModel`` with a config class)."""
    config = getattr(target, "config_class", None)
    return (isinstance(target, type) and issubclass(target, nn.Module) and isinstance(config, type)
            and hasattr(config, "to_dict") and target.__module__.startswith("transformers."))


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """transformers' warnings about tiny configs (special token ids outside a small vocabulary) hidden."""
    from transformers.utils import logging

    level = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(level)


def _sizes(cls: type, defaults: Any, options: dict, in_features, out_features, input_vocab, input_shape) -> dict:
    """The config fields the task sizes and the options leave out (module docstring)."""
    name = cls.__name__
    causal = name.endswith(("ForCausalLM", "LMHeadModel", "ForConditionalGeneration", "MTModel"))
    sized: dict[str, Any] = {}
    if input_vocab is not None and hasattr(defaults, "vocab_size"):
        if causal and out_features is not None:
            if input_vocab > out_features:
                raise ModelConfigError(f"{name}'s outputs are its vocabulary, but the task's inputs have "
                                       f"{input_vocab} ids and its outputs {out_features} classes; use a model "
                                       f"with a separate head (e.g. ...ForTokenClassification), or a task with one "
                                       f"vocabulary (reverse)")
            sized["vocab_size"] = out_features
        else:
            sized["vocab_size"] = input_vocab
    if "Classification" in name and out_features is not None:
        sized["num_labels"] = out_features
    if input_shape is not None and len(input_shape) == 3:
        channels, height, width = input_shape
        if hasattr(defaults, "num_channels"):
            sized["num_channels"] = channels
        if hasattr(defaults, "image_size") and height == width:
            sized["image_size"] = height
    if input_vocab is not None and input_shape:
        for key in _POSITIONS:
            if hasattr(defaults, key) and getattr(defaults, key) < input_shape[-1]:
                sized[key] = input_shape[-1]
    return {k: v for k, v in sized.items() if k not in options}


def transformers_factory(cls: type) -> Callable[..., nn.Module]:
    """A factory ``(in_features, out_features, input_vocab, input_shape, **config) -> cls(config)``
    (module docstring); it names the task's sizes, so the command line passes them."""

    def build(in_features: int | None = None, out_features: int | None = None, input_vocab: int | None = None,
              input_shape: tuple | None = None, **options: Any) -> nn.Module:
        config_class = cls.config_class  # type: ignore[attr-defined]
        with _quiet():
            defaults = config_class()
            unknown = sorted(k for k in options if not hasattr(defaults, k) and k != "num_labels")
            if unknown:
                fields = sorted(k for k in defaults.to_dict() if not k.startswith("_"))
                raise ModelConfigError(f"{cls.__name__}: {config_class.__name__} has no field "
                                       f"{', '.join(unknown)}; its fields: {', '.join(fields[:40])}")
            sized = _sizes(cls, defaults, options, in_features, out_features, input_vocab, input_shape)
            try:
                return cls(config_class(**sized, **options))
            except Exception as err:  # a config transformers rejects (heads not dividing the width, ...)
                raise ModelConfigError(f"{cls.__name__} could not be built with {options}: {one_line(err)}") \
                    from None

    build.layer_counts = LAYER_COUNTS  # type: ignore[attr-defined]  # what check_fits_scaled extrapolates
    build.__name__ = build.__qualname__ = cls.__name__
    build.__doc__ = f"{cls.__name__}({cls.config_class.__name__}(**options)), sized to the task."  # type: ignore
    return build
