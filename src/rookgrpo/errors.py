"""Exceptions rookgrpo raises for problems a user can fix."""


class ConfigError(ValueError):
    """A recipe, config value or argument is wrong. The message names the field and the fix.

    Raised before training starts, so a bad recipe never costs a model load or a generation step.
    """
