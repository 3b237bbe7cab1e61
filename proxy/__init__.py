"""toolpair: restore the call order of parallel tool results before they reach the model."""

__version__ = "0.1.0"
