"""core: the ground layer (errors, config, process identity, guardian, version).

Every other package may import core; core imports none of them, so the layers above
share one vocabulary of errors and one composed config without import cycles.
"""
