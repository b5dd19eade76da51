// <kv-sampling prompt="…">: the live model's next-token distribution for the learner's
// prompt (the raw logits of a watched request's `sampling` events), reshaped by
// temperature, top-k, top-p and min-p sliders exactly as the engine's sampler does
// (lib/sampling-math.js, the rule in docs/engine.md). "Draw" samples from the shown
// distribution with a seed; "Continue both" asks the real engine for a greedy and a
// sampled continuation with the sliders' settings, side by side.

import { KvWidget, CATEGORICAL } from '../widget-base.js';
import { h, svg } from './lib/svg.js';
import { injectStyle } from './lib/style.js';
import { WatchedRun } from './lib/watched-run.js';
import { visibleText } from './lib/tokens.js';
import { drawIndex, reshape, seededRandom, softmax } from './lib/sampling-math.js';

const STYLE = `
kv-sampling .kvs-sliders { display: grid; grid-template-columns: auto minmax(8rem, 16rem) 3.5rem; gap: .3rem .6rem; align-items: center; }
kv-sampling .kvs-sliders input[type=range]:focus-visible { outline: 2px solid var(--kv-focus); }
kv-sampling .kvs-cols { display: grid; grid-template-columns: repeat(auto-fit, minmax(16rem, 1fr)); gap: .6rem; }
kv-sampling .kvs-text { font-family: var(--kv-font-mono); white-space: pre-wrap; font-size: .9rem; }
kv-sampling .kvs-drawn { font-family: var(--kv-font-mono); }
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
    this.run = new WatchedRun(this, {
      watch: { internals: true, layers: [], sampling: true }, wants: ['sampling'],
      params: { temperature: 0, max_tokens: 4 },
      onEvent: (e) => {
        if (e.type === 'sampling' && e.distribution) this.add(e);
        // the embeddings event names the vocabulary: a draw outside the top ten keeps its text
        if (e.type === 'internals.embeddings' && e.vocab) this.vocab = new Map(e.vocab.ids.map((id, i) => [id, e.vocab.texts[i]]));
      },
      onReset: () => { this.steps = []; this.index = 0; this.drawn = []; this.vocab = new Map(); },
    });
    const uid = this.getAttribute('aria-labelledby');
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
      h('div', { class: 'kvw-row' }, h('label', { for: this.stepSel.id }, 'Next token after'), this.stepSel),
      sliders, this.chartEl, this.sumEl,
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
    const raw = e.stages[0].candidates;
    const d = e.distribution;
    const ids = d.ids || d.logits.map((_, i) => i);
    const texts = new Map(raw.map((c) => [c.id, c.text]));
    this.steps[e.index] = { ids, logits: d.logits, complete: d.complete, texts, chosen: e.chosen };
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
      + `${this.current.complete ? '' : ` (Only the ${d.shaped.length} most likely tokens were sent; the rest is left out.)`}`
      + ` The engine drew “${visibleText(this.current.chosen.text)}” here (greedy).`;
    this.drawnEl.textContent = this.drawn.length ? `Drawn with seed ${this.seedEl.value}: ${this.drawn.map((t) => `“${visibleText(t)}”`).join(' ')}` : '';
    this.dataset.sum = d.sum.toFixed(6);
    this.dataset.kept = String(d.kept);
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
      sum: d?.sum ?? null, kept: d?.kept ?? null, top: d?.rows ?? [], drawn: this.drawn,
      greedy: this.greedyEl.textContent, sampled: this.sampledEl.textContent };
  }
}

customElements.define('kv-sampling', KvSampling);
