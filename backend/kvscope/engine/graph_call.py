"""Call a graph that torch.compile built without going back through dynamo each step.

Each call of a compiled module passes through dynamo: the module's __call__, the frame
hook, the cache lookup and its guards, and bytecode that fetches every graph input (about
fifty: each parameter, packed weight and KV cache by attribute lookups down the module
tree) before calling inductor's code. On the embedded model's decode step that costs about
0.2 ms of a 2.5 ms step. The compiled decode step's inputs never change identity except
the step's own tensors, so they can be fetched once.

The compiler below is inductor itself (torch.compile's default), which also remembers
where dynamo found each graph input (the `source` of each placeholder, an expression over
the frame's locals `L` and globals `G`). A `DirectCall` turns those expressions into one
function: constants (anything reached from the module) evaluated once, the step's own
inputs (`input_ids`, `positions`, the step metadata) fetched per call. The caller checks
a DirectCall against dynamo's own call before trusting it, and keeps dynamo's path where
the expressions cannot be read."""
from __future__ import annotations

import functools

import torch

PER_STEP = ("L['input_ids']", "L['positions']", "G[")   # sources that change every step
_seen: list["CompiledGraph"] | None = None             # graphs called while this is a list


class CompiledGraph:
    """Inductor's compiled graph with the sources of its inputs, in placeholder order, and
    which of those inputs are sizes (ints) rather than tensors."""

    def __init__(self, compiled, sources: list[str | None], sizes: list[bool]):
        self.compiled, self.sources, self.sizes = compiled, sources, sizes

    def __call__(self, *args):
        if _seen is not None:
            _seen.append(self)
        return self.compiled(*args)


def inductor_backend(options: dict):
    """A torch.compile backend: inductor with `options`, keeping each graph's input sources."""
    def compile_graph(gm: torch.fx.GraphModule, example_inputs):
        # imported here: inductor pulls in jinja2, which importing the engine must not need
        from torch._inductor.compile_fx import compile_fx
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        sources = []
        for node in placeholders:
            arg = node.meta.get("grapharg")
            sources.append(arg.source.name if arg is not None and arg.source is not None else None)
        sizes = [not isinstance(x, torch.Tensor) for x in example_inputs]
        return CompiledGraph(compile_fx(gm, example_inputs, config_patches=options), sources, sizes)
    return compile_graph


def graph_called(call) -> CompiledGraph | None:
    """The one compiled graph that running `call()` went through (None if not exactly one)."""
    global _seen
    _seen = []
    try:
        call()
        seen = _seen
    finally:
        _seen = None
    return seen[0] if len(seen) == 1 else None


class DirectCall:
    """`graph`'s inputs fetched by one generated function: constants read once from
    `module`, the rest per call from the step's input_ids, positions and `frame_globals`."""

    def __init__(self, graph: CompiledGraph, module: torch.nn.Module, frame_globals: dict):
        if None in graph.sources:
            raise ValueError("a graph input has no source")
        constants, items = [], []
        for source, size in zip(graph.sources, graph.sizes):
            if source.startswith(PER_STEP):
                items.append(f"S({source})" if size else source)
            else:
                # dynamo's own expressions, over the module this engine compiled
                value = eval(source, {}, {"L": {"self": module}})
                constants.append(size_tensor(value) if size else value)
                items.append(f"C[{len(constants) - 1}]")
        self.graph, self.constants, self.frame_globals = graph.compiled, constants, frame_globals
        self.fetch = eval(f"lambda L, G, C, S: [{', '.join(items)}]")
        self.code = None   # inductor's own code, once trusted to run without the graph's wrappers

    def args(self, input_ids: torch.Tensor, positions: torch.Tensor) -> list:
        """The graph's inputs for a step, in a new list."""
        return self.fetch({"input_ids": input_ids, "positions": positions}, self.frame_globals, self.constants,
                          size_tensor)

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        args = self.args(input_ids, positions)
        if self.code is not None:
            return self.code(args)[0]   # inductor's convention: one list, which it empties
        return self.graph(*args)[0]


def inductor_code_called(call) -> tuple[object, list] | None:
    """The code inductor generated that running `call()` reached, and the list of inputs it
    was handed (None unless exactly one). Above it sit AOT autograd's runtime wrapper and
    dynamo's disable context, about 45 µs of Python a decode step; a caller may go straight
    to this code where it checked that nothing the wrappers do is needed."""
    from torch._inductor.output_code import CompiledFxGraph
    seen = []
    wrapped = CompiledFxGraph.__call__

    def spy(graph, inputs):
        seen.append((graph.current_callable, list(inputs)))   # copied: the code empties its list
        return wrapped(graph, inputs)

    CompiledFxGraph.__call__ = spy
    try:
        call()
    finally:
        CompiledFxGraph.__call__ = wrapped
    return seen[0] if len(seen) == 1 else None


@functools.lru_cache(maxsize=4096)
def size_tensor(value: int) -> torch.Tensor:
    """A size as the tensor inductor's C++ wrapper takes (it only reads it), made once: the
    wrapper's Python shim would build one per size on every call (about 4 µs each)."""
    return torch.tensor(value)
