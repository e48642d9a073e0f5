"""One file per gradient engine; importing this package registers them all."""

from trainers.engines import backprop, dsf, feedback_alignment, fgrad, foton, highway, mezo, pepita  # noqa: F401
