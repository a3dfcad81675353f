"""``rookgrpo doctor``: name every way a GRPO run fails, from the metrics it logged, live or after the fact.

:func:`load_history` reads any transformers/TRL run (``trainer_state.json`` or a JSON dict holding its ``log_history``
under any name, a bare JSON list of logged dicts, a JSON-lines log, a CSV export, TensorBoard events; a log whose steps
restart as phases, :func:`load_histories`);
:func:`diagnose` runs the detectors (:mod:`rookgrpo.doctor.detectors`) and returns :class:`Finding` objects, each with
the steps it spans, its cause and its fix. The ``doctor`` callback runs the same detectors during training (and can
stop the run on named findings); ``rookgrpo doctor RUN`` runs them on a finished run. Torch-free, so the CLI is fast.
"""

from .detectors import DETECTORS, Finding, Thresholds, diagnose, heldout_metrics
from .history import History, load_histories, load_history

__all__ = ["DETECTORS", "Finding", "History", "Thresholds", "diagnose", "heldout_metrics", "load_histories", "load_history"]
