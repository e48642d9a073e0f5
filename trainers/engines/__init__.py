"""One file per gradient engine; importing this package registers them all."""

from trainers.engines import backprop, foton, pepita  # noqa: F401
