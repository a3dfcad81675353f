"""A CPU stand-in for NCCL under TRL's vLLM server mode: the weight bytes go over gloo instead.

What it is for: running ``vllm_mode: server`` (vLLM as its own process, TRL's multi-GPU layout) on machines without
CUDA, for tests and CPU benchmarks. On GPUs use TRL and vLLM as they ship (``--weight-transfer-config
'{"backend": "nccl"}'``); nothing here is needed or used there.

Why it is needed: TRL 1.16's ``VLLMClient.init_communicator`` refuses a non-CUDA device, and every weight-transfer
engine vLLM 0.31 registers (``nccl``, ``ipc``, ``sparse_nccl``, ``sharded_rdt``, ``nccl_m2n``) needs CUDA; without
libnccl vLLM's ``PyNcclCommunicator`` turns itself off and its ``broadcast`` returns without sending, so an NCCL
stand-in can look as if it works while the server keeps its old weights.

What is real and what is not: the ``vllm serve`` process, its HTTP API (generation and the dev endpoints
``/init_weight_transfer_engine``, ``/start_weight_update``, ``/update_weights``, ``/finish_weight_update``), TRL's
server branch (its sync, metadata, prefix-cache reset, its generation requests) and the engine's reload of the new
weights (vLLM's layerwise reload, as its NCCL engine does it) are vLLM's and TRL's own. Only the transport of the bytes
is a stand-in: one gloo broadcast per tensor from the trainer (rank 0) to the server's worker (rank 1), over a
``TCPStore`` rendezvous at TRL's ``vllm_group_port``.

The two halves:

- server: ``vllm serve MODEL --worker-extension-cls rookgrpo.vllm_cpu_transport.CPUTransportWorkerExtension
  --weight-transfer-config '{"backend": "cpu_gloo"}'`` (with ``VLLM_SERVER_DEV_MODE=1``). vLLM imports this module in
  its worker to resolve the extension class; importing it registers the ``cpu_gloo`` engine
  (:class:`GlooWeightTransferEngine`).
- trainer: ``CPUTransportClient`` (:func:`make_client_class`), TRL's ``VLLMClient`` with the same interface, its
  communicator and weight stream replaced; :func:`use_cpu_transport` makes TRL's server mode build it
  (:func:`rookgrpo.trl_compat.replace_vllm_client`). For TRL's ``AsyncGRPOTrainer``, :class:`AsyncCPUWeightTransfer`
  is its ``WeightTransferProtocol`` (``weight_transfer=``).

vLLM internals used (checked against ``vllm_compat.CHECKED_VLLM``; :func:`check_vllm_internals` names what is
missing): the weight-transfer factory's ``register_engine``, ``NCCLWeightTransferEngine`` (its
``start_weight_update`` / ``finish_weight_update``: the layerwise reload), ``WeightTransferInitInfo``, and the CPU
kernels' repacking of kept weights after a reload (:func:`rookgrpo.vllm_compat.repack_kept_weights`: without it a
tied LM head keeps its start kernel in server mode as in colocate).
"""

from __future__ import annotations

import datetime
import importlib
import ipaddress
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

from .vllm_compat import CHECKED_VLLM  # the vLLM versions the transport was written and checked against
#: The name the worker-side engine is registered under (``--weight-transfer-config '{"backend": "cpu_gloo"}'``).
BACKEND = "cpu_gloo"
#: The worker extension class to name in ``--worker-extension-cls``.
WORKER_EXTENSION = "rookgrpo.vllm_cpu_transport.CPUTransportWorkerExtension"
#: Seconds a rendezvous or a broadcast waits for the other side.
TIMEOUT_S = 300

# (module, attribute) pairs of vLLM this module needs
_NEEDED = (
    ("vllm.distributed.weight_transfer.factory", "WeightTransferEngineFactory"),
    ("vllm.distributed.weight_transfer.base", "WeightTransferInitInfo"),
    ("vllm.distributed.weight_transfer.nccl_engine", "NCCLWeightTransferEngine"),
    ("vllm.distributed.weight_transfer.nccl_engine", "NCCLWeightTransferUpdateInfo"),
    ("vllm.model_executor.model_loader.reload", "initialize_layerwise_reload"),
    ("vllm.model_executor.model_loader.reload", "finalize_layerwise_reload"),
)


def check_vllm_internals() -> None:
    """Raise ``RuntimeError`` naming the installed vLLM version and the first internal this transport needs that it
    lacks (the transport was written against :data:`CHECKED_VLLM`)."""
    from .vllm_compat import _vllm_version

    for module, name in _NEEDED:
        try:
            found = hasattr(importlib.import_module(module), name)
        except ImportError:
            found = False
        if not found:
            raise RuntimeError(
                f"rookgrpo's CPU weight transport (vllm_cpu_transport) was written against vLLM "
                f"{', '.join(CHECKED_VLLM)}; the installed vLLM {_vllm_version()} has no {module}.{name}. Install vLLM "
                f"{CHECKED_VLLM[-1]} for CPU server mode (constraints-vllm.txt), or generate colocated "
                "(vllm_mode: colocate).")
    from .vllm_compat import check_repack_internals

    check_repack_internals()


def _gloo_group(host: str, port: int, rank: int, world_size: int):
    """A gloo process group of its own (not torch's default group, which the trainer or vLLM may hold) over a
    ``TCPStore`` at ``host:port`` that rank 0 serves."""
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=TIMEOUT_S)
    store = dist.TCPStore(host, port, world_size, is_master=rank == 0, timeout=timeout)
    group = dist.ProcessGroupGloo(dist.PrefixStore("rookgrpo-cpu-transport", store), rank, world_size, timeout)
    return group, store


def _broadcast(group, tensor) -> None:
    import torch.distributed as dist

    options = dist.BroadcastOptions()
    options.rootRank = 0
    group.broadcast([tensor], options).wait()


# ---- the server's side: vLLM's worker -----------------------------------------------------------------------------

@dataclass
class GlooInitInfo:
    """What the worker needs to join the trainer's group (the fields of TRL's NCCL init info that apply)."""

    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    packed: bool = False  # sent by TRL's client for NCCL; the stand-in sends tensor by tensor


def _engine_class():
    from vllm.distributed.weight_transfer.nccl_engine import (
        NCCLWeightTransferEngine,
        NCCLWeightTransferUpdateInfo,
    )

    class GlooWeightTransferEngine(NCCLWeightTransferEngine):
        """vLLM's NCCL weight-transfer engine with its transport replaced by gloo: the same update protocol and the
        same layerwise reload around it (inherited), then the CPU kernels of layers that keep their weight rebuilt."""

        init_info_cls = GlooInitInfo
        update_info_cls = NCCLWeightTransferUpdateInfo

        def init_transfer_engine(self, init_info: GlooInitInfo) -> None:
            parallel = self.parallel_config
            rank = parallel.data_parallel_index * parallel.world_size + parallel.rank + init_info.rank_offset
            self.model_update_group, self._store = _gloo_group(init_info.master_address, init_info.master_port, rank,
                                                               init_info.world_size)
            logger.info("cpu_gloo weight transfer: joined as rank %d of %d", rank, init_info.world_size)

        def finish_weight_update(self) -> None:
            from .vllm_compat import repack_kept_weights

            super().finish_weight_update()
            repack_kept_weights(self.model)

        def receive_weights(self, update_info) -> None:
            import torch

            if self.model_update_group is None:
                raise RuntimeError("cpu_gloo weight transfer not initialized: call init_transfer_engine() first")
            for name, dtype_name, shape in zip(update_info.names, update_info.dtype_names, update_info.shapes):
                weight = torch.empty(shape, dtype=getattr(torch, dtype_name), device=self.device)
                _broadcast(self.model_update_group, weight)
                self.model.load_weights([(name, weight)])

        def shutdown(self) -> None:
            self.model_update_group = self._store = None

    GlooWeightTransferEngine.__name__ = GlooWeightTransferEngine.__qualname__ = "GlooWeightTransferEngine"
    return GlooWeightTransferEngine


def register() -> bool:
    """Register the ``cpu_gloo`` engine with vLLM's weight-transfer factory (once; returns whether this call did)."""
    check_vllm_internals()
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    if BACKEND in WeightTransferEngineFactory._registry:
        return False
    WeightTransferEngineFactory.register_engine(BACKEND, _engine_class())
    return True


class CPUTransportWorkerExtension:
    """Named in ``--worker-extension-cls`` so that vLLM imports this module in its worker (which registers the
    ``cpu_gloo`` engine). It adds one method to the worker, for a check over ``collective_rpc``."""

    def rookgrpo_cpu_transport(self) -> str:
        return BACKEND


try:  # vLLM imports this module in its worker to resolve the extension class: register the engine there
    import vllm  # noqa: F401
except ImportError:
    pass
else:
    register()


# ---- the trainer's side: TRL's client -----------------------------------------------------------------------------

def _loopback(host: str | None) -> bool:
    if host in (None, "localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _join_as_trainer(post_init, host: str | None, port: int, world_size: int):
    """Open the trainer's end of the group (rank 0, serving the store) while ``post_init(init_info)`` asks the server
    to join it: the server blocks in the rendezvous while it handles the request, so the two run together."""
    from vllm.utils.network_utils import get_ip

    address = "127.0.0.1" if _loopback(host) else get_ip()
    init_info = {"master_address": address, "master_port": port, "rank_offset": 1, "world_size": world_size}
    with ThreadPoolExecutor(max_workers=1) as executor:
        future = executor.submit(post_init, init_info)
        group = _gloo_group(address, port, 0, world_size)
        future.result()
    return group


def _stream(group, post_update, names: list[str], named_params) -> None:
    """Broadcast ``named_params`` tensor by tensor, in the announced order, while ``post_update()`` has the server
    receive them (its request returns once every tensor landed)."""
    with ThreadPoolExecutor(max_workers=1) as executor:
        future = executor.submit(post_update)
        sent = 0
        for (name, tensor), expected in zip(named_params, names):
            if name != expected:
                raise RuntimeError(f"weight stream out of order: sent {name!r} where {expected!r} was announced")
            _broadcast(group, tensor.detach().contiguous().cpu())
            sent += 1
        if sent != len(names):
            raise RuntimeError(f"weight stream sent {sent} tensors of the {len(names)} announced")
        future.result()


def _check_backend(info: dict, url: str) -> None:
    backend = ((info or {}).get("weight_transfer_config") or {}).get("backend")
    if backend != BACKEND:
        raise RuntimeError(
            f"The vLLM server at {url} runs weight-transfer backend {backend!r}; the CPU transport needs {BACKEND!r}: "
            f"start it with --worker-extension-cls {WORKER_EXTENSION} --weight-transfer-config "
            f"'{{\"backend\": \"{BACKEND}\"}}' (VLLM_SERVER_DEV_MODE=1).")


def make_client_class():
    """TRL's ``VLLMClient`` with the CPU transport (built on first use so that importing this module needs no TRL)."""
    from trl.generation.vllm_client import VLLMClient

    class CPUTransportClient(VLLMClient):
        """TRL's ``VLLMClient``: the same HTTP calls, its communicator a gloo group and its weight stream a gloo
        broadcast per tensor. The server must run the ``cpu_gloo`` engine (module docstring)."""

        def init_communicator(self, device=0):
            _check_backend(self.get_server_info(), self.base_url)

            def post_init(init_info):
                return self._post(f"{self.base_url}/init_weight_transfer_engine", json={"init_info": init_info})

            self.communicator, self._store = _join_as_trainer(post_init, self.host, self.group_port,
                                                              self.get_world_size() + 1)

        def update_named_params(self, metadata, named_params):
            names, dtype_names, shapes = (list(field) for field in zip(*metadata, strict=True))
            update_info = {"names": names, "dtype_names": dtype_names, "shapes": shapes}
            if not self._updating_weights:
                self._start_weight_update()
            _stream(self.communicator, lambda: self._post(f"{self.base_url}/update_weights",
                                                          json={"update_info": update_info}), names, named_params)
            if not self._updating_weights:
                self._finish_weight_update()

        def close_communicator(self):
            self.communicator = self._store = None

    return CPUTransportClient


class AsyncCPUWeightTransfer:
    """TRL's ``WeightTransferProtocol`` for ``AsyncGRPOTrainer`` (``weight_transfer=``) over the ``cpu_gloo`` engine:
    the same server calls as TRL's ``WeightTransferClient`` (pause, start, update, finish, resume), the bytes over
    gloo. TRL's default announces the parameters from the model at start; this one announces each sync's from the
    stream it is handed (it holds one CPU copy of the weights while it sends: fine for the models a CPU serves).

    Args:
        server_url: the vLLM server (``AsyncGRPOConfig.vllm_server_base_url``).
        group_port: the port of the trainer's end of the group (default: a free one).
    """

    def __init__(self, server_url: str, group_port: int | None = None, timeout: int = TIMEOUT_S):
        from trl.experimental.async_grpo.vllm_client import VLLMClient

        self.vllm, self.timeout = VLLMClient(server_url), timeout
        self.group_port = group_port or free_port()
        self.group = self._store = None
        self.syncs = 0  # weight updates sent (for tests and logs)

    def init_weight_transfer(self) -> None:
        self.vllm.wait_for_server_ready()
        _check_backend(self.vllm.get_server_info(), self.vllm.server_url)
        host = self.vllm.server_url.split("://", 1)[-1].split("/", 1)[0].rsplit(":", 1)[0]
        self.group, self._store = _join_as_trainer(
            lambda info: self.vllm.init_weight_transfer_engine(info, timeout=self.timeout), host, self.group_port,
            self.vllm.get_world_size() + 1)

    def pause(self) -> None:
        self.vllm.pause(timeout=self.timeout)

    def resume(self) -> None:
        self.vllm.resume(timeout=self.timeout)

    def send_weights(self, iterator) -> None:
        if self.group is None:
            return
        pairs = [(name, tensor.detach().contiguous().cpu()) for name, tensor in iterator]
        info = {"names": [n for n, _ in pairs], "dtype_names": [str(t.dtype).split(".")[-1] for _, t in pairs],
                "shapes": [list(t.shape) for _, t in pairs]}
        self.vllm.start_weight_update(timeout=self.timeout)
        try:
            _stream(self.group, lambda: self.vllm.update_weights(info, timeout=self.timeout), info["names"], pairs)
        finally:
            self.vllm.finish_weight_update(timeout=self.timeout)
        self.syncs += 1

    def destroy(self) -> None:
        self.group = self._store = None


def free_port() -> int:
    """A free TCP port on loopback (for a server or a group's store)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def use_cpu_transport() -> type:
    """Make TRL's server mode (``vllm_mode: server``) build the CPU transport's client; returns the class. Call before
    the trainer is built; the server must run the ``cpu_gloo`` engine (module docstring)."""
    from .trl_compat import replace_vllm_client

    cls = make_client_class()
    replace_vllm_client(cls)
    return cls


def serve_command(model: str, port: int, *, host: str = "127.0.0.1", max_model_len: int = 512,
                  extra: list[str] | None = None, python: str | None = None) -> list[str]:
    """The command that starts a CPU vLLM server the transport can push weights to: ``vllm serve`` with TRL 1.16's
    server flags (processed log-probs, unlimited log-probs count) and the ``cpu_gloo`` engine, through :func:`serve`
    (``python -m rookgrpo.vllm_cpu_transport serve ...``). Run it with :func:`server_env` (the dev endpoints)."""
    import sys

    return [python or sys.executable, "-m", "rookgrpo.vllm_cpu_transport", "serve", model, "--host", host,
            "--port", str(port), "--max-model-len", str(max_model_len),
            "--logprobs-mode", "processed_logprobs", "--max-logprobs", "-1",
            "--worker-extension-cls", WORKER_EXTENSION,
            "--weight-transfer-config", '{"backend": "%s"}' % BACKEND, *(extra or [])]


def server_env(base: dict[str, Any] | None = None) -> dict[str, str]:
    """The environment a CPU server needs: the dev endpoints on, a small KV cache."""
    import os

    env = dict(os.environ if base is None else base)
    env.update(VLLM_SERVER_DEV_MODE="1")
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    return env


class LocalServer:
    """A CPU ``vllm serve`` process on a free loopback port with the ``cpu_gloo`` engine (:func:`serve_command`),
    started and waited for until it answers its health check; :meth:`stop` ends it (tests, CPU benchmarks).

    Args:
        model: the model folder it serves.
        log: the file its output goes to (its tail is in the error when it fails to start).
        extra: more ``vllm serve`` flags.
        start_s: seconds to wait for it to answer (about 45 here).
    """

    def __init__(self, model, log, extra: list[str] | None = None, start_s: float = 300):
        import subprocess
        from pathlib import Path

        self.model, self.log, self.port = model, Path(log), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(serve_command(str(model), self.port, extra=extra), env=server_env(),
                                        stdout=self.log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
        self._wait(start_s)

    def _wait(self, start_s: float) -> None:
        import time

        import requests

        deadline = time.monotonic() + start_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {self.process.returncode}:\n{self.log.read_text()[-4000:]}")
            try:
                if requests.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(1)
        self.stop()
        raise RuntimeError(f"vllm serve did not answer within {start_s} s:\n{self.log.read_text()[-4000:]}")

    def stop(self) -> None:
        import os
        import signal
        import subprocess

        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


def serve(argv: list[str]) -> None:
    """``vllm serve`` as vLLM's own command line runs it (``argv`` from ``serve`` on). vllm-cpu 0.31's ``vllm``
    command fails at start looking up the version of a package named ``vllm`` (its package is ``vllm-cpu``); the
    lookup is answered with vllm-cpu's version and nothing else changes."""
    import importlib.metadata as metadata
    import sys

    version = metadata.version

    def lookup(name: str) -> str:
        try:
            return version(name)
        except metadata.PackageNotFoundError:
            if name == "vllm":
                return version("vllm-cpu")
            raise

    metadata.version = lookup
    from vllm.entrypoints.cli.main import main

    sys.argv = ["vllm", *argv]
    main()


if __name__ == "__main__":  # python -m rookgrpo.vllm_cpu_transport serve MODEL ... (the arguments of vllm serve)
    import sys

    serve(sys.argv[1:])
