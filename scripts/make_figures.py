"""Draws the book's static figures as SVG files in frontend/figures/.

Run `python scripts/make_figures.py` after changing a figure here; the SVGs are committed.
Each figure has a <title> and <desc> (read by screen readers when the renderer inlines it),
and its colours are the theme's CSS variables, so it follows light and dark mode; the
fallbacks after each variable are for viewing a file on its own. Colour is never the only
cue: every coloured mark also carries a label.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from html import escape
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "frontend" / "figures"
CHAR_W = 7.6        # average width of a 13 px character, for sizing boxes around text
ROW_H = 30

STYLE = """
.kvf-text { font: 13px var(--kv-font, system-ui, sans-serif); fill: var(--kv-fg, #1b1d21); }
.kvf-mono { font: 13px var(--kv-font-mono, ui-monospace, monospace); fill: var(--kv-fg, #1b1d21); }
.kvf-soft { fill: var(--kv-fg-soft, #4a4f57); }
.kvf-bold { font-weight: 700; }
.kvf-box { fill: var(--kv-bg-soft, #f4f5f7); stroke: var(--kv-border, #c9ced6); }
.kvf-empty { fill: none; stroke: var(--kv-border, #c9ced6); stroke-dasharray: 3 3; }
.kvf-line { stroke: var(--kv-fg-soft, #4a4f57); stroke-width: 1.5; fill: none; }
.kvf-arrowhead { fill: var(--kv-fg-soft, #4a4f57); }
.kvf-new { fill: var(--kv-cat-2, #e69f00); stroke: var(--kv-fg, #1b1d21); stroke-width: 1.5; }
.kvf-blue { fill: var(--kv-cat-1, #0072b2); }
.kvf-green { fill: var(--kv-cat-3, #009e73); }
.kvf-red { fill: var(--kv-cat-4, #d55e00); }
.kvf-orange { fill: var(--kv-cat-2, #e69f00); }
.kvf-on-dark { fill: #ffffff; }
.kvf-halo { paint-order: stroke; stroke: var(--kv-bg, #ffffff); stroke-width: 3px; stroke-linejoin: round; }
.kvf-on-light { fill: #1b1d21; }
"""


@dataclass
class Svg:
    """A figure being drawn: elements are appended as SVG text; `save` wraps them."""
    name: str
    width: int
    height: int
    title: str
    desc: str
    parts: list[str] = field(default_factory=list)

    def text(self, x, y, s, cls="kvf-text", anchor="start", extra=""):
        self.parts.append(f'<text x="{x:g}" y="{y:g}" class="{cls}" text-anchor="{anchor}"{extra}>{escape(str(s))}</text>')

    def rect(self, x, y, w, h, cls="kvf-box", rx=4, extra=""):
        self.parts.append(f'<rect x="{x:g}" y="{y:g}" width="{w:g}" height="{h:g}" rx="{rx}" class="{cls}"{extra}/>')

    def box(self, x, y, label, cls="kvf-box", text_cls="kvf-mono", min_w=0, h=24) -> float:
        """A labelled box with its left edge at x; returns its width."""
        w = max(min_w, len(label) * CHAR_W + 12)
        self.rect(x, y, w, h, cls)
        if cls == "kvf-new":    # the orange fill is light in both themes: dark text on it
            text_cls += " kvf-on-light"
        self.text(x + w / 2, y + h / 2 + 4.5, label, text_cls, "middle")
        return w

    def arrow(self, x1, y1, x2, y2):
        self.parts.append(f'<line x1="{x1:g}" y1="{y1:g}" x2="{x2:g}" y2="{y2:g}" class="kvf-line" marker-end="url(#{self.name}-arrow)"/>')

    def save(self) -> Path:
        ids = f"{self.name}-title", f"{self.name}-desc"
        svg = (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {self.width} {self.height}" '
               f'width="{self.width}" height="{self.height}" '
               f'class="kv-figure__svg" role="img" aria-labelledby="{ids[0]} {ids[1]}">\n'
               f'<title id="{ids[0]}">{escape(self.title)}</title>\n<desc id="{ids[1]}">{escape(self.desc)}</desc>\n'
               f'<style>{STYLE}</style>\n'
               f'<defs><marker id="{self.name}-arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
               f'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" class="kvf-arrowhead"/></marker></defs>\n'
               + "\n".join(self.parts) + "\n</svg>\n")
        OUT.mkdir(parents=True, exist_ok=True)
        path = OUT / f"{self.name}.svg"
        path.write_text(svg, encoding="utf-8")
        return path


def token_row(fig: Svg, x: float, y: float, tokens: list[str], new: set[int] = frozenset(), gap=4) -> float:
    """Token boxes left to right (spaces shown as ·); the ones in `new` stand out. Returns the end x."""
    for i, token in enumerate(tokens):
        label = token.replace(" ", "·")
        x += fig.box(x, y, label, "kvf-new" if i in new else "kvf-box", "kvf-mono") + gap
    return x


# -- chapter 1 ---------------------------------------------------------------------------

def autoregressive_loop() -> Svg:
    fig = Svg("autoregressive-loop", 660, 140, "Three forward passes, one new token each",
              "Pass 1 reads 'The capital of France is' and chooses ' Paris'. Pass 2 reads the text with ' Paris' "
              "appended and chooses '.'. Pass 3 reads the text with '.' appended and chooses the end-of-sequence "
              "token, so generation stops. Each pass's input is the previous input plus the previous choice.")
    prompt = ["The", " capital", " of", " France", " is"]
    chosen = [" Paris", ".", "<end>"]
    for n in range(3):
        y = 12 + n * 42
        fig.text(0, y + 17, f"pass {n + 1}", "kvf-text kvf-bold")
        tokens = prompt + chosen[:n]
        end = token_row(fig, 60, y, tokens, new={len(tokens) - 1} if n else set())
        fig.arrow(end + 4, y + 12, end + 34, y + 12)
        fig.text(end + 40, y + 17, "chooses", "kvf-text kvf-soft")
        fig.box(end + 100, y, chosen[n].replace(" ", "·"), "kvf-new")
    fig.text(0, 136, "Orange: the token chosen by the previous pass, now part of the input.", "kvf-text kvf-soft")
    return fig


# -- chapter 2 ---------------------------------------------------------------------------

def bpe_merges() -> Svg:
    stages = [
        ("start", None, ["b a n a n a", "b a n d a n a"], 'pair counts: "a n" 4, "n a" 3, "b a" 2, "n d" 1, "d a" 1'),
        ("merge 1", '"a" + "n" → "an"', ["b an an a", "b an d an a"],
         'pair counts: "b an" 2, "an a" 2, "an an" 1, "an d" 1, "d an" 1'),
        ("merge 2", '"b" + "an" → "ban"', ["ban an a", "ban d an a"], "a tie between two pairs: take the first one found"),
        ("merge 3", '"an" + "a" → "ana"', ["ban ana", "ban d ana"], None),
    ]
    fig = Svg("bpe-merges", 660, 4 * 64 + 26, 'Byte-pair merges on "banana bandana"',
              'Start from single letters: b a n a n a and b a n d a n a. The most frequent pair "a n" is merged '
              'first, giving b an an a and b an d an a. Then "b" + "an" becomes "ban" (a tie, the first found wins), '
              'giving ban an a and ban d an a. Then "an" + "a" becomes "ana", giving ban ana and ban d ana.')
    merged = {"start": "", "merge 1": "an", "merge 2": "ban", "merge 3": "ana"}
    for i, (label, rule, words, note) in enumerate(stages):
        y = 8 + i * 64
        fig.text(0, y + 17, label, "kvf-text kvf-bold")
        if rule:
            fig.text(0, y + 36, rule, "kvf-text kvf-soft")
        x = 150
        for word in words:
            pieces = word.split()
            x = token_row(fig, x, y, pieces, new={j for j, p in enumerate(pieces) if p == merged[label]}) + 28
        if note:
            fig.text(150, y + 44, note, "kvf-text kvf-soft")
    fig.text(0, fig.height - 6, "Orange: the piece the merge on that row has just created.", "kvf-text kvf-soft")
    return fig


# -- chapter 4 ---------------------------------------------------------------------------

def attention_weights() -> Svg:
    tokens = ["the", "cat", "sat"]
    weights = [[1.0, None, None], [0.804, 0.196, None], [0.140, 0.284, 0.576]]
    cell = 64
    fig = Svg("attention-weights", 420, 70 + 3 * cell, "Attention weights for 'the cat sat'",
              "One row per query token, one column per key token. 'the' puts weight 1.000 on itself. 'cat' puts "
              "0.804 on 'the' and 0.196 on itself. 'sat' puts 0.140 on 'the', 0.284 on 'cat' and 0.576 on itself. "
              "Cells above the diagonal are masked: a token never looks at later tokens. Every row adds up to 1.")
    left, top = 90, 40
    fig.text(left + 1.5 * cell, 14, "key (looked at)", "kvf-text kvf-soft", "middle")
    fig.text(8, top - 10, "query", "kvf-text kvf-soft")
    for j, token in enumerate(tokens):
        fig.text(left + j * cell + cell / 2, top - 8, token, "kvf-mono", "middle")
    for i, token in enumerate(tokens):
        y = top + i * cell
        fig.text(left - 10, y + cell / 2 + 4, token, "kvf-mono", "end")
        for j, w in enumerate(weights[i]):
            x = left + j * cell
            if w is None:
                fig.rect(x + 2, y + 2, cell - 4, cell - 4, "kvf-empty", 2)
                fig.text(x + cell / 2, y + cell / 2 + 4, "masked", "kvf-text kvf-soft", "middle")
                continue
            fig.rect(x + 2, y + 2, cell - 4, cell - 4, "kvf-blue", 2, f' fill-opacity="{0.15 + 0.85 * w:.2f}"')
            fig.text(x + cell / 2, y + cell / 2 + 4, f"{w:.3f}", "kvf-mono kvf-bold kvf-halo", "middle")
    fig.text(left, top + 3 * cell + 22, "Darker means more weight; each row adds up to 1.", "kvf-text kvf-soft")
    return fig


# -- chapter 5 ---------------------------------------------------------------------------

def gqa_groups() -> Svg:
    fig = Svg("gqa-groups", 660, 130, "Grouped-query attention in Qwen3-0.6B",
              "16 query heads, numbered 0 to 15, above 8 key/value heads, numbered 0 to 7. Query heads 0 and 1 "
              "share key/value head 0, heads 2 and 3 share head 1, and so on: groups of two.")
    w, gap = 28, 4
    fig.text(0, 24, "query heads", "kvf-text kvf-bold")
    fig.text(0, 104, "KV heads", "kvf-text kvf-bold")
    left = 100
    for q in range(16):
        x = left + q * (w + gap) + (q // 2) * 4
        fig.box(x, 8, str(q), "kvf-box", min_w=w)
        kv_x = left + (q // 2) * 2 * (w + gap) + (q // 2) * 4 + (w + gap) / 2
        fig.parts.append(f'<line x1="{x + w / 2:g}" y1="33" x2="{kv_x + w / 2:g}" y2="86" class="kvf-line"/>')
    for k in range(8):
        x = left + k * 2 * (w + gap) + k * 4 + (w + gap) / 2
        fig.box(x, 88, str(k), "kvf-new", min_w=w)
    fig.text(100, 126, "Each pair of query heads shares one key head and one value head.", "kvf-text kvf-soft")
    return fig


# -- chapter 7 ---------------------------------------------------------------------------

def swiglu() -> Svg:
    fig = Svg("swiglu", 660, 170, "The SwiGLU MLP",
              "The token's vector x goes two ways. x times W_gate gives the gate g, which passes through silu. "
              "x times W_up gives the signal u. silu(g) and u are multiplied position by position into h, one number "
              "per neuron, and h times W_down brings the result back to the hidden size as the output.")
    y_gate, y_up, mid = 18, 110, 70
    fig.box(0, mid - 12, "x", "kvf-box", min_w=40)
    fig.arrow(40, mid, 80, y_gate + 12)
    fig.arrow(40, mid, 80, y_up + 12)
    fig.box(82, y_gate, "× W_gate", "kvf-box", min_w=90)
    fig.box(82, y_up, "× W_up", "kvf-box", min_w=90)
    fig.arrow(172, y_gate + 12, 212, y_gate + 12)
    fig.text(192, y_gate + 6, "g", "kvf-mono", "middle")
    fig.box(214, y_gate, "silu", "kvf-new", min_w=60)
    fig.arrow(274, y_gate + 12, 330, mid - 6)
    fig.arrow(172, y_up + 12, 330, mid + 6)
    fig.text(250, y_up + 6, "u (the signal)", "kvf-text kvf-soft", "middle")
    fig.box(332, mid - 12, "× (each neuron)", "kvf-box", min_w=130)
    fig.arrow(462, mid, 496, mid)
    fig.text(479, mid - 6, "h", "kvf-mono", "middle")
    fig.box(498, mid - 12, "× W_down", "kvf-box", min_w=90)
    fig.arrow(588, mid, 620, mid)
    fig.text(624, mid + 4, "out", "kvf-mono")
    fig.text(0, 160, "The gate decides, neuron by neuron, how much of the signal gets through.", "kvf-text kvf-soft")
    return fig


# -- timelines: chapters 14 and 17 -----------------------------------------------------------

def batching_timeline(name: str, title: str, rows: list[tuple[str, int, int, int]], steps: int, desc: str) -> Svg:
    """rows: (request, arrives during step, first step, last step); one cell per token produced."""
    cell, left = 36, 110
    fig = Svg(name, left + steps * cell + 10, 56 + len(rows) * ROW_H + 22, title, desc)
    fig.text(0, 20, "step", "kvf-text kvf-soft")
    for s in range(1, steps + 1):
        fig.text(left + (s - 0.5) * cell, 20, str(s), "kvf-mono", "middle")
    for i, (req, arrives, first, last) in enumerate(rows):
        y = 32 + i * ROW_H
        fig.text(0, y + 17, req + (f" (arrives {arrives})" if arrives else ""), "kvf-text")
        for s in range(1, steps + 1):
            x = left + (s - 1) * cell
            if first <= s <= last:
                fig.rect(x + 3, y + 3, cell - 6, ROW_H - 6, "kvf-blue", 3)
            elif arrives and arrives < s < first:     # arrived during step `arrives`: waits from the next one
                fig.rect(x + 3, y + 3, cell - 6, ROW_H - 6, "kvf-empty", 3)
    fig.rect(0, fig.height - 18, 14, 12, "kvf-blue", 2)
    fig.text(20, fig.height - 8, "one token produced", "kvf-text kvf-soft")
    fig.rect(170, fig.height - 18, 14, 12, "kvf-empty", 2)
    fig.text(190, fig.height - 8, "arrived, waiting for a place", "kvf-text kvf-soft")
    return fig


def chunked_prefill_timeline() -> Svg:
    left = 150
    fig = Svg("chunked-prefill-timeline", 660, 150,
              "Decode gaps with and without chunked prefill",
              "Without chunking, one 220.8 ms step holds the whole 2,000-token prompt and the eight decodes, then "
              "steps of 20.8 ms follow: the decoding users wait 220.8 ms for one token. With a budget of 512 "
              "tokens, the prompt is split over four steps of 71.2, 71.2, 71.2 and 69.6 ms, each also carrying the "
              "eight decodes: no gap is longer than 71.2 ms. Both finish the prompt after 283.2 ms, and in that "
              "time each decoding user gets four tokens either way.")
    scale = (fig.width - left - 20) / 283.2     # px per ms: both rows span the same 283.2 ms
    rows = [("no chunking", [(220.8, "prompt + 8 decodes"), (20.8, ""), (20.8, ""), (20.8, "")]),
            ("budget 512", [(71.2, "504 + 8"), (71.2, "504 + 8"), (71.2, "504 + 8"), (69.6, "488 + 8")])]
    for i, (label, steps) in enumerate(rows):
        y = 16 + i * 50
        fig.text(0, y + 19, label, "kvf-text kvf-bold")
        x = left
        for ms, note in steps:
            w = ms * scale
            fig.rect(x, y, w - 2, 28, "kvf-orange" if note else "kvf-blue", 3)
            fig.text(x + (w - 2) / 2, y + 19, f"{ms} ms" if w > 50 else "", "kvf-mono kvf-on-light", "middle")
            x += w
            fig.parts.append(f'<line x1="{x - 1:g}" y1="{y - 4}" x2="{x - 1:g}" y2="{y + 32}" class="kvf-line"/>')
    fig.text(left, 126, "Each vertical tick: the eight decoding users receive one token.", "kvf-text kvf-soft")
    fig.rect(left, 134, 14, 12, "kvf-orange", 2)
    fig.text(left + 20, 144, "step with prompt tokens", "kvf-text kvf-soft")
    fig.rect(left + 200, 134, 14, 12, "kvf-blue", 2)
    fig.text(left + 220, 144, "decode-only step (20.8 ms)", "kvf-text kvf-soft")
    return fig


# -- chapter 15 ----------------------------------------------------------------------------

def block_table() -> Svg:
    fig = Svg("block-table", 660, 190, "A block table maps a sequence's blocks to places in the cache",
              "Sequence S has 10 tokens in blocks of 4. Its block table is [7, 2, 9]: logical block 0 "
              "(positions 0 to 3) lives in physical block 7, block 1 (positions 4 to 7) in physical block 2, and "
              "block 2 (positions 8 and 9, two places still empty) in physical block 9. Position 9 is in logical "
              "block 2 at offset 1, so its key and value go to slot 9 × 4 + 1 = 37.")
    table, length = [7, 2, 9], 10
    bw = 124
    fig.text(0, 16, "S's positions, in logical blocks of 4", "kvf-text kvf-soft")
    for b in range(len(table)):
        x = 10 + b * (bw + 90)
        for k in range(4):
            pos = b * 4 + k
            if pos < length:
                fig.box(x + k * 31, 24, str(pos), "kvf-new" if pos == 9 else "kvf-box", min_w=28)
            else:
                fig.rect(x + k * 31, 24, 28, 24, "kvf-empty")
        fig.text(x + bw / 2, 66, f"block_table[{b}] = {table[b]}", "kvf-mono", "middle")
    fig.text(0, 118, "physical blocks in the cache (slots 4 × b to 4 × b + 3)", "kvf-text kvf-soft")
    pw = 58
    for p in range(10):
        x = 10 + p * (pw + 6)
        owner = table.index(p) if p in table else None
        fig.box(x, 126, str(p), "kvf-blue" if owner is not None else "kvf-box", "kvf-mono kvf-halo", min_w=pw)
        if owner is not None:
            fig.arrow(10 + owner * (bw + 90) + bw / 2, 72, x + pw / 2, 124)
    fig.text(0, 176, "Position 9: block_table[9 ÷ 4] = block_table[2] = 9, offset 9 mod 4 = 1, slot 9 × 4 + 1 = 37.",
             "kvf-text")
    return fig


# -- chapter 16 ----------------------------------------------------------------------------

def prefix_hash_chain() -> Svg:
    blocks = [("s0 s1 s2 s3", "start"), ("s4 s5 s6 s7", "h1"), ("s8 s9 a0 a1", "h2"), ("a2 a3 a4 a5", "h3")]
    fig = Svg("prefix-hash-chain", 660, 130, "Each block's hash covers the block before it",
              "Four blocks of four tokens: s0 to s3, s4 to s7, s8 s9 a0 a1, and a2 to a5. h1 is the hash of "
              "'start' and the first block's tokens; h2 is the hash of h1 and the second block's tokens; h3 of h2 "
              "and the third block; h4 of h3 and the fourth. A block's hash therefore depends on every token before it.")
    w = 150
    for i, (tokens, previous) in enumerate(blocks):
        x = i * (w + 12)
        fig.box(x, 10, tokens, "kvf-box", min_w=w)
        fig.arrow(x + w / 2, 36, x + w / 2, 62)
        fig.box(x, 64, f"h{i + 1} = H({previous}, …)", "kvf-new", min_w=w)
        if i:
            fig.arrow(x - 12, 76, x, 76)
    fig.text(0, 118, "Change one token and its block's hash changes, and so does every hash after it.", "kvf-text kvf-soft")
    return fig


# -- chapter 18 ----------------------------------------------------------------------------

def speculative_verify() -> Svg:
    rows = [('after "… is"', "Paris", "Paris", "accept"), ('after "Paris"', ".", ".", "accept"),
            ('after "."', "The", "It", 'reject: use "The"'), ('after "It", "is"', "", "", "discarded")]
    fig = Svg("speculative-verify", 660, 40 + len(rows) * 34, "Verifying four drafted tokens in one pass",
              "The drafter proposed 'Paris', '.', 'It', 'is'. The target agrees with 'Paris' and '.', so both are "
              "accepted. At the third position the target says 'The' where the draft says 'It': the draft is "
              "rejected and the target's 'The' is used. The last draft, 'is', is discarded because it follows a "
              "rejected token. The step adds Paris, '.' and The: three tokens.")
    cols = [0, 170, 300, 430]
    for x, head in zip(cols, ["position", "target says", "draft", "verdict"]):
        fig.text(x, 18, head, "kvf-text kvf-soft")
    for i, (where, target, draft, verdict) in enumerate(rows):
        y = 28 + i * 34
        fig.text(0, y + 17, where, "kvf-mono")
        if target:
            fig.box(cols[1], y, target, "kvf-box")
            fig.box(cols[2], y, draft, "kvf-box")
        cls = "kvf-green" if verdict == "accept" else "kvf-red" if verdict.startswith("reject") else "kvf-box"
        mark = "✓ " if verdict == "accept" else "✗ " if verdict.startswith("reject") else ""
        fig.box(cols[3], y, mark + verdict, cls, "kvf-text kvf-on-dark" if cls != "kvf-box" else "kvf-text kvf-soft")
    return fig


# -- chapter 21 ----------------------------------------------------------------------------

def serving_processes() -> Svg:
    fig = Svg("serving-processes", 700, 312, "vLLM's processes beside kvscope's",
              "Left, vLLM: an API server process (HTTP, tokenizing, detokenizing) sends requests to an EngineCore "
              "process over ZeroMQ sockets and gets outputs back the same way; EngineCore holds the scheduler and "
              "the KV cache manager and sends each step's plan to one worker process per GPU through a "
              "shared-memory message queue and gets results back through another (with one GPU, the worker runs "
              "inside EngineCore); the workers all-reduce over NCCL. Right, kvscope: one server process whose event loop serves HTTP and WebSocket "
              "and hands requests to an engine thread in the same process; the engine thread holds the scheduler, "
              "the block manager and rank 0's model, and broadcasts each step's plan to one spawned process per "
              "further tensor-parallel rank with torch.distributed, one way only; the ranks all-reduce over gloo on "
              "a CPU or NCCL on GPUs, and only rank 0 samples.")
    columns = [
        (0, "vLLM (vllm serve)",
         [("API server process", "HTTP, tokenize, detokenize"),
          ("EngineCore process", "scheduler, KV cache manager"),
          ("worker process per GPU", "model runner, its slice")],
         [("ZeroMQ sockets", True), ("shared-memory queues", True)], "workers all-reduce over NCCL"),
        (350, "kvscope (kvscope serve)",
         [("server process: event loop", "HTTP, WebSocket, OpenAI API"),
          ("engine thread, same process", "scheduler, block manager, rank 0"),
          ("TP worker process per rank", "spawned for ranks 1 and up")],
         [("calls between threads", True), ("torch.distributed broadcast", False)],
         "all-reduce over gloo or NCCL; rank 0 samples"),
    ]
    w = 300
    for x, head, boxes, links, bottom in columns:
        fig.text(x, 16, head, "kvf-text kvf-bold")
        for i, (name, what) in enumerate(boxes):
            y = 28 + i * 96
            fig.rect(x, y, w, 46, "kvf-box")
            fig.text(x + 10, y + 19, name, "kvf-text kvf-bold")
            fig.text(x + 10, y + 37, what, "kvf-text kvf-soft")
            if i < len(links):
                label, both_ways = links[i]
                fig.arrow(x + 40, y + 48, x + 40, y + 94)
                if both_ways:
                    fig.arrow(x + 24, y + 94, x + 24, y + 48)
                fig.text(x + 54, y + 75, label, "kvf-text")
        fig.text(x, 300, bottom, "kvf-text kvf-soft")
    return fig


FIGURES = [autoregressive_loop, bpe_merges, attention_weights, gqa_groups, swiglu, chunked_prefill_timeline,
           block_table, prefix_hash_chain, speculative_verify, serving_processes]


def main() -> None:
    for make in FIGURES:
        print(make().save().name)
    static = [("A", 0, 1, 3), ("B", 0, 1, 8), ("C", 0, 1, 2), ("D", 0, 1, 5), ("E", 2, 9, 12), ("F", 3, 9, 11)]
    continuous = [("A", 0, 1, 3), ("B", 0, 1, 8), ("C", 0, 1, 2), ("D", 0, 1, 5), ("E", 2, 3, 6), ("F", 3, 4, 6)]
    print(batching_timeline(
        "batching-static", "Static batching: a group runs until its longest request is done", static, 12,
        "Steps 1 to 12. A, B, C and D start together at step 1 and finish at steps 3, 8, 2 and 5. E arrives "
        "during step 2 and F during step 3, but both wait until the whole group is done: E runs in steps 9 to 12, "
        "F in steps 9 to 11.").save().name)
    print(batching_timeline(
        "batching-continuous", "Continuous batching: a freed place is refilled before the next step", continuous, 12,
        "Steps 1 to 8 of the same scale. A, B, C and D start at step 1. C finishes at step 2, so E, which arrived "
        "during step 2, runs from step 3 to 6. A finishes at step 3, so F runs from step 4 to 6. Everything is "
        "done after step 8 instead of 12.").save().name)


if __name__ == "__main__":
    main()
