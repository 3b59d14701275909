"""Errors a user sees as one clear line (principle 5): what went wrong and where."""

from __future__ import annotations


class TruthputError(Exception):
    """Base for errors reported as `truthput: error: <message>` with a non-zero exit code."""

    exit_code = 2


class InputError(TruthputError):
    """A bad experiment file, argv or unit: the message names the file and the key."""


class EngineError(TruthputError):
    """A server could not be reached, started or stopped."""

    exit_code = 3


class MeasurementError(TruthputError):
    """A measurement could not be made (missing metric, malformed stream)."""

    exit_code = 4


class StoreError(TruthputError):
    """The results store cannot be read or written, or a run id does not exist."""
