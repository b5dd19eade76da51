// <kv-sampling prompt="…">: the live model's next-token distribution for the learner's
// prompt (the raw logits of a watched request's `sampling` events), reshaped by
// temperature, top-k, top-p and min-p sliders exactly as the engine's sampler does
// (lib/sampling-math.js, the rule in docs/engine.md). "Draw" samples from the shown
// distribution with a seed; "Continue both" asks the real engine for a greedy and a
// sampled continuation with the sliders' settings, side by side. "Constrain the output"
// runs the request under a grammar (vLLM's structured outputs): each drawn token's row
// shows how many tokens the grammar's mask allowed, and the chart shows the masked
// distribution, the one the engine's sampler drew from.

import { KvWidget, CATEGORICAL } from '../widget-base.js';
import { h, svg } from './lib/svg.js';
import { injectStyle } from './lib/style.js';
import { WatchedRun } from './lib/watched-run.js';
import { visibleText } from './lib/tokens.js';
import { drawIndex, reshape, seededRandom, softmax } from './lib/sampling-math.js';
import { CONSTRAINTS, constrainedSubmit } from './lib/structured-outputs.js';

const STYLE = `
kv-sampling .kvs-sliders { display: grid; grid-template-columns: auto minmax(8rem, 16rem) 3.5rem; gap: .3rem .6rem; align-items: center; }
kv-sampling .kvs-sliders input[type=range]:focus-visible { outline: 2px solid var(--kv-focus); }
kv-sampling .kvs-cols { display: grid; grid-template-columns: repeat(auto-fit, minmax(16rem, 1fr)); gap: .6rem; }
kv-sampling .kvs-text { font-family: var(--kv-font-mono); white-space: pre-wrap; font-size: .9rem; }
kv-sampling .kvs-drawn { font-family: var(--kv-font-mono); }
kv-sampling .kvs-grammar table { border-collapse: collapse; font-size: .85rem; }
kv-sampling .kvs-grammar th, kv-sampling .kvs-grammar td { padding: .15rem .3rem; border-bottom: 1px solid var(--kv-border); text-align: left; }
kv-sampling .kvs-grammar td { white-space: nowrap; }
kv-sampling .kvs-grammar td svg { max-width: none; display: block; }
kv-sampling .kvs-grammar td.kvs-num { text-align: right; font-variant-numeric: tabular-nums; }
kv-sampling .kvs-grammar .kvs-tok { font-family: var(--kv-font-mono); white-space: pre; }
kv-sampling .kvs-grammar button:focus-visible, kv-sampling .kvs-rows:focus-visible { outline: 2px solid var(--kv-focus); }
kv-sampling .kvs-rows { max-height: 22rem; overflow: auto; }
kv-sampling .kvs-grammar td .kvw-btn { padding: 0 .5rem; }
kv-sampling .kvs-yes { color: var(--kv-correct); }
kv-sampling .kvs-no { color: var(--kv-wrong); }
kv-sampling .kvs-output { font-family: var(--kv-font-mono); white-space: pre-wrap; word-break: break-all; }
`;
const RAW = CATEGORICAL[7];
const SHAPED = CATEGORICAL[0];
const SHOWN = 10;
const SLIDERS = [
  ['temperature', 'Temperature', 0, 2, 0.05, 1],
  ['top_k', 'Top-k (0 = off)', 0, 100, 1, 0],
  ['top_p', 'Top-p (1 = off)', 0.05, 1, 0.05, 1],
  ['min_p', 'Min-p (0 = off)', 0, 0.5, 0.01, 0],
];

class KvSampling extends KvWidget {
  static events = [];
  static requires = ['requests', 'sampling'];
  static label = 'Sampling: reshape the next-token distribution';

  setup() {
    injectStyle('kv-sampling', STYLE);
    this.params = Object.fromEntries(SLIDERS.map(([k, , , , , v]) => [k, v]));
    this.runKind = 'none';   // the constraint of the request on show
    this.tokens = [];
    this.outputText = null;
    this.run = new WatchedRun(this, {
      watch: { internals: true, layers: [], sampling: true }, wants: ['sampling'],
      params: { temperature: 0, max_tokens: 4 },
      submitFields: () => { this.runKind = this.constraintSel.value; return constrainedSubmit(this.runKind); },
      onEvent: (e) => {
        if (e.type === 'sampling' && e.distribution) this.add(e);
        if (e.type === 'request.token') this.tokens[e.index] = { id: e.token_id, text: e.text, allowed: e.allowed_tokens };
        if (e.type === 'request.finished') this.outputText = e.text;
        // the embeddings event names the vocabulary: a draw outside the top ten keeps its text
        if (e.type === 'internals.embeddings' && e.vocab) this.vocab = new Map(e.vocab.ids.map((id, i) => [id, e.vocab.texts[i]]));
      },
      onReset: () => { this.steps = []; this.index = 0; this.drawn = []; this.vocab = new Map(); this.tokens = []; this.outputText = null; },
    });
    const uid = this.getAttribute('aria-labelledby');
    this.constraintSel = h('select', { class: 'kvw-select', id: `${uid}-constraint`, 'aria-describedby': `${uid}-constraint-note` },
      ...Object.entries(CONSTRAINTS).map(([value, c]) => h('option', { value }, c.label)));
    this.grammarEl = h('section', { class: 'kvw-panel kvs-grammar', 'aria-label': 'What the grammar allowed, token by token', 'aria-live': 'polite' });
    this.stepSel = h('select', { class: 'kvw-select', id: `${uid}-step`, onchange: () => { this.index = Number(this.stepSel.value); this.drawn = []; this.requestRender(); } });
    this.sliderEls = {};
    const sliders = h('div', { class: 'kvs-sliders' });
    for (const [key, label, min, max, step, value] of SLIDERS) {
      const input = h('input', { type: 'range', id: `${uid}-${key}`, min, max, step, value, 'data-param': key,
        oninput: () => { this.params[key] = Number(input.value); this.drawn = []; this.requestRender(); } });
      const out = h('output', { for: input.id });
      this.sliderEls[key] = { input, out };
      sliders.append(h('label', { for: input.id }, label), input, out);
    }
    this.seedEl = h('input', { class: 'kvw-input', type: 'number', id: `${uid}-seed`, value: 1, min: 0 });
    this.drawBtn = h('button', { type: 'button', class: 'kvw-btn', onclick: () => this.draw() }, 'Draw');
    this.contBtn = h('button', { type: 'button', class: 'kvw-btn', onclick: () => this.continueBoth() }, 'Continue both');
    this.chartEl = h('div', { class: 'kvw-scroll' });
    this.sumEl = h('p', { class: 'kvw-note', 'aria-live': 'polite' });
    this.drawnEl = h('p', { class: 'kvs-drawn', 'aria-live': 'polite' });
    this.greedyEl = h('div', { class: 'kvs-text' });
    this.sampledEl = h('div', { class: 'kvs-text' });
    this.body.append(this.run.controls,
      h('div', { class: 'kvw-row' }, h('label', { for: this.constraintSel.id }, 'Constrain the output'), this.constraintSel,
        h('span', { class: 'kvw-note', id: `${uid}-constraint-note` }, 'applies when you press Run')),
      h('div', { class: 'kvw-row' }, h('label', { for: this.stepSel.id }, 'Next token after'), this.stepSel),
      sliders, this.chartEl, this.sumEl, this.grammarEl,
      h('div', { class: 'kvw-row' }, h('label', { for: this.seedEl.id }, 'Seed'), this.seedEl, this.drawBtn, this.contBtn),
      this.drawnEl,
      h('div', { class: 'kvs-cols' },
        h('div', { class: 'kvw-panel' }, h('h4', {}, 'Greedy (temperature 0)'), this.greedyEl),
        h('div', { class: 'kvw-panel' }, h('h4', {}, 'Sampled with the sliders and the seed'), this.sampledEl)));
    this.setLegend([
      { label: 'raw probability (temperature 1, no cut-off)', color: RAW },
      { label: 'probability after the sliders: what the engine would draw from', color: SHAPED },
    ]);
    this.continuations = new Map();   // request id -> 'greedy' | 'sampled'
    this.offFinished = null;
  }

  connectedCallback() {
    super.connectedCallback();
    this.run?.attach();
    if (this.client && !this.offFinished) {
      this.offFinished = this.client.on('request.finished', (e) => this.onContinuation(e));
    }
  }

  disconnectedCallback() {
    super.disconnectedCallback();
    this.run?.detach();
    if (this.offFinished) { this.offFinished(); this.offFinished = null; }
  }

  add(e) {
    const d = e.distribution;
    const ids = d.ids || d.logits.map((_, i) => i);
    const texts = new Map(e.candidates.ids.map((id, i) => [id, e.candidates.texts[i]]));
    this.steps[e.index] = { ids, logits: d.logits, complete: d.complete, texts, chosen: e.chosen, allowed: e.allowed_tokens };
    if (!this.steps[this.index]) this.index = e.index;   // a replay joined mid-request starts where it joined
  }

  get current() { return this.steps[this.index]; }

  tokenText(id) { return this.current.texts.get(id) ?? this.vocab.get(id) ?? `#${id}`; }

  /** The shown distribution: [{id, text, raw, shaped}] for the most likely raw tokens, and the totals. */
  distribution() {
    const s = this.current;
    const raw = softmax(s.logits);
    const shaped = reshape(s.logits, this.params);
    const top = raw.map((p, i) => i).sort((a, b) => raw[b] - raw[a]).slice(0, SHOWN);
    return {
      rows: top.map((i) => ({ id: s.ids[i], text: this.tokenText(s.ids[i]), raw: raw[i], shaped: shaped[i] })),
      shaped, sum: shaped.reduce((a, b) => a + b, 0), kept: shaped.filter((p) => p > 0).length,
      rest: 1 - top.reduce((a, i) => a + shaped[i], 0),
    };
  }

  render() {
    for (const [key, { input, out }] of Object.entries(this.sliderEls)) {
      out.textContent = String(this.params[key]);
      input.setAttribute('aria-valuetext', String(this.params[key]));
    }
    const n = this.steps.filter(Boolean).length;
    this.drawBtn.disabled = !n;
    this.contBtn.disabled = this.client.mode !== 'live';
    this.constraintSel.disabled = this.client.mode !== 'live';
    this.renderGrammar();
    if (!n) {
      this.chartEl.replaceChildren(h('p', { class: 'kvw-note' }, this.run.rid ? 'Waiting for the model…' : 'Press Run: the engine computes the next-token scores for your prompt.'));
      this.sumEl.textContent = '';
      return;
    }
    if (this.stepSel.options.length !== n) {
      this.stepSel.replaceChildren(...this.steps.map((s, i) => (s ? h('option', { value: i },
        i === 0 ? 'the prompt (token 1)' : `the prompt + ${i} generated (token ${i + 1})`) : null)).filter(Boolean));
      this.stepSel.value = String(this.index);
    }
    const d = this.distribution();
    const width = Math.min(this.chartEl.clientWidth || 600, 640);
    const rowH = 24;
    const labelW = 135;
    const H = rowH * (d.rows.length + 1) + 6;
    const scale = (p) => p * (width - labelW - 60);
    const root = svg('svg', { class: 'kvw-svg', width, height: H, viewBox: `0 0 ${width} ${H}`, role: 'img',
      'aria-label': `Next-token distribution: ${d.rows.map((r) => `${visibleText(r.text)} ${(r.shaped * 100).toFixed(1)}%`).join(', ')}` });
    [...d.rows, { text: 'all other tokens', raw: 1 - d.rows.reduce((a, r) => a + r.raw, 0), shaped: Math.max(0, d.rest), other: true }].forEach((r, i) => {
      const y = 4 + i * rowH;
      root.append(svg('text', { x: labelW - 6, y: y + 15, 'text-anchor': 'end', 'font-size': 12, 'font-family': 'var(--kv-font-mono)' }, r.other ? r.text : visibleText(r.text)));
      root.append(svg('rect', { x: labelW, y: y + 2, width: scale(r.raw), height: 8, style: `fill: ${RAW}` }, svg('title', {}, `raw ${(r.raw * 100).toFixed(2)}%`)));
      root.append(svg('rect', { x: labelW, y: y + 11, width: scale(r.shaped), height: 10, style: `fill: ${SHAPED}`, 'data-shaped': r.shaped },
        svg('title', {}, `after the sliders ${(r.shaped * 100).toFixed(2)}%`)));
      root.append(svg('text', { x: labelW + scale(Math.max(r.raw, r.shaped)) + 6, y: y + 18, 'font-size': 11, class: 'kvw-soft' }, `${(r.shaped * 100).toFixed(1)}%`));
    });
    this.chartEl.replaceChildren(root);
    this.sumEl.textContent = `${d.kept} of ${d.shaped.length} tokens can still be drawn; their probabilities sum to ${d.sum.toFixed(4)}.`
      + `${this.current.allowed === undefined ? '' : ` The grammar allowed ${this.current.allowed} of ${this.vocabSize()} tokens here; the bars show only those: the mask set every other logit to −∞ before the sampler saw it.`}`
      + `${this.current.complete ? '' : ` (Only the ${d.shaped.length} most likely tokens were sent; the rest is left out.)`}`
      + ` The engine drew “${visibleText(this.current.chosen.text)}” here (greedy).`;
    this.drawnEl.textContent = this.drawn.length ? `Drawn with seed ${this.seedEl.value}: ${this.drawn.map((t) => `“${visibleText(t)}”`).join(' ')}` : '';
    this.dataset.sum = d.sum.toFixed(6);
    this.dataset.kept = String(d.kept);
  }

  vocabSize() { return this.client.hello?.model?.vocab_size ?? 0; }

  /** Per drawn token: how many tokens the grammar allowed, and that the drawn one was among them. */
  renderGrammar() {
    const rows = this.tokens.map((t, i) => (t ? { ...t, index: i } : null)).filter(Boolean);
    const vocab = this.vocabSize();
    const text = this.outputText ?? rows.map((t) => t.text).join('');
    const constrained = rows.some((t) => t.allowed !== undefined);
    this.dataset.constrained = String(constrained);
    if (!rows.length) {
      this.grammarEl.replaceChildren(h('p', { class: 'kvw-note' }, 'Pick a constraint above and press Run: each drawn token then shows how many of the vocabulary’s tokens the grammar allowed.'));
      return;
    }
    const output = h('p', {}, 'Output: ', h('span', { class: 'kvs-output', 'data-output': '' }, text));
    if (!constrained) {
      this.grammarEl.replaceChildren(h('h4', {}, 'Not constrained'), output,
        h('p', { class: 'kvw-note' }, `No grammar: at every step all ${vocab.toLocaleString()} tokens of the vocabulary could be drawn.`));
      return;
    }
    const check = CONSTRAINTS[this.runKind]?.check;
    const verdict = check && this.outputText !== null ? check(this.outputText) : null;
    const logScale = (n) => (vocab > 1 ? 56 * Math.log(Math.max(n, 1)) / Math.log(vocab) : 0);
    const body = rows.map((t) => {
      const step = this.steps[t.index];
      const inMask = step ? step.ids.includes(t.id) : null;
      const number = String(t.index + 1);   // a button when this token's distribution can be shown above
      const show = step ? h('button', { type: 'button', class: 'kvw-btn', 'aria-label': `Show the distribution of token ${number}`,
        title: 'show this step in the chart above',
        onclick: () => { this.index = t.index; this.stepSel.value = String(t.index); this.drawn = []; this.requestRender(); } }, number) : number;
      return h('tr', { 'data-index': t.index, 'data-allowed': t.allowed ?? '', 'data-vocab': vocab, 'data-in-mask': inMask === null ? '' : String(inMask) },
        h('td', { class: 'kvs-num' }, show),
        h('td', { class: 'kvs-tok' }, `“${visibleText(t.text)}”`),
        h('td', { class: 'kvs-num', 'data-cell': 'allowed' }, `${t.allowed.toLocaleString()} of ${vocab.toLocaleString()}`),
        h('td', {}, svg('svg', { width: 58, height: 10, role: 'img', 'aria-label': `${(100 * t.allowed / vocab).toPrecision(2)}% of the vocabulary (log scale)` },
          svg('rect', { x: 0, y: 1, width: 56, height: 8, style: 'fill: var(--kv-free)' }),
          svg('rect', { x: 0, y: 1, width: logScale(t.allowed), height: 8, style: `fill: ${SHAPED}` }))),
        h('td', { class: inMask ? 'kvs-yes' : 'kvs-no' }, inMask === null ? '—' : inMask ? `✓ yes, ${(step.chosen.prob * 100).toFixed(1)}%` : '✗ no'));
    });
    const table = h('table', { 'aria-label': 'Each drawn token and how many tokens the grammar allowed at its step' },
      h('thead', {}, h('tr', {}, h('th', { title: 'press a number to show that step in the chart' }, '#'), h('th', {}, 'Drawn'), h('th', {}, 'Allowed tokens'), h('th', {}, h('span', { class: 'kv-visually-hidden' }, 'share, log scale')),
        h('th', { title: 'and its probability after the mask' }, 'Drawn one allowed? (p)'))),
      h('tbody', {}, ...body));
    this.grammarEl.replaceChildren(h('h4', {}, 'What the grammar allowed at each step'), h('div', { class: 'kvs-rows', tabindex: 0, role: 'region', 'aria-label': 'Drawn tokens (scrolls)' }, table), output,
      verdict ? h('p', { class: verdict.ok ? 'kvs-yes' : 'kvs-no', 'data-verdict': String(verdict.ok) }, `${verdict.ok ? '✓' : '✗'} ${verdict.says}`) : '',
      rows.some((t) => !this.steps[t.index]) ? h('p', { class: 'kvw-note' }, '—: the step of this token ended the request, so it sent no distribution.') : '');
  }

  draw() {
    if (!this.current) return;
    if (!this.drawn.length) this.random = seededRandom(Number(this.seedEl.value) || 0);
    const { shaped } = this.distribution();
    const i = drawIndex(shaped, this.random());
    const s = this.current;
    this.drawn.push(this.tokenText(s.ids[i]));
    this.requestRender();
  }

  async continueBoth() {
    const prompt = this.run.input.value.trim();
    if (!prompt) return;
    this.greedyEl.textContent = '…';
    this.sampledEl.textContent = '…';
    this.continuations.clear();
    delete this.dataset.continued;
    const sampled = { temperature: this.params.temperature, top_k: this.params.top_k, top_p: this.params.top_p,
      min_p: this.params.min_p, seed: Number(this.seedEl.value) || 0 };
    try {
      for (const [kind, params] of [['greedy', { temperature: 0 }], ['sampled', sampled]]) {
        const ack = await this.client.command('submit', { prompt, params: { ...params, max_tokens: 16 } });
        this.continuations.set(ack.request_id, kind);
      }
    } catch (error) {
      this.run.error.textContent = this.describeError(error);
    }
  }

  onContinuation(e) {
    const kind = this.continuations.get(e.request_id);
    if (!kind) return;
    (kind === 'greedy' ? this.greedyEl : this.sampledEl).textContent = `${this.run.input.value.trim()}${e.text}`;
    this.continuations.set(e.request_id, null);
    if ([...this.continuations.values()].every((k) => k === null) && this.continuations.size === 2) this.dataset.continued = 'true';
  }

  exportData() {
    const d = this.current ? this.distribution() : null;
    return { request_id: this.run.rid, token_index: this.index, params: { ...this.params }, seed: Number(this.seedEl.value),
      constraint: this.runKind, allowed_tokens: this.tokens.map((t) => t?.allowed ?? null),
      sum: d?.sum ?? null, kept: d?.kept ?? null, top: d?.rows ?? [], drawn: this.drawn,
      greedy: this.greedyEl.textContent, sampled: this.sampledEl.textContent };
  }
}

customElements.define('kv-sampling', KvSampling);
