"""Tensor parallelism (gloo on CPU, NCCL on CUDA): rank 0 schedules and broadcasts each step's
`StepPlan`; every other rank (spawned, or under torchrun the user's script) replays it through
its slice of the weights and KV heads, joining the layers' all-reduces. Only rank 0 samples."""
from __future__ import annotations

import dataclasses
import os
import socket
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from kvscope.engine.model_runner import StepPlan, load_model_and_runner
from kvscope.engine.plan import resolve_device
from kvscope.engine.step_inputs import sampled_rows
from kvscope.layers.attention import step_metadata
from kvscope.layers.parallel import TPGroup, split
from kvscope.models.loader import read_model_config, resolve_model_path

COLLECTIVE_TIMEOUT = timedelta(seconds=60)   # a dead peer is noticed within this, at the latest


class WorkerDied(RuntimeError):
    pass


def torchrun_rank() -> int | None:
    """This process's rank when torchrun launched it, else None."""
    return int(os.environ["RANK"]) if all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR")) else None


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def rank_device(device: torch.device, rank: int) -> torch.device:
    return torch.device("cuda", rank) if device.type == "cuda" else device


def check_tp(size: int, model_config, device: torch.device) -> None:
    if size < 1:
        raise ValueError(f"tensor_parallel_size must be >= 1, got {size}")
    for what, n in (("num_attention_heads", model_config.num_heads),
                    ("num_key_value_heads", model_config.num_kv_heads)):
        split(n, TPGroup(0, size), what)   # raises where the heads do not split evenly
    if device.type == "cuda" and size > torch.cuda.device_count():
        raise ValueError(f"tensor_parallel_size {size} needs {size} GPUs; {torch.cuda.device_count()} visible")


def move(obj, device: torch.device):
    """Tensors inside (nested dataclasses, lists) moved to `device`."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: move(getattr(obj, f.name), device)
                                           for f in dataclasses.fields(obj) if f.init})
    if isinstance(obj, list):
        return [move(x, device) for x in obj]
    return obj


# -- rank 0 ------------------------------------------------------------------------------
class TPWorkers:
    """Rank 0's handle on the other ranks."""
    def __init__(self, size: int, device: torch.device, processes: list):
        self.size, self.device, self.processes = size, device, processes
        self.group = TPGroup(0, size)
        self.alive = True

    @classmethod
    def start(cls, config, model_config, dtype: torch.dtype, max_model_len: int, device: torch.device) -> "TPWorkers":
        """The other ranks; under torchrun, ranks > 0 serve rank 0's steps here, then exit."""
        size = config.tensor_parallel_size
        check_tp(size, model_config, device)
        if rank := torchrun_rank():
            worker_main(rank, size, "env://", config, dtype, max_model_len)
            raise SystemExit(0)
        device, processes = rank_device(device, 0), []
        if rank is not None:
            init_method = "env://"
        else:
            init_method = f"tcp://127.0.0.1:{_free_port()}"
            ctx = mp.get_context("spawn")
            for rank in range(1, size):
                p = ctx.Process(target=worker_main, args=(rank, size, init_method, config, dtype, max_model_len),
                                daemon=True)
                p.start()
                processes.append(p)
        dist.init_process_group(backend_for(device), init_method=init_method, rank=0, world_size=size,
                                timeout=COLLECTIVE_TIMEOUT)
        return cls(size, device, processes)

    def send_setup(self, num_blocks: int) -> None:
        dist.broadcast_object_list([num_blocks], src=0)

    def send(self, plan: StepPlan | None) -> None:
        if dead := [p for p in self.processes if p.exitcode is not None]:
            raise WorkerDied(f"tensor-parallel worker (pid {dead[0].pid}) exited with code {dead[0].exitcode}")
        dist.broadcast_object_list([move(plan, torch.device("cpu"))], src=0)

    def shutdown(self) -> None:
        if not self.alive:
            return
        self.alive = False
        try:
            if all(p.exitcode is None for p in self.processes):
                dist.broadcast_object_list([None], src=0)
        except RuntimeError:
            pass
        for p in self.processes:
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()
        if dist.is_initialized():
            dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- ranks > 0 ---------------------------------------------------------------------------
def worker_main(rank: int, size: int, init_method: str, config, dtype: torch.dtype, max_len: int) -> None:
    device = rank_device(resolve_device(config.device), rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    dist.init_process_group(backend_for(device), init_method=init_method, rank=rank, world_size=size,
                            timeout=COLLECTIVE_TIMEOUT)
    try:
        path = resolve_model_path(config.model)
        runner = load_model_and_runner(config, path, read_model_config(path), dtype, device, max_len,
                                       lambda model: _receive(), TPGroup(rank, size))   # `send_setup`'s pool size
        while (plan := _receive()) is not None:
            replay(runner, move(plan, device))
    finally:
        dist.destroy_process_group()


def _receive():
    """The next object rank 0 broadcasts: the KV pool size, then each step's plan, then None."""
    box = [None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


@torch.inference_mode()
def replay(runner, plan: StepPlan) -> None:
    runner.copy_blocks(plan.block_copies)
    with step_metadata(runner.model, plan.metadata):
        hidden = runner.model(plan.input_ids, plan.positions)
    if plan.sample_rows:
        runner.model.compute_logits(sampled_rows(hidden, plan.sample_rows))
    runner.model.tp.take_comm()   # only rank 0's count is published
