"""Events that show a watched request's journey through the model, built from the tensors
the forward hooks caught (`capture.StepCapture.tensors`): its embedding rows and their
neighbours in the real embedding matrix, the residual stream's size after every
sublayer, the SwiGLU MLP's activations, and the logit lens (the final norm and LM head
applied to every layer's output). Built only for watches that ask for internals."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kvscope.engine.sequence import Sequence
from kvscope.models.decoder import inverse_frequencies

HIST_BINS = 24
TOP_NEURONS = 8
LENS_TOP = 5
NEIGHBOURS = 6
VOCAB_POINTS = 2048   # vocabulary points drawn in the 2-D projection (evenly spaced ids)
DIGITS = 4


def r4(t: torch.Tensor) -> list:
    return [round(x, DIGITS) for x in t.tolist()] if t.dim() == 1 else [r4(row) for row in t]


@dataclass
class EmbeddingFacts:
    """The embedding matrix seen whole, computed once: unit rows for cosine similarity and
    the two principal axes of those unit rows, centred (a PCA of where tokens point, so a
    few rows of unusual length cannot claim an axis), deterministic up to a sign we fix.
    Only the rows the tokenizer can produce count: checkpoints pad the matrix with rows no
    text ever reaches (kvscope-mini: 2,048 rows, 2,027 tokens), and those untrained rows
    would otherwise dominate both the neighbours and the axes."""
    unit: torch.Tensor       # [vocab, hidden], rows of norm 1
    mean: torch.Tensor       # [hidden]
    axes: torch.Tensor       # [2, hidden]
    explained: list[float]   # share of the variance along each axis
    vocab_ids: list[int]
    vocab_points: list[list[float]]

    @classmethod
    def of(cls, weight: torch.Tensor, num_tokens: int | None = None) -> "EmbeddingFacts":
        w = F.normalize(weight.detach().float().cpu()[:num_tokens], dim=1)
        mean = w.mean(dim=0)
        centred = w - mean
        cov = centred.T @ centred
        values, vectors = torch.linalg.eigh(cov)                 # ascending
        axes = vectors[:, [-1, -2]].T.contiguous()                # [2, hidden]
        signs = torch.sign(axes.gather(1, axes.abs().argmax(dim=1, keepdim=True)))
        axes = axes * signs
        explained = (values[[-1, -2]] / values.sum()).tolist()
        step = max(1, w.shape[0] // VOCAB_POINTS)
        ids = list(range(0, w.shape[0], step))[:VOCAB_POINTS]
        points = centred[ids] @ axes.T
        return cls(w, mean, axes, [round(x, DIGITS) for x in explained], ids,
                   [[round(x, 3), round(y, 3)] for x, y in points.tolist()])

    def project(self, rows: torch.Tensor) -> torch.Tensor:
        return (F.normalize(rows.float(), dim=1) - self.mean) @ self.axes.T

    def neighbours(self, rows: torch.Tensor, k: int = NEIGHBOURS) -> tuple[torch.Tensor, torch.Tensor]:
        """Cosine similarity of each row with every vocabulary row: top-k (values, ids)."""
        sims = F.normalize(rows.float(), dim=1) @ self.unit.T
        return sims.topk(min(k, sims.shape[1]), dim=1)


def _texts(tokenizer, ids: list[int]) -> list[str]:
    if tokenizer is None:
        return [f"<{i}>" for i in ids]
    return [tokenizer.decode([i]) for i in ids]


def _base(kind: str, seq: Sequence, step: int, positions: list[int], ts: float) -> dict:
    return {"type": f"internals.{kind}", "ts": ts, "request_id": seq.request_id, "step": step,
            "positions": positions}


def embeddings_event(seq: Sequence, step: int, positions: list[int], rows: torch.Tensor,
                     facts: EmbeddingFacts, tokenizer, ts: float) -> dict:
    """rows: the embedding rows the model looked up for these positions (layer 0's input)."""
    ids = [seq.token_ids[p] for p in positions]
    sims, near = facts.neighbours(rows)
    event = {**_base("embeddings", seq, step, positions, ts), "token_ids": ids, "texts": _texts(tokenizer, ids),
             "hidden_size": rows.shape[1], "rows": r4(rows), "norms": r4(rows.norm(dim=1)),
             "neighbours": [[{"id": i, "text": t, "cosine": round(s, DIGITS)}
                             for i, t, s in zip(n, _texts(tokenizer, n), sim)]
                            for n, sim in zip(near.tolist(), sims.tolist())],
             "pca": [[round(x, 3), round(y, 3)] for x, y in facts.project(rows).tolist()]}
    if positions[0] == 0:   # the request's first rows: the vocabulary to place them among
        event["vocab"] = {"ids": facts.vocab_ids, "texts": _texts(tokenizer, facts.vocab_ids),
                          "points": facts.vocab_points, "explained": facts.explained}
    return event


def rope_event(seq: Sequence, step: int, cfg, ts: float) -> dict:
    """The rotation frequencies the model's RoPE really uses (scaling included)."""
    inv = inverse_frequencies(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
    return {**_base("rope", seq, step, [], ts), "rope_theta": cfg.rope_theta, "head_dim": cfg.head_dim,
            "rope_type": cfg.rope_scaling.get("rope_type", "default"),
            "inv_freq": [float(f"{x:.6g}") for x in inv.tolist()]}


def _norms(t: torch.Tensor) -> list:
    return r4(t.norm(dim=-1))


@torch.inference_mode()
def residual_event(seq: Sequence, step: int, positions: list[int], layers: list[dict], model, ts: float) -> dict:
    """layers[i]: this step's tensors of layer i ("input", "attention", "mlp", "output")."""
    out = []
    for i, t in enumerate(layers):
        mid = t["input"] + t["attention"]
        out.append({"layer": i, "input_norm": _norms(t["input"]), "attention_norm": _norms(t["attention"]),
                    "after_attention_norm": _norms(mid), "mlp_norm": _norms(t["mlp"]),
                    "output_norm": _norms(t["output"])})
    norm = model.model.layers[0].input_layernorm
    x = layers[0]["input"][-1]
    device, dtype = norm.weight.device, norm.weight.dtype
    normed = norm(x.to(device, dtype)).float().cpu()
    rms = float(x.pow(2).mean().add(norm.eps).sqrt())
    return {**_base("residual", seq, step, positions, ts), "layers": out,
            "rmsnorm": {"position": positions[-1], "layer": 0, "eps": norm.eps, "rms": round(rms, 6),
                        "input": r4(x), "weight": r4(norm.weight.detach().float().cpu()), "output": r4(normed)}}


def _histogram(t: torch.Tensor) -> dict:
    """Per row, counts over HIST_BINS equal bins spanning ±(largest magnitude in t)."""
    top = float(t.abs().max()) or 1.0
    edges = torch.linspace(-top, top, HIST_BINS + 1)
    counts = [torch.histc(row, bins=HIST_BINS, min=-top, max=top).int().tolist() for row in t]
    return {"edges": r4(edges), "counts": counts}


def mlp_event(seq: Sequence, step: int, positions: list[int], layers: list[dict], ts: float) -> dict:
    """layers[i]: "gate", "up" ([rows, intermediate]), "mlp" (the down projection's output),
    "input" and "attention" (to size the contribution against the stream it joins)."""
    out = []
    for i, t in enumerate(layers):
        act = F.silu(t["gate"])
        product = act * t["up"]
        top = product.abs().topk(min(TOP_NEURONS, product.shape[1]), dim=1).indices
        out.append({
            "layer": i, "gate": _histogram(t["gate"]), "activation": _histogram(act), "up": _histogram(t["up"]),
            "product": _histogram(product),
            "active_share": r4((product.abs() > 0.1 * product.abs().amax(dim=1, keepdim=True)).float().mean(dim=1)),
            "top": [[{"neuron": n, "gate": round(float(t["gate"][r, n]), DIGITS), "up": round(float(t["up"][r, n]), DIGITS),
                      "product": round(float(product[r, n]), DIGITS)} for n in row] for r, row in enumerate(top.tolist())],
            "down_norm": _norms(t["mlp"]), "stream_norm": _norms(t["input"] + t["attention"])})
    return {**_base("mlp", seq, step, positions, ts), "intermediate_size": layers[0]["gate"].shape[1],
            "layers": out}


@torch.inference_mode()
def lens_top(model, hidden: torch.Tensor, k: int = LENS_TOP) -> tuple[torch.Tensor, torch.Tensor]:
    """The final norm and the LM head applied to hidden states [rows, hidden], as the model
    does to its last layer's output; the k most likely next tokens per row as (probabilities,
    ids), computed where the model lives so only k numbers per row travel to the CPU."""
    w = model.lm_head.weight
    probs = model.compute_logits(model.model.norm(hidden.to(w.device, w.dtype))).float().softmax(dim=-1)
    values, ids = probs.topk(k, dim=-1)
    return values.cpu(), ids.cpu()


def logit_lens_event(seq: Sequence, step: int, positions: list[int], layers: list[dict], model, tokenizer,
                     ts: float) -> dict:
    out = []
    for i, t in enumerate(layers):
        values, ids = lens_top(model, t["output"])
        out.append({"layer": i, "top": [[{"id": j, "text": txt, "prob": round(p, 6)}
                                         for j, txt, p in zip(row, _texts(tokenizer, row), pr)]
                                        for row, pr in zip(ids.tolist(), values.tolist())]})
    return {**_base("logit_lens", seq, step, positions, ts), "layers": out}
