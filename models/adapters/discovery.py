"""The residual structure of a model, found from one example run instead of declared.

    stack = models.residual_stack(gpt2, example=tokens)      # no stem, blocks or head: found
    trainers.build_engine("highway", k=2).compute_grads(stack, tokens, targets, loss_fn)

One run of the example with a hook on every module records the calls in order. The
**blocks** are the longest chain of calls of one module class with parameters (or of items of one
``nn.ModuleList`` or ``nn.Sequential``, whatever their classes, that keep the state's shape: a hybrid's
Mamba and attention layers) in which each call's first tensor argument is the previous call's first output tensor
(``transformer.h``, ``model.layers``, ``bert.encoder.layer``, ``blocks``, ``layer1..4``), or the
output of one **join** given the previous one's: a module called on the state alone between two
stages of blocks that keep the state's shape (ConvNeXt's and Swin's downsampling); a join is an
exact boundary, and a chain needs two blocks fed one by the other somewhere. Chains of different kinds
follow one another across stages (a hybrid convnet's convolution stages, then its attention stages: timm's
CoAtNet) where each is fed the last one's output, directly or through one join; such a stitched chain is
kept only where it reproduces the model's outputs on the example, else the longest single chain is.
The **stem** is the model's forward up to the first block: each batch runs it and stops at
the first block, keeping the arguments the forward passes to it (attention masks, rotary
cos/sin: rebuilt for every batch, never replayed from the example; a KV cache is dropped).
The **head** is the forward after the last block: the forward runs again with every block
passing its input through and the last one returning the state given (the stem is computed
a second time, in eval mode: no second update of BatchNorm statistics, no dropout draw).

Each block is read as ``h' = r(h, g(h))`` (the Highway-BP paper's Table 1), from the module
that produces its output:

* ``relu``: the block ends in an activation of the sum (the original ResNet, timm's
  BasicBlock / Bottleneck): ``r = act(h + z)``, z = the activation's input minus h (read
  before the activation runs, so an in-place one cannot change it), K = diag(act'(h + z)).
* ``post_ln``: the block ends in a LayerNorm of the sum (BERT): ``LN(u) = h a + b`` with
  u = h + z, a = gamma / sigma(u), b = (u - h - mu(u)) gamma / sigma(u) + beta, so
  ``r = h a + b`` with z = [a, b] and K = diag(a) (the paper's App. C.3, gamma = 0).
* ``scaled``: a scaled skip ``u = a h + f(h)``, ``a`` a learned or fixed scalar or vector (Doge's
  ``input_residual``): where u, with every **mixer** (a child with parameters, not a norm, that keeps
  the state's shape) returning zeros, is a h on the example, ``a`` not 1 or depending on the block's
  parameters: ``r = h a + b`` with z = [a, b], a that sum at h = 1 (its graph to the learned scale kept),
  b = u - a h, K = diag(a) (the paper's Table 1 form, as ``post_ln``'s).
* ``add``: anything else, ``r = h + z`` with z = block(h) - h, K = I.

A block made of two residual sublayers is split where it is visible and checked on the
example: a pre-LN block (its first child a norm, called again later: GPT-2, Llama, ViT,
nanoGPT) at the second norm's input, the second sublayer computed with the first mixer
(attention) returning zeros (not where the first skip is scaled: the second sublayer would be
given a1 h; Doge's whole layer is then one, a = a1 a2); a post-LN block whose first child ends in a LayerNorm (BERT's
attention) at that child's output, the second computed with the child passing its input
through. The blocks may read tensors besides the state that depend on trainable parameters, **side
inputs** (an encoder's output read by every decoder block's cross-attention, a relative-position
table or bias computed once and given to every block): each batch's side inputs are replaced, in
what the blocks are given, by leaves (``ResidualFound.side_inputs``); Highway-BP sums each leaf's
cotangents over the blocks and backpropagates them through whatever computed it (the encoder, the
table). A block whose output shape differs from its input's (a strided ResNet block with a
projection shortcut) is a **boundary**: Highway-BP runs within the segments between
boundaries, and each boundary is backpropagated exactly (the engine's ``_segments``).
Every split is exact for k >= L: any split is, the whole-block fallback included. Where the structure
found fails the engine's first-batch self-check all the same, the others the model offers are tried
(``ResidualFound.others``: the blocks taken whole, then chains of the modules enclosing them, then chains across
stages), the first that passes kept and named in ``found``. A chain **across stages** (where no other structure
runs, or as the last one tried): hierarchical models (FocalNet, Swin, CvT, SwiftFormer) keep their layers in one
list per stage, the stages items of one list, with a downsampling, reshapes and a stage's own parameters between
the last layer of a stage and the first of the next; the layers of every stage are one chain, and what the model
computes in between is an exact boundary (``_Between``), run as the model runs it.
"""

import contextlib
import dataclasses
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from gradengines.models.adapters.calling import call_model
from gradengines.models.errors import ModelConfigError, one_line

__all__ = ["ResidualFound", "FoundBlock", "discover", "replaced_forwards"]

ACTIVATIONS = (nn.ReLU, nn.ReLU6, nn.GELU, nn.SiLU, nn.ELU, nn.LeakyReLU, nn.CELU, nn.SELU, nn.Mish)


class _Stop(Exception):
    """Raised by a hook to end a forward early (the stem stops at the first block)."""


def _first_tensor(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (tuple, list)):
        return next((v for v in value if isinstance(v, torch.Tensor)), None)
    if isinstance(value, dict):
        return next((v for v in value.values() if isinstance(v, torch.Tensor)), None)
    return None


def _state(args: tuple, kwargs: dict) -> torch.Tensor:
    """The state a module is called with: its first tensor argument."""
    first = _first_tensor(args)
    return first if first is not None else _first_tensor(kwargs)


def _passing(output: Any) -> Callable:
    """A forward that returns its input, in the structure ``output`` had."""
    return lambda *args, **kwargs: _like(output, _state(args, kwargs))


def _zeros(output: Any) -> Callable:
    """A forward that returns zeros the shape of its input, in the structure ``output`` had."""
    return lambda *args, **kwargs: _like(output, torch.zeros_like(_state(args, kwargs)))


def _like(template: Any, tensor: torch.Tensor) -> Any:
    """``tensor`` in the structure a module returned (a tensor, or a tuple led by it)."""
    if isinstance(template, (tuple, list)):
        return (tensor, *(None for _ in template[1:]))
    return tensor


def _returning(chain: list[nn.Module], outputs: list, last: int, h: torch.Tensor) -> dict:
    """Forwards for ``replaced_forwards``: the blocks before ``chain[last]`` passing their input through, and
    ``chain[last]`` returning ``h``, each in the structure its output had."""
    replace = {m: _passing(out) for m, out in zip(chain[:last], outputs[:last], strict=True)}
    replace[chain[last]] = lambda *args, **kwargs: _like(outputs[last], h)
    return replace


@contextlib.contextmanager
def _in_eval(modules) -> Iterator[None]:
    """Each of ``modules`` (their children only where listed) in eval mode for the duration: a forward whose output
    is not read (no second dropout draw, no second update of BatchNorm statistics)."""
    modes = {m: m.training for m in modules}
    for module in modes:
        module.training = False
    try:
        yield
    finally:
        for module, mode in modes.items():
            module.training = mode


def _is_norm(module: nn.Module) -> bool:
    return isinstance(module, (nn.LayerNorm, nn.GroupNorm, nn.RMSNorm)) or "Norm" in type(module).__name__


def _is_layer_norm(module: nn.Module) -> bool:
    """A LayerNorm over the last dimension with an affine weight and bias (the post-LN form)."""
    return (isinstance(module, nn.LayerNorm) and len(module.normalized_shape) == 1
            and module.weight is not None and module.bias is not None)


@dataclasses.dataclass
class _Call:
    module: nn.Module
    start: int
    end: int = -1
    args: tuple = ()
    kwargs: dict = dataclasses.field(default_factory=dict)
    x: torch.Tensor | None = None  # the first tensor argument (its identity links the chain)
    y: torch.Tensor | None = None  # the first output tensor
    x_value: torch.Tensor | None = None  # copies: a later in-place operation (timm's ReLUs) may change them
    y_value: torch.Tensor | None = None
    output: Any = None


def _trace(model: nn.Module, inputs, targets) -> list[_Call]:
    """Every module call of one forward, in the order they began."""
    calls: list[_Call] = []
    open_calls: dict[int, list[_Call]] = {}
    clock = [0]

    def pre(module, args, kwargs):
        x = _state(args, kwargs)
        call = _Call(module, clock[0], args=args, kwargs=kwargs, x=x, x_value=None if x is None else x.clone())
        clock[0] += 1
        calls.append(call)
        open_calls.setdefault(id(module), []).append(call)

    def post(module, args, kwargs, output):
        call = open_calls[id(module)].pop()
        call.end, call.output, call.y = clock[0], output, _first_tensor(output)
        call.y_value = None if call.y is None else call.y.clone()
        clock[0] += 1

    handles = []
    for module in model.modules():
        handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(module.register_forward_hook(post, with_kwargs=True))
    try:
        with torch.no_grad():
            call_model(model, inputs, targets)
    except ModelConfigError:
        raise
    except Exception as err:  # the example of the wrong kind, a model that cannot run on it
        raise ModelConfigError(f"residual_stack: the example does not run through {type(model).__name__} "
                               f"({one_line(err)})") from None
    finally:
        for handle in handles:
            handle.remove()
    return [c for c in calls if c.end >= 0]


@dataclasses.dataclass
class _Gap:
    """A link of a chain across stages: the next block's input is computed from ``after``'s output by whatever the
    model does between them (an exact boundary, ``_Between``)."""

    after: _Call


def _across_stages(prev: _Call, call: _Call, lists: dict[int, nn.Module], parents: dict[int, nn.Module]) -> bool:
    """``call`` opens the stage after ``prev``'s: each an item of a list held by its own stage, the two stages items
    of one list (FocalNet's, Swin's, CvT's, SwiftFormer's stages of layers, a downsampling between them)."""
    mine, theirs = lists.get(id(prev.module)), lists.get(id(call.module))
    if mine is None or theirs is None or mine is theirs:
        return False
    stage, next_stage = parents.get(id(mine)), parents.get(id(theirs))
    return (stage is not None and next_stage is not None and stage is not next_stage
            and lists.get(id(stage)) is not None and lists.get(id(stage)) is lists.get(id(next_stage)))


def _chains(calls: list[_Call], lists: dict[int, nn.Module] | None = None, every: bool = False,
            parents: dict[int, nn.Module] | None = None) -> list[tuple[list[_Call], dict]]:
    """The candidate chains of blocks with their joins, best first: stages of different blocks stitched across
    their seams (``_stitched``) where that is longer, then the longest chain of like calls, each fed the previous
    one's output or the output of one **join** fed the previous one's (a module called on the state alone between
    two stages: ConvNeXt's and Swin's downsampling); joins are keyed by the id of the call they feed (module
    docstring). Like: of one module class, or (a hybrid: Jamba's Mamba and attention layers) modules made of
    modules that keep the state's shape, items of one ``nn.ModuleList`` or ``nn.Sequential`` (``lists``: module
    id -> the list holding it) in which some class comes again (items all of different classes are the parts of
    one block: T5's attention and feed-forward). ``every``: then every other repeated chain, longest first (the
    structures ``discover`` falls back on: an enclosing block class, the blocks of one stage). ``parents`` (module id
    -> its parent): chains also cross stages, the last block of a stage linked to the first of the next by a
    ``_Gap`` (``_across_stages``), where the next's input is not the last's output (the fallback of ``discover``)."""
    best: list[_Call] = []
    best_joins: dict[int, _Call] = {}
    by_class: dict[Any, list[_Call]] = {}
    by_input: dict[int, list[_Call]] = {}
    for call in calls:
        if call.x is not None and call.y is not None and any(True for _ in call.module.parameters()):
            by_class.setdefault(type(call.module), []).append(call)
            holder = (lists or {}).get(id(call.module))
            if holder is not None and any(True for _ in call.module.children()) \
                    and call.x_value.shape == call.y_value.shape:
                by_class.setdefault(("items of", id(holder)), []).append(call)
        if call.x is not None and len(call.args) == 1 and call.args[0] is call.x and not call.kwargs:
            by_input.setdefault(id(call.x), []).append(call)

    def join(prev: _Call, call: _Call) -> _Call | None:
        """A join links residual blocks: modules made of modules (layers, a Conv2d or a Linear, are joined by
        norms and activations everywhere) that keep the state's shape (a block's inner parts change it)."""
        if not any(True for _ in call.module.children()) or any(c.x_value.shape != c.y_value.shape
                                                                  for c in (prev, call)):
            return None
        return next((j for j in by_input.get(id(prev.y), []) if j.y is call.x and prev.end < j.start
                     and j.end < call.start and type(j.module) is not type(call.module)), None)

    def seam(prev: _Call, call: _Call) -> tuple[bool, _Call | None]:
        """Can ``call`` follow ``prev`` across stages: fed its output, or that of one module called on it alone
        in between (a downsampling layer; it may change the shape: an exact boundary)? And the join, if any."""
        if prev.end >= call.start:
            return False, None
        if prev.y is call.x:
            return True, None
        joined = next((j for j in by_input.get(id(prev.y), []) if j.y is call.x and prev.end < j.start
                       and j.end < call.start), None)
        return joined is not None, joined

    segments: list[tuple[list[_Call], dict[int, _Call]]] = []  # repeated chains, each of one kind
    for key, group in by_class.items():
        longest: dict[int, list[_Call]] = {}  # index in group -> the longest chain ending there
        joins: dict[int, dict[int, _Call]] = {}  # ... and its joins
        for i, call in enumerate(group):
            longest[i], joins[i] = [call], {}
            for j in range(i):
                prev = group[j]
                if prev.end >= call.start or len(longest[j]) + 1 <= len(longest[i]):
                    continue
                if prev.y is call.x:
                    longest[i], joins[i] = longest[j] + [call], joins[j]
                elif (joined := join(prev, call)) is not None:
                    longest[i], joins[i] = longest[j] + [call], {**joins[j], id(call): joined}
                elif parents is not None and j == i - 1 and _across_stages(prev, call, lists or {}, parents):
                    longest[i], joins[i] = longest[j] + [call], {**joins[j], id(call): _Gap(prev)}
        for i, chain in longest.items():
            if len(chain) > 1 and sum(isinstance(v, _Call) for v in joins[i].values()) == len(chain) - 1:
                continue  # no two blocks fed one by the other: DenseNet's norms joined by its convolutions, not blocks
            kinds = [type(c.module) for c in chain]
            if isinstance(key, tuple) and len(set(kinds)) == len(kinds):  # a list's items, no class repeated: the
                continue  # parts of one block (T5's self-attention, cross-attention, feed-forward), not a hybrid
            if len(chain) > 1:
                segments.append((chain, joins[i]))
            size = sum(p.numel() for c in chain for p in c.module.parameters())
            best_size = sum(p.numel() for c in best for p in c.module.parameters())
            if (len(chain), size) > (len(best), best_size):
                best, best_joins = chain, joins[i]
    stitched = _stitched(segments, seam)
    found = [stitched, (best, best_joins)] if len(stitched[0]) > len(best) else [(best, best_joins)]
    rest = sorted((s for s in segments if s[0] is not best), key=lambda s: -len(s[0])) if every else []
    return found + rest


def _stitched(segments: list[tuple[list[_Call], dict[int, _Call]]],
              seam: Callable[[_Call, _Call], tuple[bool, _Call | None]]) -> tuple[list[_Call], dict[int, _Call]]:
    """The longest sequence of repeated chains of different kinds, each following the previous one across a
    seam (stages of different blocks: a hybrid convnet's convolution stages, then its attention stages), with
    their joins; each chain has two blocks or more, so the parts of one block (T5's sublayers) are never one."""
    segments = sorted(segments, key=lambda segment: segment[0][0].start)
    longest: list[tuple[list[_Call], dict[int, _Call]]] = []
    for chain, joins in segments:
        here = (chain, joins)
        for before, before_joins in longest:
            if len(before) + len(chain) <= len(here[0]):
                continue
            follows, joined = seam(before[-1], chain[0])
            if follows:
                here = (before + chain, {**before_joins, **joins, **({id(chain[0]): joined} if joined else {})})
        longest.append(here)
    return max(longest, key=lambda found: len(found[0]), default=([], {}))


@contextlib.contextmanager
def replaced_forwards(replacements: dict[nn.Module, Callable]) -> Iterator[None]:
    """Each module's forward replaced for the duration (an instance attribute, put back after)."""
    saved = {module: module.__dict__.get("forward") for module in replacements}
    for module, forward in replacements.items():
        module.forward = forward
    try:
        yield
    finally:
        for module, old in saved.items():
            if old is None:
                del module.forward
            else:
                module.forward = old


def _again(value: Any) -> Any:
    """An argument a block may be given again: a generation cache (transformers' ``...Cache``) dropped."""
    return None if type(value).__name__.endswith("Cache") else value


@dataclasses.dataclass
class _Context:
    """What the current batch's forward passes its blocks, and the batch itself (for the head)."""

    where: int | str  # the position (or keyword) of the state among the block's arguments
    arg_names: tuple = ()  # the names of the block's positional parameters (side inputs are said by name)
    args: tuple = ()
    kwargs: dict = dataclasses.field(default_factory=dict)
    inputs: Any = None
    targets: Any = None

    def keep(self, args: tuple, kwargs: dict) -> torch.Tensor:
        """Keep a block call's arguments (a cache dropped, ``use_cache`` off); returns its state."""
        self.args = tuple(_again(a) for a in args)
        self.kwargs = {k: False if k == "use_cache" else _again(v) for k, v in kwargs.items()}
        return self.args[self.where] if isinstance(self.where, int) else self.kwargs[self.where]

    def detach_sides(self, pairs: dict | None = None) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
        """Every tensor argument besides the state that carries a graph (a side input), replaced in what the
        blocks are given by a leaf (one per tensor, also where it is passed twice, inside a tuple or dict, or,
        with ``pairs`` shared, to several contexts); returns (argument name, original, leaf) triples."""
        pairs = {} if pairs is None else pairs

        def leaf(value: Any, name: str) -> Any:
            if isinstance(value, torch.Tensor) and value.requires_grad:
                if id(value) not in pairs:
                    pairs[id(value)] = (name, value, value.detach().requires_grad_())
                return pairs[id(value)][2]
            if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple
                return type(value)(*(leaf(v, name) for v in value))
            if isinstance(value, (tuple, list)):
                return type(value)(leaf(v, name) for v in value)
            if isinstance(value, dict):
                return {k: leaf(v, name) for k, v in value.items()}
            return value

        self.args = tuple(a if i == self.where else leaf(a, self.arg_names[i] if i < len(self.arg_names) else
                                                         f"argument {i}") for i, a in enumerate(self.args))
        self.kwargs = {k: v if k == self.where else leaf(v, k) for k, v in self.kwargs.items()}
        return list(pairs.values())

    def state(self) -> torch.Tensor:
        return self.args[self.where] if isinstance(self.where, int) else self.kwargs[self.where]


class FoundBlock(nn.Module):
    """One residual sublayer of a found block: ``branch(h)`` and ``combine(h, z)`` (module docstring).

    kind: ``add``, ``relu``, ``post_ln`` or ``scaled``. ``end``: the module whose input is u = h + z (the final
    activation or LayerNorm; None: the block's output is u). ``neutral``: modules replaced while this
    sublayer runs (a split block's second part neutralises its first sublayer). ``skip``: kind ``scaled``, the
    modules replaced to read the skip's scale (``neutral`` and every mixer returning zeros). ``boundary``: a
    shape change, backpropagated exactly."""

    def __init__(self, module: nn.Module, context: _Context, kind: str = "add", *, end: nn.Module | None = None,
                 neutral: dict | None = None, boundary: bool = False, gamma: float = 0.0, skip: dict | None = None):
        super().__init__()
        self.module = module  # registered: its parameters are this sublayer's (an unused half gets none)
        self.kind, self.boundary, self.gamma = kind, boundary, gamma
        self.__dict__["context"] = context
        self.__dict__["end"] = end
        self.__dict__["neutral"] = neutral or {}
        self.__dict__["skip"] = skip or {}

    def _call(self, h: torch.Tensor, neutral: dict | None = None) -> Any:
        ctx = self.context
        args, kwargs = list(ctx.args), dict(ctx.kwargs)
        if isinstance(ctx.where, int):
            args[ctx.where] = h
        else:
            kwargs[ctx.where] = h
        with replaced_forwards(self.neutral if neutral is None else neutral):
            return self.module(*args, **kwargs)

    def _sum(self, h: torch.Tensor, neutral: dict | None = None) -> torch.Tensor:
        """u = h + z: the input of ``end`` (the block stopped there), or the block's output; ``neutral``: the
        modules replaced (default: the sublayer's own)."""
        if self.end is None:
            return _first_tensor(self._call(h, neutral))
        seen = {}

        def stop(module, args, kwargs):  # before ``end`` runs: an in-place activation cannot change u
            seen["u"] = _state(args, kwargs)
            raise _Stop

        handle = self.end.register_forward_pre_hook(stop, with_kwargs=True)
        try:
            self._call(h, neutral)
        except _Stop:
            return seen["u"]
        finally:
            handle.remove()
        raise ModelConfigError(f"residual_stack: {type(self.end).__name__} was not called by its block")

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.boundary:
            return _first_tensor(self._call(h))
        return self.combine(h, self.branch(h))

    def scale(self, h: torch.Tensor) -> torch.Tensor:
        """a of a scaled skip u = a h + b: the sum with every mixer returning zeros, at h = 1 (module docstring)."""
        return self._sum(torch.ones_like(h), self.skip)

    def branch(self, h: torch.Tensor) -> torch.Tensor:
        u = self._sum(h)
        if self.kind == "scaled":  # u = h a + b: z = [a, b], K = diag(a)
            a = self.scale(h)
            return torch.stack([a, u - a * h])
        if self.kind == "add" and self.gamma:  # the paper's split of the residual: z + gamma h
            return u - (1 - self.gamma) * h
        if self.kind != "post_ln":
            return u - h
        norm = self.end
        mean = u.mean(-1, keepdim=True)
        scale = norm.weight / torch.sqrt(u.var(-1, unbiased=False, keepdim=True) + norm.eps)
        return torch.stack([scale.expand_as(h), (u - h - mean) * scale + norm.bias])  # [a, b]: LN(u) = h a + b

    def combine(self, h: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        if self.kind == "relu":
            return self.end(h + z)
        if self.kind in ("post_ln", "scaled"):
            return h * z[0] + z[1]
        return (1 - self.gamma) * h + z if self.gamma else h + z

    def describe(self) -> str:
        if self.boundary:
            return "boundary"
        if self.kind == "relu":
            return f"{type(self.end).__name__}(h + z)"
        if self.kind == "post_ln":
            return "LayerNorm(h + z)"
        if self.kind == "scaled":
            return "a h + z (a scaled skip)"
        return f"{1 - self.gamma:g} h + z" if self.gamma else "h + z"


class _Between(nn.Module):
    """An exact boundary where a chain crosses stages (``_Gap``): what the model computes between block ``index - 1``
    and block ``index`` (a downsampling, reshapes, a stage's class token), run as the model runs it, as the head is:
    the forward again, the blocks before passing their input through, block ``index - 1`` returning h, stopped at
    block ``index``'s input. Only ``region`` (the modules called in between) runs in training mode: the stem and the
    other stages' in-betweens run in eval mode (their outputs are not read: no second BatchNorm update, no dropout
    draw). Its gradients: every trainable parameter it reads (``reads``), a stage's own parameters included."""

    boundary = True

    def __init__(self, index: int, region: list[nn.Module]):
        super().__init__()
        self.index = index
        self.__dict__["region"], self.__dict__["stack"] = region, None  # the stack: set once built (_build)

    def describe(self) -> str:
        return "boundary"

    def reads(self) -> list[torch.Tensor]:
        return [p for p in self.stack.model.parameters() if p.requires_grad]

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        stack, i = self.stack, self.index
        seen: dict = {}

        def stop(*args, **kwargs):
            seen["x"] = _state(args, kwargs)
            raise _Stop

        replace = {**_returning(stack.chain, stack.outputs, i - 1, h), stack.chain[i]: stop}
        region = {id(m) for m in self.region}
        try:
            with _in_eval(m for m in stack.model.modules() if id(m) not in region), replaced_forwards(replace):
                call_model(stack.model, stack.context.inputs, stack.context.targets)
        except _Stop:
            pass
        if "x" not in seen:
            raise ModelConfigError(f"residual_stack: {type(stack.chain[i]).__name__}, a block found, was not called "
                                   f"after the one before it on this batch")
        return seen["x"]


class ResidualFound(nn.Module):
    """The residual-stack view of a model whose structure was found (module docstring); its forward is the
    model's own."""

    blocks: nn.ModuleList
    stem_reads_targets = True  # the stem runs the model's forward, which may read the targets (nanoGPT)
    vmappable = False  # blocks read the batch's arguments: Highway-BP's reference path
    feeder: "ResidualFound | None" = None  # a chain whose output a side input is made of (an encoder; discover)
    others: Callable[[], Iterator["ResidualFound"]] | None = None  # the other structures the model offers (_others)

    def __init__(self, model: nn.Module, chain: list[nn.Module], sublayers: list[FoundBlock], contexts: list,
                 outputs: list, before: list[nn.Module], found: str):
        super().__init__()
        self.model = model  # the only registered child: the user's Parameters, under their own names
        self.__dict__["blocks"] = nn.ModuleList(sublayers)  # unregistered: their modules are the model's
        self.__dict__["chain"], self.__dict__["context"] = chain, contexts[0]
        self.__dict__["contexts"] = contexts  # one per block where the blocks are given different arguments
        self.__dict__["outputs"], self.__dict__["before"] = outputs, before
        self.found = found

    def stem(self, x: torch.Tensor, targets: torch.Tensor | None = None,
             feeder_top: torch.Tensor | None = None) -> torch.Tensor:
        """The forward up to the first block; keeps what it passes the blocks (the batch's masks, rotary
        tables) and the batch (module docstring). Where the blocks are given different arguments (per-block
        masks), the whole forward runs with every block passing its input through, each block's arguments kept.
        ``feeder_top``: the state the feeder's last block gives (its blocks computed by the engine), returned by
        that block in place of its own computation, the feeder's other blocks passing their input through."""
        self.__dict__["feeder_top"] = feeder_top
        if len(self.contexts) > 1:
            return self._stem_per_block(x, targets, feeder_top)
        seen: dict = {}

        def intercept(*args, **kwargs):
            seen["args"], seen["kwargs"] = args, kwargs
            raise _Stop

        with replaced_forwards({self.chain[0]: intercept, **self._fed(feeder_top)}), self._feeder_stem_quiet():
            try:
                call_model(self.model, x, targets)
            except _Stop:
                pass
        if "args" not in seen:
            raise ModelConfigError(f"residual_stack: {type(self.chain[0]).__name__}, the first block found, was "
                                   f"not called on this batch")
        self.context.inputs, self.context.targets = x, targets
        return self.context.keep(seen["args"], seen["kwargs"])

    def _fed(self, feeder_top: torch.Tensor | None) -> dict:
        """The feeder's blocks replaced: passing their input through, the last returning ``feeder_top``."""
        feeder = self.feeder
        if feeder is None or feeder_top is None:
            return {}
        return _returning(feeder.chain, feeder.outputs, len(feeder.chain) - 1, feeder_top)

    def _feeder_stem_quiet(self) -> contextlib.AbstractContextManager:
        """The feeder's stem, run again before its replaced blocks, in eval mode (its output is not read)."""
        return _in_eval(m for top in (self.feeder.before if self.feeder is not None else []) for m in top.modules())

    def _stem_per_block(self, x: torch.Tensor, targets: torch.Tensor | None,
                        feeder_top: torch.Tensor | None = None) -> torch.Tensor:
        seen: dict[int, tuple] = {}

        def record(i: int) -> Callable:
            def keep(*args, **kwargs):
                seen[i] = (args, kwargs)
                return _like(self.outputs[i], _state(args, kwargs))
            return keep

        betweens = (m for b in self.blocks if isinstance(b, _Between) for top in b.region for m in top.modules())
        with replaced_forwards({**{m: record(i) for i, m in enumerate(self.chain)}, **self._fed(feeder_top)}), \
                self._feeder_stem_quiet(), _in_eval(betweens):  # given what the blocks passed through: not read
            call_model(self.model, x, targets)
        if len(seen) < len(self.chain):
            raise ModelConfigError(f"residual_stack: {len(self.chain) - len(seen)} of the {len(self.chain)} blocks "
                                   f"found were not called on this batch")
        for i, context in enumerate(self.contexts):
            context.keep(*seen[i])
        self.context.inputs, self.context.targets = x, targets
        return self.context.state()

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """The forward after the last block: the forward again, every block passing its input through and the
        last one returning ``h`` (the stem in eval mode: its output is not read)."""
        ctx = self.context

        replace = _returning(self.chain, self.outputs, len(self.chain) - 1, h)
        top = self.__dict__.get("feeder_top")
        if top is not None:  # the feeder's blocks are not run again: its output is not read here either
            replace.update(self._fed(top.detach()))
        with _in_eval(m for part in self.before for m in part.modules()), replaced_forwards(replace):
            return call_model(self.model, ctx.inputs, ctx.targets).outputs

    def side_inputs(self) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
        """This batch's side inputs (after ``stem``): the tensors the blocks read besides the state that depend
        on trainable parameters (an encoder's output, a shared position table or bias), each replaced by a leaf
        in what the blocks are given; (name, original, leaf) triples. Highway-BP sums each leaf's cotangents over
        the blocks and backpropagates them through the original (``_Context.detach_sides``)."""
        pairs: dict = {}  # one leaf per tensor, whichever blocks are given it
        for context in self.contexts:
            context.detach_sides(pairs)
        return list(pairs.values())

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        return call_model(self.model, x, targets).outputs

    def adopt(self, other: "ResidualFound") -> None:
        """Take the structure of ``other``, found in the same model (its blocks, contexts, feeder, description)."""
        for key in ("blocks", "chain", "context", "contexts", "outputs", "before", "feeder", "found"):
            self.__dict__[key] = getattr(other, key)


def _lists(model: nn.Module) -> dict[int, nn.Module]:
    """id(module) -> the ``nn.ModuleList`` or ``nn.Sequential`` holding it (``_chains``)."""
    return {id(item): holder for holder in model.modules() if isinstance(holder, (nn.ModuleList, nn.Sequential))
            for item in holder.children()}


def _names(model: nn.Module) -> dict[int, str]:
    return {id(m): name for name, m in model.named_modules()}


def _scaled(sub: FoundBlock, mixers: dict, x: torch.Tensor) -> FoundBlock:
    """``sub`` read as a scaled skip u = a h + b (kind ``scaled``) where its sum with every mixer returning zeros
    is a h on the example ``x``, with ``a`` not 1 or depending on the block's parameters (Doge's learned
    ``input_residual``, initialised to ones); else ``sub`` itself (module docstring)."""
    scaled = FoundBlock(sub.module, sub.context, "scaled", end=sub.end, neutral=sub.neutral,
                        skip={**mixers, **sub.neutral})
    params = [p for p in sub.module.parameters() if p.requires_grad]
    try:
        with torch.enable_grad():
            a = scaled.scale(x)
            linear = torch.allclose(scaled._sum(x, scaled.skip), a * x, rtol=1e-5, atol=1e-6 * float(x.abs().max()))
            learned = a.requires_grad and any(g is not None and bool(g.any()) for g in torch.autograd.grad(
                a.sum(), params, allow_unused=True))
    except Exception:  # noqa: BLE001 - a sum that cannot run with its mixers returning zeros is no scaled skip
        return sub
    return scaled if linear and (learned or not bool((a == 1).all())) else sub


def _sublayers(call: _Call, calls: list[_Call], context: _Context, gamma: float,
               split: bool = True) -> list[FoundBlock]:
    """The block of ``call`` as one or two sublayers (module docstring), checked on the example; ``split``
    false: as one, read as ``add``, ``relu`` or ``post_ln`` only (the whole-block structure ``discover`` falls
    back on)."""
    block = call.module
    if call.x_value.shape != call.y_value.shape:
        return [FoundBlock(block, context, boundary=True)]
    inside = [c for c in calls if call.start < c.start and c.end < call.end]
    children = {id(m) for m in block.children()}
    direct = [c for c in inside if id(c.module) in children]

    def ending(of: _Call) -> nn.Module | None:
        """The innermost module of ``of`` whose output is its output (the combine's last operation)."""
        last = [c for c in inside if c.y is of.y and c.start > of.start and of.end > c.end]
        return max(last, key=lambda c: c.start).module if last else None

    end = ending(call)
    kind = "relu" if isinstance(end, ACTIVATIONS) else "post_ln" if end is not None and _is_layer_norm(end) \
        else "add"
    mixers = {c.module: _zeros(c.output) for c in direct if not _is_norm(c.module)
              and any(True for _ in c.module.parameters()) and c.x_value.shape == c.y_value.shape}
    whole = [FoundBlock(block, context, kind, end=end if kind != "add" else None, gamma=gamma)]
    whole = [_scaled(whole[0], mixers, call.x_value)] if kind == "add" and split else whole
    parts = None
    if split and kind == "add" and len(direct) >= 3 and _is_norm(direct[0].module):
        again = next((c for c in direct[2:] if type(c.module) is type(direct[0].module)), None)
        if again is not None:  # pre-LN: h1 = h + mixer(norm1(h)) is the second norm's input
            mixer = direct[1]
            parts = [_scaled(FoundBlock(block, context, "add", end=again.module, gamma=gamma), mixers, call.x_value),
                     _scaled(FoundBlock(block, context, "add", neutral={mixer.module: _zeros(mixer.output)},
                                        gamma=gamma), mixers, call.x_value)]
            if parts[0].kind == "scaled":  # the second part would be given a1 h, not h: the whole block is one
                parts = None
    elif split and kind == "post_ln" and direct:
        first_end = ending(direct[0])
        if first_end is not None and _is_layer_norm(first_end) and first_end is not end:  # BERT: attention
            parts = [FoundBlock(block, context, "post_ln", end=first_end),
                     FoundBlock(block, context, "post_ln", end=end, neutral={direct[0].module:
                                _passing(direct[0].output)})]
    expected = call.y_value.double()
    if parts is not None and _agrees(parts, call.x_value, expected):
        return parts
    if not _agrees(whole, call.x_value, expected):
        raise ModelConfigError(f"residual_stack: {type(block).__name__} computed again from its input does not "
                               f"give its output on the example (a block that reads more than its input?)")
    return whole


def _same_value(a, b) -> bool:
    """The same argument: the same tensor object, containers of the same values (Gemma 3n hands each layer its own
    tuple of rotary tables: compared item by item, never by a tensor's truth), or other values equal."""
    if a is b:
        return True
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return False
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_value(a[k], b[k]) for k in a)
    try:
        return bool(a == b)
    except Exception:  # an object whose == is not a truth value (an array, a tensor inside its own container)
        return False


def _same_arguments(call: _Call, first: _Call, where: int | str) -> bool:
    """``call`` is given what ``first`` is besides the state: the same tensors, equal other values."""
    rest = [a for i, a in enumerate(call.args) if i != where]
    return len(call.args) == len(first.args) and call.kwargs.keys() == first.kwargs.keys() and all(
        _same_value(a, b)
        for a, b in zip(rest + [v for k, v in call.kwargs.items() if k != where],
                        [a for i, a in enumerate(first.args) if i != where]
                        + [v for k, v in first.kwargs.items() if k != where], strict=True))


def _check_per_block(chain: list[_Call], where: int | str, names: dict) -> None:
    """Blocks given different arguments are found only where each is given the state at the same place and
    nothing an earlier block returned (T5's position bias, computed by the first block: refused)."""
    first = chain[0]
    for j, call in enumerate(chain[1:], start=1):
        state = call.args[where] if isinstance(where, int) and where < len(call.args) else call.kwargs.get(where)
        if state is not call.x:
            raise ModelConfigError(f"residual_stack: the blocks found ({type(first.module).__name__}) take their state "
                                   f"at different places; declare the stack by hand")
        returned = {id(t) for earlier in chain[:j] for t in _tensors(earlier.output) if t is not earlier.y}
        given = [t for value in [*call.args, *call.kwargs.values()] for t in _tensors(value) if t is not state]
        if any(id(t) in returned for t in given):
            raise ModelConfigError(f"residual_stack: {names.get(id(call.module))} is given a tensor an earlier block "
                                   f"returned besides its state (a position bias the first block computes, as T5's); "
                                   f"declare the stack by hand")


def _returns_what_the_others_read(chain: list[_Call]) -> _Call | None:
    """The chain's first call, where every later call is given a tensor it returned besides its state and
    nothing another block returned (T5's first block computes the relative position bias from its own table
    and returns it to the others): that block then belongs to the stem, backpropagated exactly, and what it
    returned is a side input of the others. None otherwise."""
    first = chain[0]
    returned = {id(t) for t in _tensors(first.output) if t is not first.y}
    for call in chain[1:]:
        given = {id(t) for value in [*call.args, *call.kwargs.values()] for t in _tensors(value) if t is not call.x}
        if not given & returned:
            return None
        others = {id(t) for earlier in chain[1:] if earlier is not call and earlier.end < call.start
                  for t in _tensors(earlier.output) if t is not earlier.y}  # the first's, passed on, are its own
        if given & (others - returned):
            return None
    return first


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


def _agrees(sublayers: list[FoundBlock], h: torch.Tensor, expected: torch.Tensor) -> bool:
    """The sublayers, one after the other, give the block's output from its input (a split that cannot run, as
    one that reads the second norm of a block whose sublayers are not h + f(norm(h)), does not)."""
    try:
        with torch.no_grad():
            for sub in sublayers:
                h = sub(h)
    except Exception:  # noqa: BLE001 - any failure of a candidate split only rules it out
        return False
    scale = expected.abs().max().clamp_min(1e-12)
    return h.shape == expected.shape and bool(((h.double() - expected).abs().max() / scale) < 1e-5)


def _build(model: nn.Module, calls: list[_Call], chain: list[_Call], joins: dict[int, _Call], gamma: float,
           names: dict[int, str], split: bool = True) -> tuple[ResidualFound, dict]:
    """The residual stack of ``chain`` (its joins, its opener, its contexts, its sublayers; module docstring), and
    what its description adds: ``joins``, ``per_block``, ``opener``; ``split`` false: whole blocks."""
    modules = [c.module for c in chain]
    if len({id(m) for m in modules}) < len(modules):
        raise ModelConfigError(f"residual_stack: {names[id(modules[0])] or type(modules[0]).__name__} is "
                               f"called more than once in a row (shared weights); declare the stack by hand")
    opener = _returns_what_the_others_read(chain)
    if opener:  # T5: the first block computes the position bias and returns it to the others
        chain, modules = chain[1:], modules[1:]
    joins = {k: v for k, v in joins.items() if k != id(chain[0])}  # before the first block: the stem's
    first = chain[0]
    where: int | str = next((i for i, a in enumerate(first.args) if a is first.x), -1)
    if where == -1:
        where = next(k for k, v in first.kwargs.items() if v is first.x)
    per_block = not all(_same_arguments(call, first, where) for call in chain[1:])
    if per_block:
        _check_per_block(chain, where, names)
    try:
        arg_names = tuple(inspect.signature(first.module.forward).parameters)
    except (TypeError, ValueError):  # a forward without a signature Python can read
        arg_names = ()
    contexts = [_Context(where, arg_names) for _ in (chain if per_block else chain[:1])]
    for context, call in zip(contexts, chain, strict=False):
        context.keep(call.args, call.kwargs)
    sublayers: list[nn.Module] = []
    betweens: list[_Between] = []
    for i, call in enumerate(chain):
        link = joins.get(id(call))
        if isinstance(link, _Gap):  # across stages: what the model computes in between, an exact boundary
            betweens.append(_Between(i, [c.module for c in calls if chain[i - 1].end < c.start and c.end < call.start]))
            sublayers.append(betweens[-1])
        elif link is not None:  # called on the state alone, an exact boundary
            alone = _Context(0)
            alone.keep((None,), {})
            sublayers.append(FoundBlock(link.module, alone, boundary=True))
        sublayers += _sublayers(call, calls, contexts[i if per_block else 0], gamma, split)
    ancestors = {id(m) for m in model.modules() if any(x is modules[0] for x in m.modules())}
    before = [c.module for c in calls if c.end < first.start and id(c.module) not in ancestors]
    before += [j.module for j in joins.values() if isinstance(j, _Call)]  # the head runs them again: in eval
    before += [m for between in betweens for m in between.region]  # mode, as the stem
    counts: dict[str, int] = {}
    for sub in sublayers:
        counts[sub.describe()] = counts.get(sub.describe(), 0) + 1
    where_found = sorted({names[id(m)].rpartition(".")[0] for m in modules})
    kinds = ", ".join(dict.fromkeys(type(m).__name__ for m in modules))  # a hybrid's: each class once, in order
    found = (f"{len(chain)} blocks ({kinds} in {', '.join(w or 'the model' for w in where_found)})"
             f" as {len(sublayers)} residual sublayers: "
             + ", ".join(f"{n} {'exact boundaries (a shape change)' if k == 'boundary' else k}"
                         for k, n in counts.items()))
    stack = ResidualFound(model, modules, sublayers, contexts, [c.output for c in chain], before, found)
    for between in betweens:
        between.__dict__["stack"] = stack
    return stack, {"joins": joins, "per_block": per_block, "opener": opener, "start": first.start}


def _described(stack: ResidualFound, said: dict, sides: list[str], names: dict[int, str]) -> str:
    """The description's additions (joins, per-block arguments, the opener, side inputs, all boundaries)."""
    text = ""
    joins = [j for j in said["joins"].values() if isinstance(j, _Call)]
    if joins:
        kinds = sorted({type(j.module).__name__ for j in joins})
        text += f"; {len(joins)} of the boundaries joins between the blocks ({', '.join(kinds)})"
    if gaps := len(said["joins"]) - len(joins):
        text += (f"; {gaps} of the boundaries what the model computes between {gaps + 1} stages of blocks (run as "
                 f"it runs it)")
    if said["per_block"]:
        text += "; each block given its own arguments (masks)"
    if said["opener"]:
        text += (f"; {names.get(id(said['opener'].module))}, which computes what the others are given besides the "
                 f"state (a position bias), backpropagated exactly with the stem")
    if sides:
        text += f"; {len(sides)} side input{'s' if len(sides) > 1 else ''} ({', '.join(sides)}) read by every block"
    if all(sub.boundary for sub in stack.blocks):
        text += "; every block changes the state's shape, so each is an exact boundary: Highway-BP is backprop here"
    return text


def _sides_found(stack: ResidualFound, inputs, targets, feeder_top: torch.Tensor | None = None) -> list:
    """Run the stem once with gradients (eval mode) and return its side inputs (``side_inputs``), or one line
    where the forward cannot run as the structure needs."""
    try:
        with torch.enable_grad():  # which arguments besides the state depend on trainable parameters
            stack.stem(inputs, targets, feeder_top)
        return stack.side_inputs()
    except ModelConfigError:
        raise
    except Exception as err:  # noqa: BLE001 - a forward that needs its blocks' real outputs to go on
        raise ModelConfigError(f"residual_stack: the blocks found ({type(stack.chain[0]).__name__}) are given "
                               f"different arguments besides the state, and the forward cannot run with its blocks "
                               f"passing their input through to give them ({one_line(err)}); declare the stack by "
                               f"hand") from None


def _feeder(model: nn.Module, calls: list[_Call], stack: ResidualFound, start: int, gamma: float, names: dict,
            inputs, targets) -> tuple[ResidualFound, dict] | None:
    """A second chain of blocks that ran before the stack's first block and whose output one of its side inputs
    is made of (an encoder, whose output every decoder block reads): its own residual stack, or None."""
    earlier = [c for c in calls if c.end < start]  # what ran, and ended, before the stack's first block
    chain, joins = _chains(earlier)[-1]  # the longest single chain: stitched stages are not tried for a feeder
    if len(chain) < 2 or {id(c.module) for c in chain} & {id(m) for m in stack.chain}:
        return None
    try:
        feeder, said = _build(model, calls, chain, joins, gamma, names)
    except ModelConfigError:
        return None
    stack.__dict__["feeder"] = feeder  # tried: does a side input depend on the feeder's top state?
    try:
        with torch.enable_grad():
            top = feeder.stem(inputs, targets).detach().requires_grad_()
            sides = _sides_found(stack, inputs, targets, feeder_top=top)
            reached = any(original.requires_grad and torch.autograd.grad(original, top, torch.ones_like(original),
                                                                         allow_unused=True)[0] is not None
                          for _, original, _ in sides)
    except Exception:  # noqa: BLE001 - a chain the forward cannot run around is no feeder
        reached = False
    finally:
        del stack.__dict__["feeder"]
    return (feeder, said) if reached else None


def _reproduces(stack: ResidualFound, inputs, targets) -> bool:
    """The stem, the sublayers one after the other and the head give the model's outputs on the example."""
    try:
        with torch.no_grad():
            h = stack.stem(inputs, targets)
            for sub in stack.blocks:
                h = sub(h)
            outputs, expected = stack.head(h), call_model(stack.model, inputs, targets).outputs
    except Exception:  # noqa: BLE001 - a structure the forward cannot run through is not the model's
        return False
    scale = expected.abs().max().clamp_min(1e-12)
    return outputs.shape == expected.shape and bool(((outputs - expected).abs().max() / scale) < 1e-5)


def discover(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor | None = None,
             gamma: float = 0.0) -> ResidualFound:
    """Find the stem, blocks and head of ``model`` from one run of ``inputs`` (module docstring); ``gamma``:
    the paper's split of an ``h + z`` residual (branch z + gamma h, combine (1 - gamma) h + z; App. C.3)."""
    was_training = model.training
    model.eval()  # no dropout in the run that is read
    try:
        calls = _trace(model, inputs, targets)
        lists = _lists(model)
        candidates = _chains(calls, lists)
        names = _names(model)
        try:
            if len(candidates[0][0]) < 2:
                raise ModelConfigError(
                    f"residual_stack: found no repeated blocks in {type(model).__name__} (two or more calls of one "
                    f"module class with parameters, or of items of one ModuleList that keep the state's shape, each "
                    f"given the previous one's output); declare them: "
                    f"models.residual_stack(model, stem=..., blocks=[...], head=..., example=...)")
            for n, (chain, joins) in enumerate(candidates, start=1):
                try:  # stitched stages that are not one stack (arguments per block the forward cannot give, a
                    stack, said = _build(model, calls, chain, joins, gamma, names)  # stem's layers taken for a
                    sides = sorted({name for name, _, _ in _sides_found(stack, inputs, targets)})  # stage): the
                    if n == len(candidates) or _reproduces(stack, inputs, targets):  # longest single chain, as
                        break  # before
                except ModelConfigError:
                    if n == len(candidates):
                        raise
        except ModelConfigError:  # the layers of the stages, what the model computes between stages a boundary
            crossing = next(_across(model, calls, lists, gamma, names, inputs, targets), None)
            if crossing is None:
                raise
            stack, said, sides = crossing
        _finish(model, calls, stack, said, sides, gamma, names, inputs, targets)
    finally:
        model.train(was_training)
    stack.__dict__["others"] = lambda: _others(model, inputs, targets, gamma, stack.chain)
    return stack


def _finish(model: nn.Module, calls: list[_Call], stack: ResidualFound, said: dict, sides: list[str], gamma: float,
            names: dict, inputs, targets) -> None:
    """The stack's feeder, if any (``_feeder``), and its description completed (``_described``)."""
    fed = _feeder(model, calls, stack, said["start"], gamma, names, inputs, targets)
    if fed is not None:
        feeder, feeder_said = fed
        feeder_sides = sorted({name for name, _, _ in _sides_found(feeder, inputs, targets)})
        stack.__dict__["feeder"] = feeder
        stack.found = (f"{feeder.found}{_described(feeder, feeder_said, feeder_sides, names)}, whose output "
                       f"feeds {stack.found}")
    stack.found += _described(stack, said, sides, names)


def _across(model: nn.Module, calls: list[_Call], lists: dict[int, nn.Module], gamma: float, names: dict[int, str],
            inputs, targets) -> Iterator[tuple[ResidualFound, dict, list[str]]]:
    """The chains that cross stages (``_Gap``: FocalNet's, Swin's, CvT's layers, a downsampling between their
    stages), longest first, each with what its description adds and its side inputs, where it builds and
    reproduces the model's outputs on the example."""
    parents = {id(child): module for module in model.modules() for child in module.children()}
    for chain, joins in _chains(calls, lists, every=True, parents=parents):
        if not any(isinstance(link, _Gap) for link in joins.values()):
            continue
        try:
            stack, said = _build(model, calls, chain, joins, gamma, names)
            sides = sorted({name for name, _, _ in _sides_found(stack, inputs, targets)})
        except ModelConfigError:
            continue
        if _reproduces(stack, inputs, targets):
            yield stack, said, sides


def _others(model: nn.Module, inputs, targets, gamma: float, chosen: list[nn.Module]) -> Iterator[ResidualFound]:
    """The other structures ``model`` offers, in the order the engine's self-check tries them where the first
    fails: the blocks first found taken whole (no split, no scaled skip read), then every repeated chain of
    modules that enclose them, longest first (HGNet's blocks, not the conv-norm-act units chained inside each),
    each found again from the example and kept where it builds and reproduces the model's outputs."""
    was_training = model.training
    model.eval()
    try:
        calls = _trace(model, inputs, targets)
        lists = _lists(model)
        names, chains = _names(model), _chains(calls, lists, every=True)
    finally:
        model.train(was_training)
    mine = {id(m) for m in chosen}
    enclosing = {id(m) for m in model.modules() if id(m) not in mine and any(id(x) in mine for x in m.modules())}
    specs = [(c, j, False) for c, j in chains if mine <= {id(call.module) for call in c}][:1]
    specs += [(c, j, True) for c, j in chains if any(id(call.module) in enclosing for call in c)]
    for chain, joins, split in specs:
        model.eval()
        try:
            stack, said = _build(model, calls, chain, joins, gamma, names, split)
            sides = sorted({name for name, _, _ in _sides_found(stack, inputs, targets)})
            if not _reproduces(stack, inputs, targets):
                continue
            _finish(model, calls, stack, said, sides, gamma, names, inputs, targets)
        except ModelConfigError:
            continue
        finally:
            model.train(was_training)
        if not split:
            stack.found = stack.found.replace(" as ", " taken whole as ", 1)
        yield stack
    model.eval()
    try:
        crossing = list(_across(model, calls, lists, gamma, names, inputs, targets))
        for stack, said, sides in crossing:
            _finish(model, calls, stack, said, sides, gamma, names, inputs, targets)
    finally:
        model.train(was_training)
    yield from (stack for stack, _, _ in crossing)
