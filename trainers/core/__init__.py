"""What every engine may use: the engine contract, the structural protocols, options, the
registry, errors, random-generator states and the collectives of data-parallel training."""
