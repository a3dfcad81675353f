"""Test-only launcher: ``python -m rookgrpo`` with accelerate's own FSDP2 code path applied on CPU processes (gloo).

Why a shim: accelerate 1.15 keeps ``DistributedType.MULTI_CPU`` whenever the process runs on CPU (``use_cpu``), so an
FSDP config launched on a machine without GPUs trains unsharded DDP-style and nothing of FSDP2 is exercised. This
promotes the state to ``DistributedType.FSDP`` with the plugin accelerate built from the launch environment (its
``ACCELERATE_USE_FSDP`` and ``FSDP_*`` variables), after ``AcceleratorState.__init__``; from there every step is
accelerate's, transformers' and TRL's own FSDP2 path (``fully_shard`` over gloo). Never used outside the tests.

    accelerate launch --config_file tests/assets/fsdp2-cpu.yaml tests/assets/fsdp2_cpu.py RECIPE --use_cpu true
"""

import os
import runpy
import sys

from accelerate.state import AcceleratorState, PartialState
from accelerate.utils import DistributedType

_init = AcceleratorState.__init__


def _init_with_fsdp_on_cpu(self, *args, fsdp_plugin=None, **kwargs):
    _init(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
    if (self.distributed_type == DistributedType.MULTI_CPU and fsdp_plugin is not None
            and os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"):
        self.distributed_type = DistributedType.FSDP
        self.fsdp_plugin = fsdp_plugin
        PartialState._shared_state["distributed_type"] = DistributedType.FSDP


AcceleratorState.__init__ = _init_with_fsdp_on_cpu

if __name__ == "__main__":
    sys.argv[0] = "rookgrpo"
    runpy.run_module("rookgrpo", run_name="__main__", alter_sys=True)
