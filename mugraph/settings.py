"""All of mugraph's knobs (defined in `mugraph.ir.settings`, the lowest layer that reads them)."""
from mugraph.ir.settings import KNOBS, Knob, settings

__all__ = ["KNOBS", "Knob", "settings"]
