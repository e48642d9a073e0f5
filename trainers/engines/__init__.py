"""One file per gradient engine; importing this package registers them all."""

from gradengines.trainers.engines import (  # noqa: F401
    activity_fgrad,
    backprop,
    dsf,
    feedback_alignment,
    fgrad,
    foton,
    highway,
    mezo,
    pepita,
    tbptt,  # last: written on gradengines.blocks, which reads the engines above
)
