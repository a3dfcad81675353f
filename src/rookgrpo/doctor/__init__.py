"""``rookgrpo doctor``: name every way a GRPO run fails, from the metrics it logged, live or after the fact.

:func:`load_history` reads any transformers/TRL run (``trainer_state.json``, a JSON-lines log, TensorBoard events);
:func:`diagnose` runs the detectors (:mod:`rookgrpo.doctor.detectors`) and returns :class:`Finding` objects, each with
the steps it spans, its cause and its fix. The ``doctor`` callback runs the same detectors during training (and can
stop the run on named findings); ``rookgrpo doctor RUN`` runs them on a finished run. Torch-free, so the CLI is fast.
"""

from .detectors import DETECTORS, Finding, Thresholds, diagnose, heldout_metrics
from .history import History, load_history

__all__ = ["DETECTORS", "Finding", "History", "Thresholds", "diagnose", "heldout_metrics", "load_history"]
