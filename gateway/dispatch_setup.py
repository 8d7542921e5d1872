"""The dispatch core a serving config asks for, built once here for ``gateway serve`` and for
``gateway simulate --config``: the same GPU policy with its weights, the same GPU memory and
load times, the same CPU sharing and timeouts, and the same batch limit per model (DESIGN.md
principle 1: one core decides for both, so it must be set up alike for both)."""

from __future__ import annotations

import random

from gateway.config import GatewayConfig, ModelConfig
from schedulers.dispatch import DispatchCore
from schedulers.gpu import GpuScheduler
from schedulers.gpu_memory import GpuMemory, ModelFootprint
from schedulers.round_robin import RandomRoundRobin


def gpu_memory_of(config: GatewayConfig) -> GpuMemory | None:
    """The GPUs' memory as a cache of models ([gpu] memory_mb; None: every GPU holds every model):
    each model's size and load time from the emulated GPU's profile, or its ONNX file's size and
    cuda_load_ms on a real GPU."""
    gpu = config.gpu
    if gpu.memory_mb is None or not config.node.gpus:
        return None
    footprints = {}
    for name, model in config.models.items():
        if gpu.executor == "emulated":
            memory_mb, load_ms = gpu.footprints[model.gpu_profile or name]
        else:
            memory_mb, load_ms = model.path.stat().st_size / 2**20, gpu.cuda_load_ms
        footprints[name] = ModelFootprint(memory_mb, load_ms)
    return GpuMemory(gpu.memory_mb, footprints)


def gpu_scheduler_of(config: GatewayConfig) -> GpuScheduler | None:
    """The config's GPU policy with ROMA's set point and queue weight; None without GPUs (a
    dispatcher of a cluster has one: it learns of its workers' GPUs once they connect)."""
    if not config.node.gpus and config.cluster is None:
        return None
    return GpuScheduler(config.gpu.policy, config.control.setpoint_ratio, config.gpu.queue_weight)


def dispatch_core_of(config: GatewayConfig, gpu_scheduler: GpuScheduler | None, seed: int | None = None) -> DispatchCore:
    """The dispatch core of ``config``; its CPU round robin seeded by ``[policy] seed``, else by
    ``seed`` (None: at random)."""
    gpu = config.gpu
    return DispatchCore(
        cpu_scheduler=RandomRoundRobin(random.Random(config.policy.seed if config.policy.seed is not None else seed)),
        gpu_scheduler=gpu_scheduler,
        request_timeout_s=config.server.request_timeout_ms / 1000,
        cpu_sharing=gpu.cpu_sharing,
        spill_within=gpu.spill_within,
        gpu_memory=gpu_memory_of(config),
    )


def batch_limit(model: ModelConfig, batchable: bool) -> int:
    """The most requests the core puts in one batch of ``model``: one where its tensors have no
    free leading dimension to stack requests along (gateway/signature.py)."""
    return model.max_batch_size if batchable else 1
