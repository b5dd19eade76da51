"""Decode steps on a CPU through torch.compile, the CPU's counterpart of CUDA graphs.

A small model's decode step on a CPU is bound by per-operation overhead, not arithmetic:
the eager forward pass issues about a thousand small PyTorch calls (norms, RoPE, the
attention's gathers, residual adds) around a dozen matrix-vector products. Inductor fuses
each layer's small operations into four generated C++ kernels, and a C++ wrapper calls
them and the matmuls: about 40 calls a step, none of them through Python.

Decode-only steps take this path. Attention is the C kernel (layers/cpu_paged_attention.py),
a custom op opaque to inductor that reads every row's own context, so one graph serves
every batch size and context length; with the reference attention, steps of up to
MAX_REFERENCE_COMPILED_BATCH rows put every decode row in one padded attention group.
PyTorch specialises a batch of one, so two graphs are compiled, both at start-up (5-30 s
in all on 2 cores; inductor's on-disk cache makes later starts faster). Once both
exist, steps call them directly (engine/graph_call.py), past dynamo's per-call work and,
where inductor's code alone writes the cache and returns the logits, past the graph's wrappers:
only decode-only batches of this fixed structure, with no forward hooks, reach them.
Where a direct call cannot be set up, calls go through dynamo without re-checking its
guards, and if global state a graph depends on changes anyway, the guards come back on."""
from __future__ import annotations

import logging
import time

import torch

from kvscope.engine import graph_call
from kvscope.engine.scheduler import ScheduledSeq, SchedulerOutput
from kvscope.engine.sequence import Sequence
from kvscope.engine.step_inputs import StepInputs, prepare_inputs
from kvscope.layers import cpu_ops
from kvscope.layers.context import step_metadata
from kvscope.sampling_params import SamplingParams

log = logging.getLogger("kvscope.engine")

# With the reference attention, larger decode batches run eagerly: their matmuls dominate,
# and the eager path's up to four attention groups pad far less than the compiled path's one.
# Embedded model, 1 thread, step time compiled/eager: 0.81x at batch 1, 0.91x at 16, 1.03x
# at 32, 1.23x at 64. The C kernel pads nothing, so with it every decode batch compiles.
MAX_REFERENCE_COMPILED_BATCH = 16


class DecodeLogits(torch.nn.Module):
    """The forward pass and the LM head in one graph: a decode step scores every row."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.model.compute_logits(self.model(input_ids, positions)).float()


def compile_unavailable(runner) -> str | None:
    """Why this runner cannot compile its decode step (None when it can)."""
    if runner.device.type != "cpu":
        return "compiled decode is for CPUs (a GPU captures CUDA graphs)"
    if runner.attention_backend not in ("torch", "cpu_paged"):
        return f"the {runner.attention_backend} attention backend runs eagerly"
    if runner.config.tensor_parallel_size > 1:
        return "tensor-parallel ranks run eagerly"
    return None


# Graphs live in one cache per code object, shared by every engine in the process. Each
# engine adds two per attention backend and model shape; a process that builds many
# engines (a test run) would pass dynamo's default limit of 8, and past it a fullgraph
# compile fails instead of adding one.
RECOMPILE_LIMIT = 64
# one backend object for every engine, so engines of the same model shape share graphs
INDUCTOR = graph_call.inductor_backend({"cpp_wrapper": True})


class CompiledDecode:
    def __init__(self, runner):
        self.runner = runner
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
        cpu_ops.install()   # the custom operators' C++ kernels; where they cannot build, Python's serve
        self.module = DecodeLogits(runner.model)
        self.forward = torch.compile(self.module, dynamic=True, fullgraph=True, backend=INDUCTOR)
        self.guarded = True     # until both graphs exist
        self.direct: dict[bool, graph_call.DirectCall] | None = None   # by batch > 1
        # the reference pads every row to the longest context; the kernel pads nothing
        self.max_batch = MAX_REFERENCE_COMPILED_BATCH if runner.attention_backend == "torch" else None
        start = time.perf_counter()
        # the model's float attributes (norm eps, attention scale) are constants; as graph
        # inputs (dynamo's default) the first trace was thrown away and redone with them
        # fixed: 705 calls traced instead of 428, start-up 7.0-8.3 s instead of 5.4-6.0
        with torch._dynamo.config.patch(specialize_float=True):
            warm_up_steps = self._warm_up()
        self.compile_seconds = time.perf_counter() - start
        self.guarded = not hasattr(torch.compiler, "set_stance")
        self.direct = self._direct_calls(warm_up_steps)

    def fits(self, batch: int) -> bool:
        return self.max_batch is None or batch <= self.max_batch

    def run(self, inputs: StepInputs) -> torch.Tensor:
        with step_metadata(inputs.metadata):
            if self.direct is not None:
                return self.direct[len(inputs.input_ids) > 1](inputs.input_ids, inputs.positions)
            if not self.guarded:
                try:
                    with torch.compiler.set_stance(skip_guard_eval_unsafe=True):
                        return self.forward(inputs.input_ids, inputs.positions)
                except RuntimeError as exc:   # raised before the graph runs: nothing was written
                    if "skip_guard_eval_unsafe" not in str(exc):
                        raise
                    # global state a graph depends on changed (e.g. torch.set_num_threads)
                    log.warning("compiled decode: global state changed; checking guards from now on")
                    self.guarded = True
            return self.forward(inputs.input_ids, inputs.positions)

    @torch.inference_mode()
    def _warm_up(self) -> list[StepInputs]:
        """Compile both graphs on decode steps that write and read only the scratch block,
        prepared exactly as real steps are, with every size marked as varying (so no real
        step recompiles). Returns the two steps."""
        runner = self.runner
        steps = []
        scratch = runner.num_blocks                  # the extra block past the pool
        position = min(2 * runner.block_size, runner.max_model_len - 1)
        for batch in (1, 2):
            out = SchedulerOutput(step=-1)
            for _ in range(batch):   # three blocks: no size equals another, which dynamo would tie
                seq = Sequence([0] * (position + 1), SamplingParams(), seq_id=-1)
                seq.block_table = [scratch] * 3
                out.entries.append(ScheduledSeq(seq, 1, position, samples=True))
            inputs = prepare_inputs(out, runner.block_size, runner.buffers, runner.attention_backend, compiled=True)
            _mark_sizes_dynamic(inputs, batch > 1)
            self.run(inputs)
            steps.append(inputs)
        log.info("decode step compiled for this CPU")
        return steps

    @torch.inference_mode()
    def _direct_calls(self, steps: list[StepInputs]) -> dict[bool, graph_call.DirectCall] | None:
        """A direct call per graph, trusted only where it gives dynamo's own output on the
        warm-up step (which reads and writes the scratch block alone); else None."""
        direct = {}
        try:
            for inputs in steps:
                with step_metadata(inputs.metadata):
                    graph = graph_call.graph_called(lambda: self.forward(inputs.input_ids, inputs.positions))
                    if graph is None:
                        raise ValueError("the step did not run exactly one compiled graph")
                    call = graph_call.DirectCall(graph, self.module, DecodeLogits.forward.__globals__)
                    if not torch.equal(call(inputs.input_ids, inputs.positions),
                                       self.forward(inputs.input_ids, inputs.positions)):
                        raise ValueError("a direct call differs from dynamo's")
                    call.code = self._unwrapped_code(call, inputs)
                direct[len(inputs.input_ids) > 1] = call
        except Exception as exc:   # e.g. another torch names its graph inputs differently
            log.info("compiled decode: steps go through dynamo (%s: %s)", type(exc).__name__, exc)
            return None
        return direct

    def _unwrapped_code(self, call: graph_call.DirectCall, inputs: StepInputs):
        """Inductor's code beneath `call`'s graph, if handed exactly `call`'s inputs it writes
        the scratch block's K/V and returns the logits exactly as the wrapped graph does
        (the wrappers then had nothing to do for it); else None."""
        ids, positions = inputs.input_ids, inputs.positions
        found = graph_call.inductor_code_called(lambda: call(ids, positions))
        if found is None:
            return None
        code, received = found
        sent = call.args(ids, positions)
        if len(received) != len(sent) or any(a is not b for a, b in zip(received, sent)):
            return None
        scratch = [cache[self.runner.num_blocks] for cache in (*self.runner.k_caches, *self.runner.v_caches)]
        for block in scratch:
            block.zero_()
        expected = call(ids, positions)
        written = [block.clone() for block in scratch]
        for block in scratch:
            block.zero_()
        logits = code(call.args(ids, positions))[0]
        if not (torch.equal(logits, expected) and all(map(torch.equal, scratch, written))
                and all(block.any() for block in written)):
            log.info("compiled decode: steps keep the graph's wrappers (inductor's code alone differs)")
            return None
        return code


def _mark_sizes_dynamic(inputs: StepInputs, batch_dynamic: bool) -> None:
    """The context width always varies; the batch size only in the graph for batches > 1."""
    md = inputs.metadata
    rows = [0] if batch_dynamic else []
    if batch_dynamic:
        for tensor in (inputs.input_ids, inputs.positions, md.slot_mapping, md.context_lens):
            torch._dynamo.mark_dynamic(tensor, 0)
    torch._dynamo.mark_dynamic(md.block_tables, [*rows, 1])
    for group in md.decode_groups:
        torch._dynamo.mark_dynamic(group.block_tables, [*rows, 1])
        torch._dynamo.mark_dynamic(group.mask, [*rows, 3])
