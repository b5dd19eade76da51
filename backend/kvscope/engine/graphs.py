"""Decode graphs, so a decode step's thousand small operations are not issued from Python one by
one: CUDA graphs per batch bucket on a GPU (padded rows write to the scratch block), a
torch.compile'd step on a CPU whose batch and table width are symbolic; `record_decode` decides."""
from __future__ import annotations

import logging
import time

import torch

from kvscope.engine.block_manager import cdiv
from kvscope.engine.scheduler import ScheduledSeq, SchedulerOutput
from kvscope.engine.sequence import Sequence
from kvscope.engine.step_inputs import StepInputs, prepare_inputs
from kvscope.layers.attention import (AttentionMetadata, KeptQueries, PagedRows, Route, pick_routes, query_room,
                                      step_metadata)
from kvscope.sampling_params import SamplingParams

log = logging.getLogger("kvscope.engine")

# With the reference attention, larger decode batches run eagerly: their matmuls dominate,
# and the eager path's up to four attention groups pad far less than the compiled path's one.
# Embedded model, 1 thread, step time compiled/eager: 0.81x at batch 1, 0.91x at 16, 1.03x
# at 32, 1.23x at 64. The C kernel pads nothing, so with it every decode batch compiles.
MAX_REFERENCE_COMPILED_BATCH = 16


def record_decode(runner) -> tuple[DecodeGraphs | None, CompiledDecode | None, str]:
    """CUDA graphs on a GPU unless enforce_eager, a compiled step on a CPU when cpu_compile asks:
    (graphs, compiled step, how decode steps run and why when eagerly); sets the runner's routes."""
    config, on_gpu, backend = runner.config, runner.device.type == "cuda", runner.attention_backend
    if config.enforce_eager or not (on_gpu or config.cpu_compile):
        return None, None, "eager"
    if on_gpu and backend not in ("triton", "flash_attn"):   # a captured graph reads lengths on the device
        reason = f"CUDA graphs need the triton or flash_attn backend, not {backend}"
    elif not on_gpu and backend not in ("torch", "cpu_paged"):
        reason = f"the {backend} attention backend runs eagerly"
    elif config.tensor_parallel_size > 1:
        reason = "tensor-parallel ranks run eagerly"
    elif not on_gpu and runner.kv_format.quantized:
        reason = f"a {runner.kv_format.name} KV cache decodes eagerly"
    elif on_gpu:
        runner.routes = pick_routes(backend, "cuda graphs", runner.dtype, runner.block_size)
        runner.model.fuse_elementwise()   # compiled before capture: the graphs replay the fused kernels
        graphs = DecodeGraphs(runner, max_batch=min(config.max_num_seqs, 512))
        return graphs, None, "cuda graphs (norms, RoPE, activation fused by torch.compile)"
    else:
        routes = pick_routes(backend, "compiled", runner.dtype, runner.block_size)
        try:
            compiled = CompiledDecode(runner, routes.graph)
            runner.routes = routes
            return None, compiled, f"compiled (torch.compile, {compiled.compile_seconds:.0f} s at start-up)"
        except Exception as exc:   # e.g. no C++ compiler: inductor cannot build its kernels
            reason = f"torch.compile failed ({type(exc).__name__}: {str(exc)[:200]})"
    log.warning("decode graphs: running eagerly: %s", reason)
    return None, None, f"eager: {reason}"


class CompiledDecode:
    def __init__(self, runner, route: Route):
        self.runner, self.route = runner, route
        model = runner.model

        def decode_logits(input_ids: torch.Tensor, positions: torch.Tensor, md: AttentionMetadata) -> torch.Tensor:
            """The forward pass and the LM head in one graph: a decode step scores every row."""
            with step_metadata(model, md):   # inside the graph: its tensors are the graph's inputs
                return model.compute_logits(model(input_ids, positions)).float()
        # isolate_recompiles: this engine's graphs are its own, so engines made one after another
        # never add up to dynamo's recompile limit. All guards stay (the model's too).
        self.forward = torch.compile(decode_logits, dynamic=None, fullgraph=True, isolate_recompiles=True,
                                     options={"cpp_wrapper": True})
        self.max_batch = MAX_REFERENCE_COMPILED_BATCH if runner.attention_backend == "torch" else None
        start = time.perf_counter()
        self._warm_up()
        self.compile_seconds = time.perf_counter() - start

    def fits(self, batch: int) -> bool:
        return self.max_batch is None or batch <= self.max_batch

    def run(self, inputs: StepInputs) -> torch.Tensor:
        return self.forward(inputs.input_ids, inputs.positions, inputs.metadata)

    @torch.inference_mode()
    def _warm_up(self) -> None:
        """Compile on real-shaped steps that touch only the scratch block: a batch of one at two
        widths (the width turns symbolic), a batch of two (so does the batch), then keeping the
        queries at batches of one, two and three (their sizes turn symbolic at the third)."""
        runner = self.runner
        scratch = runner.num_blocks                  # the extra block past the pool
        position = min(2 * runner.block_size, runner.max_model_len - 1)
        for batch, width, keep in ((1, 3, 0), (1, 4, 0), (2, 5, 0), (1, 6, 1), (2, 7, 1), (3, 8, 1)):
            out = SchedulerOutput(step=-1)
            for _ in range(batch):   # no width equals a batch size: dynamo would tie the two
                seq = Sequence([0] * (position + 1), SamplingParams(), seq_id=-1)
                seq.block_table, seq.num_computed_tokens = [scratch] * width, position
                out.entries.append(ScheduledSeq.row(seq, 1))
            inputs = prepare_inputs(out, runner.block_size, runner.buffers, self.route)
            if keep:
                inputs.metadata.queries = KeptQueries(slice(None), query_room(runner.attn_layers, batch, runner.dtype,
                                                                              runner.device))
            self.run(inputs)
        log.info("decode step compiled for this CPU")


# -- CUDA graphs (a GPU) ---------------------------------------------------------------
class DecodeGraphs:
    def __init__(self, runner, max_batch: int):
        self.runner = runner
        self.buckets = [b for b in (1, 2, 4, 8) if b <= max_batch] + list(range(16, max_batch + 1, 16))
        if self.buckets[-1] < max_batch:
            self.buckets.append(max_batch)
        dev = runner.device
        width = cdiv(runner.max_model_len, runner.block_size)
        self.input_ids = torch.zeros(max_batch, dtype=torch.long, device=dev)
        self.positions = torch.zeros(max_batch, dtype=torch.long, device=dev)
        self.slot_mapping = torch.full((max_batch,), runner.scratch_slot, dtype=torch.long, device=dev)
        self.block_tables = torch.zeros(max_batch, width, dtype=torch.int32, device=dev)
        self.context_lens = torch.zeros(max_batch, dtype=torch.int32, device=dev)
        self.hidden = torch.zeros(max_batch, runner.model.config.hidden_size, dtype=runner.dtype, device=dev)
        self.queries = query_room(runner.attn_layers, max_batch, runner.dtype, dev)   # every row's, while watched
        self.graphs: dict[tuple[int, bool], torch.cuda.CUDAGraph] = {}   # (bucket, keeps the queries) -> graph
        self._capture()

    def fits(self, batch: int) -> bool:
        return batch <= self.buckets[-1]

    @torch.inference_mode()
    def _capture(self) -> None:
        pool = None
        model = self.runner.model
        for b, keep in ((b, keep) for b in reversed(self.buckets) for keep in (False, True)):
            md = AttentionMetadata(self.runner.routes.graph, self.slot_mapping[:b],
                                   decode=PagedRows(slice(None), self.block_tables[:b], self.context_lens[:b]),
                                   queries=KeptQueries(slice(None), [t[:b] for t in self.queries]) if keep else None)
            with step_metadata(model, md):
                self.hidden[:b] = model(self.input_ids[:b], self.positions[:b])   # warm-up
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool):
                    self.hidden[:b] = model(self.input_ids[:b], self.positions[:b])
            pool = pool or graph.pool()
            self.graphs[(b, keep)] = graph
        torch.cuda.synchronize()

    def run(self, ids: torch.Tensor, positions: torch.Tensor, md: AttentionMetadata) -> torch.Tensor:
        n = ids.shape[0]
        b = next(x for x in self.buckets if x >= n)
        self.input_ids[:n] = ids
        self.positions[:n] = positions
        self.slot_mapping[:b].fill_(self.runner.scratch_slot)
        self.slot_mapping[:n] = md.slot_mapping
        self.context_lens[:b].zero_()
        self.context_lens[:n] = md.decode.context_lens
        self.block_tables[:n, :md.decode.block_tables.shape[1]] = md.decode.block_tables
        self.graphs[(b, md.queries is not None)].replay()
        for kept, static in zip(md.queries.out if md.queries is not None else [], self.queries):
            kept.copy_(static[:n])
        return self.hidden[:n]
