"""Time and peak memory of each phase of a GRPO step, measured where the phase runs.

The trainer wraps TRL's own methods with :meth:`PhaseMeter.measure` (generation, rewards, log-prob passes outside the
loss) and the loss; the ``diagnostics`` callback wraps the optimizer step and takes the numbers. Peak memory is:

- on CUDA: read from ``torch.cuda.max_memory_allocated`` of the process's device, never reset, so the peak your own
  code reads there stays right: a phase that raised the peak reports it exactly; one that did not, the larger of the
  allocations at its start and end (a lower bound: ``cuda_peak_if_raised``). ``reset_cuda_peaks=True`` (the
  ``diagnostics`` callback's ``exact_cuda_peaks``) resets the peak when each phase starts instead, for exact peaks
  per phase (``cuda_max_allocated``), at the cost of that reading. :attr:`PhaseMeter.process_peak_mib` is the run's
  peak either way;
- on CPU: the process's peak resident set size (``VmHWM``), reset when the phase starts by writing ``5`` to
  ``/proc/self/clear_refs`` (Linux). Where that file cannot be written (other systems, some sandboxes), the larger of
  the resident sizes at the phase's start and end (``rss_at_edges``), which can miss a peak inside the phase.
  The reset also resets the lifetime peak the kernel reports for the process (``ru_maxrss``, what ``/usr/bin/time
  -v`` prints), so the meter keeps it: :attr:`PhaseMeter.process_peak_mib`, the peak read before every reset.

>>> meter = PhaseMeter(device="cpu")
>>> with meter.measure("rewards"):
...     _ = [0] * 10_000
>>> seconds, peak_mib = meter.take()["rewards"]
>>> seconds >= 0 and peak_mib > 0
True
"""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager

import torch

MIB = 1024 * 1024


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _rss_bytes() -> int:
    kib = _status_kib("VmRSS")
    if kib is not None:
        return kib * 1024
    try:
        import psutil

        return psutil.Process().memory_info().rss
    except Exception:  # noqa: BLE001 - no way to read memory here: report 0 rather than fail a training step
        return 0


def _reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return _status_kib("VmHWM") is not None
    except OSError:
        return False


class PhaseMeter:
    """Seconds and peak memory (MiB) per named phase, summed/maxed until :meth:`take`.

    Phases must not nest (each resets the peak it measures); the trainer's phases do not: generation, rewards and
    reference run one after another inside generate-and-score, the loss after it, the optimizer step after that.
    """

    def __init__(self, device: torch.device | str | None = None, reset_cuda_peaks: bool = False):
        device = torch.device(device) if device is not None else torch.device("cpu")
        self.cuda = device.type == "cuda" and torch.cuda.is_available()
        self.device = device
        self.reset_cuda_peaks = bool(reset_cuda_peaks)
        self.cpu_method = None if self.cuda else ("peak_rss" if _reset_peak_rss() else "rss_at_edges")
        self._seconds: dict[str, float] = defaultdict(float)
        self._peak: dict[str, float] = {}
        self._open: dict[str, tuple[float, int]] = {}
        self.process_peak_mib = 0.0  # CPU: the process's peak resident set since the meter was built
        self.run_peaks: dict[str, float] = {}  #: {phase: its peak MiB over the meter's life} (never taken)
        self.last_started: str | None = None  #: the phase started last (where an out-of-memory error came from)
        self._note_process_peak()

    def _note_process_peak(self) -> None:
        if self.cuda:
            if not self.reset_cuda_peaks:  # CUDA's own peak is the run's (nothing here resets it)
                self.process_peak_mib = max(self.process_peak_mib, torch.cuda.max_memory_allocated(self.device) / MIB)
        else:
            kib = _status_kib("VmHWM") if self.cpu_method == "peak_rss" else _rss_bytes() // 1024
            self.process_peak_mib = max(self.process_peak_mib, (kib or 0) / 1024)

    @property
    def memory_kind(self) -> str:
        """What the peaks are: ``cuda_peak_if_raised``, ``cuda_max_allocated``, ``peak_rss`` or ``rss_at_edges``."""
        if self.cuda:
            return "cuda_max_allocated" if self.reset_cuda_peaks else "cuda_peak_if_raised"
        return self.cpu_method

    def start(self, phase: str) -> None:
        if self.cuda and self.reset_cuda_peaks:
            torch.cuda.reset_peak_memory_stats(self.device)
            start_bytes = 0
        elif self.cuda:  # (peak before, allocated now): the phase raised the peak if it is higher at the end
            start_bytes = (torch.cuda.max_memory_allocated(self.device), torch.cuda.memory_allocated(self.device))
        elif self.cpu_method == "peak_rss":
            self._note_process_peak()  # what the reset is about to forget
            _reset_peak_rss()
            start_bytes = 0
        else:
            start_bytes = _rss_bytes()
        self._open[phase] = (time.perf_counter(), start_bytes)
        self.last_started = phase

    def stop(self, phase: str) -> None:
        if phase not in self._open:
            return
        started, start_bytes = self._open.pop(phase)
        self._seconds[phase] += time.perf_counter() - started
        if self.cuda and self.reset_cuda_peaks:
            peak = torch.cuda.max_memory_allocated(self.device)
            self.process_peak_mib = max(self.process_peak_mib, peak / MIB)
        elif self.cuda:
            before, allocated = start_bytes
            peak = torch.cuda.max_memory_allocated(self.device)
            if peak <= before:  # the run's peak was set elsewhere: what the phase held at its edges
                peak = max(allocated, torch.cuda.memory_allocated(self.device))
            self._note_process_peak()
        elif self.cpu_method == "peak_rss":
            peak = (_status_kib("VmHWM") or 0) * 1024
        else:
            peak = max(start_bytes, _rss_bytes())
        self._peak[phase] = max(self._peak.get(phase, 0.0), peak / MIB)
        self.run_peaks[phase] = max(self.run_peaks.get(phase, 0.0), peak / MIB)
        if not self.cuda:  # the peak just read is the process's too
            self.process_peak_mib = max(self.process_peak_mib, peak / MIB)

    @contextmanager
    def measure(self, phase: str):
        self.start(phase)
        try:
            yield
        finally:
            self.stop(phase)

    def pending(self) -> dict[str, float]:
        """Seconds measured and not yet taken, per phase."""
        return dict(self._seconds)

    def take(self, phases: tuple[str, ...] | None = None) -> dict[str, tuple[float, float]]:
        """``{phase: (seconds, peak MiB)}`` of the phases measured since the last take (all, or those named)."""
        names = [p for p in (phases if phases is not None else list(self._seconds)) if p in self._seconds]
        return {p: (self._seconds.pop(p), self._peak.pop(p, 0.0)) for p in names}


def dynamo_graphs() -> int:
    """Graphs ``torch.compile`` has compiled in this process so far (0 when it was never used)."""
    import sys

    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:
        return 0
    return int(utils.counters["stats"].get("unique_graphs", 0))
