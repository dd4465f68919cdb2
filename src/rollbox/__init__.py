"""rollbox: isolated, stateful sandboxes for reinforcement learning of code agents."""

__version__ = "0.1.0"
