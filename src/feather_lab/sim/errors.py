"""The simulator's failure."""


class SimulationError(RuntimeError):
    """The simulation cannot continue or broke an invariant (a bug, or an impossible input)."""
