"""Tensor parallelism (gloo on CPU, NCCL on CUDA): rank 0 schedules and broadcasts each step's
`StepInputs`; every other rank (spawned, or under torchrun the user's script) replays it through
its slice of the weights and KV heads, joining the layers' all-reduces. Only rank 0 samples."""
from __future__ import annotations

import dataclasses
import os
import socket
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from kvscope.engine.model_runner import ModelRunner
from kvscope.engine.plan import resolve_device
from kvscope.engine.step_inputs import StepInputs, sampled_rows
from kvscope.layers.attention import step_metadata
from kvscope.layers.parallel import TPGroup, split
from kvscope.models.loader import read_model_config, resolve_model_path

COLLECTIVE_TIMEOUT = timedelta(seconds=60)   # a dead peer is noticed within this, at the latest


def init_process_group(device: torch.device, init_method: str, rank: int, size: int) -> torch.device:
    """Join the group (gloo on CPU, NCCL on CUDA); returns this rank's device."""
    if device.type == "cuda":
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method=init_method, rank=rank,
                            world_size=size, timeout=COLLECTIVE_TIMEOUT)
    return device


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
    """Rank 0's handle on the other ranks, which it starts: spawned here, or under torchrun the
    user's script, whose ranks > 0 serve rank 0's steps in this constructor, then exit."""
    def __init__(self, config, model_config, dtype: torch.dtype, max_model_len: int, device: torch.device):
        size = config.tensor_parallel_size
        self.group = group = TPGroup(0, size)
        split(model_config.num_heads, group, "num_attention_heads")   # raises where the heads do not split evenly
        split(model_config.num_kv_heads, group, "num_key_value_heads")
        if device.type == "cuda" and size > torch.cuda.device_count():
            raise ValueError(f"tensor_parallel_size {size} needs {size} GPUs; {torch.cuda.device_count()} visible")
        self.processes, self.alive, init_method = [], True, "env://"
        if all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR")):   # torchrun started every rank
            if rank := int(os.environ["RANK"]):
                worker_main(rank, size, init_method, config, dtype, max_model_len)
                raise SystemExit(0)
        else:
            with socket.socket() as s:   # a free port
                s.bind(("127.0.0.1", 0))
                init_method = f"tcp://127.0.0.1:{s.getsockname()[1]}"
            ctx = mp.get_context("spawn")
            for rank in range(1, size):
                p = ctx.Process(target=worker_main, args=(rank, size, init_method, config, dtype, max_model_len),
                                daemon=True)
                p.start()
                self.processes.append(p)
        self.device = init_process_group(device, init_method, 0, size)

    def send(self, plan: StepInputs | int | None) -> None:
        """The KV pool's size, then each step's plan, then None."""
        if dead := [p for p in self.processes if p.exitcode is not None]:
            raise RuntimeError(f"tensor-parallel worker (pid {dead[0].pid}) exited with code {dead[0].exitcode}")
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


# -- ranks > 0 ---------------------------------------------------------------------------
def worker_main(rank: int, size: int, init_method: str, config, dtype: torch.dtype, max_len: int) -> None:
    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    device = init_process_group(resolve_device(config.device), init_method, rank, size)
    try:
        path = resolve_model_path(config.model)
        runner = ModelRunner(config, path, read_model_config(path), dtype, device, max_len,
                             lambda model: _receive(), TPGroup(rank, size))   # the pool size rank 0 sent
        with torch.inference_mode():
            while (inputs := _receive()) is not None:   # rank 0's forward pass, replayed through this rank's slices
                inputs = move(inputs, device)
                runner.copy_blocks(inputs.block_copies)
                with step_metadata(runner.model, inputs.metadata):
                    hidden = runner.model(inputs.input_ids, inputs.positions)
                if inputs.sample_rows:
                    runner.model.compute_logits(sampled_rows(hidden, inputs.sample_rows))
                runner.model.tp.comm.take()   # only rank 0's count is published
    finally:
        dist.destroy_process_group()


def _receive():
    """The next object rank 0 broadcasts: the KV pool size, then each step's plan, then None."""
    box = [None]
    dist.broadcast_object_list(box, src=0)
    return box[0]
