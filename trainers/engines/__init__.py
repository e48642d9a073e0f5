"""One file per gradient engine; importing this package registers them all."""

from trainers.engines import backprop, dsf, foton, pepita  # noqa: F401
