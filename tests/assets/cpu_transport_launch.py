"""``python -m rookgrpo`` with TRL's server-mode client replaced by the CPU weight transport's (test-only: the server
tests launch two trainer processes with ``accelerate launch tests/assets/cpu_transport_launch.py RECIPE``)."""

import sys

if __name__ == "__main__":
    from rookgrpo.cli import run_module
    from rookgrpo.vllm_cpu_transport import use_cpu_transport

    use_cpu_transport()
    sys.exit(run_module(sys.argv[1:]))
