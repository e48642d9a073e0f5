r"""Making layers orthogonal and keeping them so.

Three families behind one switch, ``method in (None, "expm", "cayley", "bjorck", "polar", "retraction")``:

* **parametrized** (``"expm"``, ``"cayley"``): geotorch's ``orthogonal`` constraint.
  ``module.weight`` becomes a computed tensor :math:`W = B\,\phi(A)` (first ``k``
  columns, transposed for wide matrices) with :math:`B` a buffer (the base point),
  :math:`A` the skew-symmetric matrix built from the trainable tensor
  ``module.parametrizations.weight.original`` and :math:`\phi` either
  :math:`\exp(A)` or the Cayley map :math:`(I - A/2)^{-1}(I + A/2)`.
  The weight is orthogonal by construction at every step.
* **projected** (``"bjorck"``, ``"polar"``): ``module.weight`` stays the plain
  :class:`~torch.nn.Parameter`; the module carries a frozen :class:`Projection`
  marker and :func:`project_` must be called after each optimizer step to
  restore orthogonality *in place* (``weight.copy_``), so the Parameter object,
  the optimizer's ``param_groups`` and its state (Adam moments, momentum
  buffers) stay attached to it.

Convention for a rectangular weight :math:`W` of shape ``(out, in)``:
"orthogonal" means **rows orthonormal if out <= in** (:math:`W W^\top = I_{out}`)
and **columns orthonormal if out > in** (:math:`W^\top W = I_{in}`), i.e. the
Gram matrix on the *smaller* side is the identity. This is geotorch's convention
too, and every function here uses it.

Initialization when a layer is marked: for **all four methods** the weight is set
to the polar factor :math:`U V^\top` of its current value (the nearest
semi-orthogonal matrix in Frobenius norm), so the same seed gives the same
starting weights whatever the method. geotorch's own registration overwrites the
weight with a Haar-random sample (and consumes the global RNG); here that sample
is discarded and registration runs under a forked RNG, so marking a layer never
changes the global random stream.

By what it holds: ``projection.py`` (Björck, polar, ``project_``), ``marking.py`` (``make_orthogonal``,
``orthogonal_method``, ``orthogonality_error``), ``gradients.py`` (the trainable tensor and its gradient),
``cayley.py`` and ``retraction.py`` (the Cayley retraction), ``conv.py`` (orthogonal convolutions).
"""

from gradengines.models.orthogonal.gradients import has_parametrized_weight, route_weight_grad, trainable_weight
from gradengines.models.orthogonal.marking import (
    METHODS,
    PARAMETRIZED_METHODS,
    PROJECTED_METHODS,
    RETRACTED_METHODS,
    Retraction,
    make_orthogonal,
    orthogonal_method,
    orthogonality_error,
)
from gradengines.models.orthogonal.projection import (
    BJORCK_TOL,
    DEFAULT_BJORCK_ITERS,
    Projection,
    bjorck,
    gram_deviation_bound,
    next_deviation_bound,
    polar,
    project_,
    project_weights_,
    projected_weights,
)

__all__ = [
    "METHODS",
    "PARAMETRIZED_METHODS",
    "PROJECTED_METHODS",
    "Projection",
    "Retraction",
    "RETRACTED_METHODS",
    "make_orthogonal",
    "orthogonal_method",
    "bjorck",
    "polar",
    "project_",
    "projected_weights",
    "project_weights_",
    "gram_deviation_bound",
    "next_deviation_bound",
    "BJORCK_TOL",
    "DEFAULT_BJORCK_ITERS",
    "orthogonality_error",
    "has_parametrized_weight",
    "trainable_weight",
    "route_weight_grad",
]
