"""Recipes: each trainer's published (or, where none exists, measured) training settings.

A recipe gives, for one trainer on one family of zoo models, the values of the
``TrainConfig`` fields (optimizer, learning rate, momentum, weight decay, batch
size, ...) and of the engine's options that its authors trained with, each value
with its source. ``scripts/compare.py`` trains every trainer at its recipe by
default (``--settings recipe``); ``--settings shared`` gives every trainer the same
(default) settings instead. A flag the user passes overrides both.

Methods that approximate backprop on the same network (Highway-BP, DSF, FT-BPTT)
were trained by their authors with the same settings as their backprop baseline,
so they share one recipe per model family. The forward-only methods were not:
FOTON and PEPITA each have their own. Schedules are not part of the recipes
(the papers' step decays are tied to their 100-200 epoch budgets); every recipe
runs the Trainer's ``--schedule`` (constant unless given).

Sources (``../shared/papers`` summarises each):

* DSF: Caillon et al., arXiv 2503.23104, the authors' released PTB-word YAML configs (optimisation section).
* Highway-BP: Fagnou et al., ICLR 2025 (arXiv 2501.17086), Table 4 (ResNets, GPT-2) and App. C.1.
* FOTON: Caillon et al., ECAI 2025 (arXiv 2512.20668), the authors' released default run config (config.yaml).
* PEPITA: Srinivasan et al., ICLR 2024, the authors' code (github.com/ravifrancesco/PEPITA).
* FA, DFA and the sign-symmetric rules (usf, brsf, frsf): no setting published with the FOTON paper's table
  (Liao et al. 2016 train with batch normalisation and SGD, Xiao et al. 2018 on ImageNet ResNets): the project
  default, Adam 1e-3; on the zoo's GPT backprop's setting.
* measured: this project's runs (BENCHMARKS.md), where no paper states a setting.
"""

from __future__ import annotations

import dataclasses

from gradengines.trainers.core.errors import ConfigError
from gradengines.trainers.core.options import parse_options
from gradengines.trainers.core.registry import engine_class
from gradengines.trainers.run.config import SHARED_SETTINGS, TrainConfig

__all__ = ["Recipe", "RECIPES", "recipe_for", "check_recipe", "own_recipe", "LAYER_STACKS", "RECURRENT",
           "SHARED_SETTINGS", "FEEDBACK_FAMILY"]


LAYER_STACKS = ("mlp", "ortho_lenet", "ortho_convnet", "convnet")
RECURRENT = ("rnn_lm", "rnn_block_lm")

DSF_PTB = "DSF authors' PTB-word configs (arXiv 2503.23104, released code)"
HIGHWAY_T4 = "Highway-BP paper, Table 4 (arXiv 2501.17086)"
HIGHWAY_C1 = "Highway-BP paper, App. C.1: Adam 1e-3 for most models (arXiv 2501.17086)"
FOTON_CODE = "FOTON authors' default config (arXiv 2512.20668, released code, config.yaml)"
PEPITA_CODE = "PEPITA, Srinivasan et al. ICLR 2024 code (github.com/ravifrancesco/PEPITA)"
FEEDBACK_DEFAULT = ("project default (Adam 1e-3, batch 64): the FOTON paper reports FA and DFA without their settings; "
                    "compare.py --tune searches around it")
UNTUNED_LR = ("no learning rate is published for these models: tune it (compare.py --tune; the reference rows do, "
              "docs/results.md)")
FEEDBACK_FAMILY = ("fa", "usf", "brsf", "frsf", "dfa")
FEEDBACK_GPT = ("backprop's GPT setting (Highway-BP paper, Table 4): no FA-family setting for GPT-2 is published; "
                "the feedback's scale (scale=weight) is what keeps the gradient at backprop's size (BENCHMARKS.md)")
MEASURED = "measured: the project default (Adam 1e-3, batch 64; BENCHMARKS.md default comparison), no paper setting"
DIGITS_TUNED_FEEDBACK = ("tuned on validation of digits (orthogonal tanh MLP 4 x 64, seed 0; Adam, grid 1e-3..1e-1 by "
                         "10^0.5, 1e-1 diverging; the neighbours within one or two of 179 validation examples): "
                         "compare.py --trainers backprop,fa,usf,brsf,frsf,dfa --tune --tune-grid "
                         "lr=0.001,0.00316,0.01,0.0316,0.1 --seeds 0, 2026-12-07 (BENCHMARKS.md)")
MEZO_SETTINGS = "MeZO, Malladi et al. NeurIPS 2023, Algorithm 1 and App. E: plain SGD, eps 1e-3, batch 16"
FGRAD_SETTINGS = "Baydin et al. 2022, 'Gradients without backpropagation': plain SGD with one Gaussian direction"
FGRAD_ACT_SETTINGS = ("Ren et al. ICLR 2023, 'Scaling forward gradient with local losses': activity-perturbed, one "
                      "Gaussian direction, fgrad's plain SGD")
DIGITS_TUNED = ("tuned on validation of digits (orthogonal tanh MLP 4 x 64, seed 0; grid 1e-4..1e-2 by 10^0.5): "
                "scripts/benchmarks/reference.py run --rows digits-mlp, 2026-12-07, docs/results.md; the same as "
                "compare.py --tune on 2026-12-06 (BENCHMARKS.md, forward-only baselines)")
DIGITS_TUNED_UP = ("tuned on validation of digits (orthogonal tanh MLP 4 x 64, seed 0): 1e-2 was the top of the grid "
                   "1e-4..1e-2; the grid 1e-2..3.16e-1 gave 3.16e-2, diverging above (compare.py --tune --tune-grid "
                   "lr=0.01,0.0316,0.1,0.316, 2026-12-06, BENCHMARKS.md, forward-only baselines)")


@dataclasses.dataclass(frozen=True)
class Recipe:
    """Settings of ``trainer`` on the zoo models ``models`` (empty: any model).

    ``train`` maps ``TrainConfig`` fields and ``engine`` the engine's option fields to
    ``(value, source)`` pairs.
    """

    trainer: str
    models: tuple[str, ...]
    train: dict[str, tuple[object, str]]
    engine: dict[str, tuple[object, str]] = dataclasses.field(default_factory=dict)

    def train_values(self) -> dict:
        return {k: v for k, (v, _) in self.train.items()}

    def engine_values(self) -> dict:
        return {k: v for k, (v, _) in self.engine.items()}

    def sources(self) -> dict[str, str]:
        """Every value's source, engine options prefixed ``<trainer>.``."""
        return {**{k: s for k, (_, s) in self.train.items()},
                **{f"{self.trainer}.{k}": s for k, (_, s) in self.engine.items()}}


def _same(source: str, **values) -> dict[str, tuple[object, str]]:
    return {k: (v, source) for k, v in values.items()}


_ADAM_1E3 = _same(MEASURED, optimizer="adam", lr=1e-3, weight_decay=0.0, batch_size=64)
_RECURRENT = _same(DSF_PTB, optimizer="adam", lr=1e-3, weight_decay=1e-4, batch_size=128)
_RESNET = _same(HIGHWAY_T4, optimizer="sgd", lr=0.1, momentum=0.9, weight_decay=1e-4, batch_size=128)
_GPT = _same(HIGHWAY_T4, optimizer="adamw", lr=1e-3, weight_decay=0.1, batch_size=128, clip_grad_norm=1.0)
_RESIDUAL = _same(HIGHWAY_C1, optimizer="adam", lr=1e-3, weight_decay=0.0, batch_size=64)

RECIPES: list[Recipe] = [
    *(Recipe(t, RECURRENT, _RECURRENT) for t in ("backprop", "ftbptt", "highway", "tbptt")),
    Recipe("dsf", RECURRENT, _RECURRENT, _same(DSF_PTB, feedback="linspace")),
    *(Recipe(t, ("resnet",), _RESNET) for t in ("backprop", "highway")),
    *(Recipe(t, ("gpt",), _GPT) for t in ("backprop", "highway")),
    *(Recipe(t, ("residual_mlp",), _RESIDUAL) for t in ("backprop", "highway")),
    Recipe("foton", (), _same(FOTON_CODE, optimizer="sgd", lr=0.5, momentum=0.0, weight_decay=0.0, batch_size=256),
           _same(FOTON_CODE, temperature=1.0)),
    Recipe("pepita", (), _same(PEPITA_CODE, optimizer="sgd", lr=0.01, momentum=0.9, weight_decay=0.0, batch_size=64),
           _same(PEPITA_CODE, variant="iclr2024", feedback_scale=0.05)),
    *(Recipe(t, (), _same(FEEDBACK_DEFAULT, optimizer="adam", lr=1e-3, weight_decay=0.0, batch_size=64))
      for t in FEEDBACK_FAMILY),
    *(Recipe(t, ("gpt",), _same(FEEDBACK_GPT, optimizer="adamw", lr=1e-3, weight_decay=0.1, batch_size=128,
                                clip_grad_norm=1.0)) for t in FEEDBACK_FAMILY),
    # the forward-only estimators: their papers' optimizer and perturbation, a learning rate measured per model
    Recipe("mezo", (), {**_same(MEZO_SETTINGS, optimizer="sgd", momentum=0.0, weight_decay=0.0, batch_size=16),
                        **_same(UNTUNED_LR, lr=1e-3)}, _same(MEZO_SETTINGS, eps=1e-3, directions=1)),
    Recipe("fgrad", (), {**_same(FGRAD_SETTINGS, optimizer="sgd", momentum=0.0, weight_decay=0.0, batch_size=64),
                         **_same(UNTUNED_LR, lr=1e-3)}, _same(FGRAD_SETTINGS, directions=1, distribution="gaussian")),
    Recipe("fgrad_act", (), {**_same(FGRAD_ACT_SETTINGS, optimizer="sgd", momentum=0.0, weight_decay=0.0,
                                     batch_size=64), **_same(UNTUNED_LR, lr=1e-3)},
           _same(FGRAD_ACT_SETTINGS, directions=1, distribution="gaussian")),
    Recipe("backprop", (), _ADAM_1E3),
    # the default comparison's model: the learning rates no paper gives, measured (the rest of each recipe above)
    *(Recipe(t, ("mlp",), {**_same(MEASURED, optimizer="adam", weight_decay=0.0, batch_size=64),
                           **_same(DIGITS_TUNED_FEEDBACK, lr=lr)})
      for t, lr in (("backprop", 10 ** -2.5), ("usf", 10 ** -2.5), ("fa", 1e-2), ("brsf", 1e-2), ("frsf", 1e-2),
                    ("dfa", 1e-2))),
    Recipe("mezo", ("mlp",), {**_same(MEZO_SETTINGS, optimizer="sgd", momentum=0.0, weight_decay=0.0,
                                      batch_size=16), **_same(DIGITS_TUNED, lr=1e-3)},
           _same(MEZO_SETTINGS, eps=1e-3, directions=1)),
    Recipe("fgrad", ("mlp",), {**_same(FGRAD_SETTINGS, optimizer="sgd", momentum=0.0, weight_decay=0.0,
                                       batch_size=64), **_same(DIGITS_TUNED, lr=10 ** -2.5)},
           _same(FGRAD_SETTINGS, directions=1, distribution="gaussian")),
    Recipe("fgrad_act", ("mlp",), {**_same(FGRAD_ACT_SETTINGS, optimizer="sgd", momentum=0.0, weight_decay=0.0,
                                           batch_size=64), **_same(DIGITS_TUNED_UP, lr=10 ** -1.5)},
           _same(FGRAD_ACT_SETTINGS, directions=1, distribution="gaussian")),
]


def own_recipe(trainer: str) -> Recipe | None:
    """The recipe an engine from outside carries as its class attribute ``recipe``, ``{option: (value, source)}``
    (training options and its own options alike), as a ``Recipe`` for every model; None where it has none."""
    cls = engine_class(trainer)
    recipe = vars(cls).get("recipe")
    if recipe is None:
        return None
    check_recipe(trainer)
    options = {f.name for f in dataclasses.fields(cls.Options)}
    return Recipe(trainer, (), {k: v for k, v in recipe.items() if k not in options},
                  {k: v for k, v in recipe.items() if k in options})


def check_recipe(trainer: str) -> None:
    """An engine's own ``recipe`` names only training options (``TrainConfig``) and its own options, each value
    valid for it (``ConfigError``, one line, otherwise)."""
    cls = engine_class(trainer)
    recipe = vars(cls).get("recipe") or {}
    training = {f.name for f in dataclasses.fields(TrainConfig)}
    options = {f.name for f in dataclasses.fields(cls.Options)}
    unknown = sorted(set(recipe) - training - options)
    if unknown:
        raise ConfigError(f"engine '{trainer}': recipe key '{unknown[0]}' is neither a training option (optimizer, "
                          f"lr, momentum, weight_decay, batch_size, ...: gradengines.TrainConfig) nor one of its "
                          f"Options ({', '.join(sorted(options)) or 'it has none'})")
    try:
        parse_options(TrainConfig, {k: v for k, (v, _) in recipe.items() if k in training})
        parse_options(cls.Options, {k: v for k, (v, _) in recipe.items() if k in options})
    except ConfigError as err:
        raise ConfigError(f"engine '{trainer}': its recipe: {err}") from None


def recipe_for(trainer: str, model: str) -> Recipe | None:
    """The recipe of ``trainer`` on the zoo model named ``model`` (the most specific one), or None; an engine
    from outside, its own (``own_recipe``)."""
    matches = [r for r in RECIPES if r.trainer == trainer and (not r.models or model in r.models)]
    return min(matches, key=lambda r: not r.models, default=None) or own_recipe(trainer)
