// <kv-residual prompt="…">: the residual stream of the live model for one token of the
// learner's prompt. Bars: the size (norm) of the hidden state after each sublayer —
// embedding, then attention and MLP in every layer — and beside each, how much that
// sublayer added. Below: RMSNorm applied to the chosen token's vector entering layer 0,
// before and after (the engine sends it for the last position of each step; for the other
// prompt tokens the page applies the same rule to the token's embedding row, which is
// exactly what enters layer 0).

import { KvWidget, CATEGORICAL, heatColor } from '../widget-base.js';
import { h, svg } from './lib/svg.js';
import { injectStyle } from './lib/style.js';
import { WatchedRun } from './lib/watched-run.js';

const STYLE = `
kv-residual .kvr-chart:focus { outline: none; }
kv-residual .kvr-chart:focus-visible { outline: 2px solid var(--kv-focus); outline-offset: 2px; }
kv-residual .kvr-strip { display: block; }
`;
const STREAM = CATEGORICAL[0];
const ADDED = CATEGORICAL[1];

function stripOf(values, width, title) {
  const top = Math.max(...values.map(Math.abs)) || 1;
  const w = width / values.length;
  const root = svg('svg', { class: 'kvw-svg kvr-strip', width, height: 22, viewBox: `0 0 ${width} 22`, role: 'img', 'aria-label': title });
  values.forEach((v, i) => {
    root.append(svg('rect', { x: i * w, y: 0, width: Math.max(w, 0.5), height: 22, fill: heatColor(Math.abs(v) / top) }));
  });
  return root;
}

class KvResidual extends KvWidget {
  static events = [];
  static requires = ['requests', 'internals'];
  static label = 'The residual stream, sublayer by sublayer';

  setup() {
    injectStyle('kv-residual', STYLE);
    this.run = new WatchedRun(this, {
      watch: { internals: true, layers: [], sampling: false }, wants: ['internals.residual'],
      params: { temperature: 0, max_tokens: 2 },
      onEvent: (e) => {
        if (e.type === 'internals.residual') this.add(e);
        if (e.type === 'internals.embeddings') e.positions.forEach((p, i) => this.embeddingRows.set(p, e.rows[i]));
      },
      onReset: () => { this.byPos = new Map(); this.pos = -1; this.rmsnorms = new Map(); this.embeddingRows = new Map(); },
    });
    const uid = this.getAttribute('aria-labelledby');
    this.tokenSel = h('select', { class: 'kvw-select', id: `${uid}-token`, onchange: () => { this.pos = Number(this.tokenSel.value); this.requestRender(); } });
    this.chartEl = h('div', { class: 'kvw-scroll' });
    this.normEl = h('div', { class: 'kvw-panel' });
    this.body.append(this.run.controls,
      h('div', { class: 'kvw-row' }, h('label', { for: this.tokenSel.id }, 'Token'), this.tokenSel),
      this.chartEl, this.normEl);
    this.setLegend([
      { label: 'size of the residual stream (its norm) after this point', color: STREAM },
      { label: 'size of what the sublayer added to it', color: ADDED },
      { label: 'RMSNorm strips: |value| of each number, faint = near 0', color: heatColor(0.8) },
    ]);
  }

  connectedCallback() { super.connectedCallback(); this.run?.attach(); }
  disconnectedCallback() { super.disconnectedCallback(); this.run?.detach(); }

  add(e) {
    e.positions.forEach((p, r) => {
      this.byPos.set(p, e.layers.map((l) => ({ layer: l.layer, input: l.input_norm[r], attention: l.attention_norm[r],
        afterAttention: l.after_attention_norm[r], mlp: l.mlp_norm[r], output: l.output_norm[r] })));
    });
    this.rmsnorms.set(e.rmsnorm.position, e.rmsnorm);
    if (this.pos < 0 || !this.byPos.has(this.pos)) this.pos = e.positions[e.positions.length - 1];
  }

  /** Points along the stream: [label, stream norm, added norm]. */
  points(pos) {
    const layers = this.byPos.get(pos) || [];
    if (!layers.length) return [];
    const out = [['embedding', layers[0].input, null]];
    for (const l of layers) {
      out.push([`L${l.layer} attention`, l.afterAttention, l.attention], [`L${l.layer} MLP`, l.output, l.mlp]);
    }
    return out;
  }

  render() {
    const positions = [...this.byPos.keys()].sort((a, b) => a - b);
    if (!positions.length) {
      this.chartEl.replaceChildren(h('p', { class: 'kvw-note' }, this.run.rid ? 'Waiting for the model…' : 'Press Run to follow your prompt through every layer.'));
      this.normEl.replaceChildren();
      return;
    }
    if (this.tokenSel.options.length !== positions.length) {
      this.tokenSel.replaceChildren(...positions.map((p) => h('option', { value: p }, `${p}: ${this.run.labelAt(p)}`)));
    }
    this.tokenSel.value = String(this.pos);
    const pts = this.points(this.pos);
    const top = Math.max(...pts.flatMap(([, s, a]) => [s, a ?? 0])) || 1;
    const width = Math.min(this.chartEl.clientWidth || 640, 760);
    const slot = (width - 50) / pts.length;
    const H = 190;
    const base = H - 48;
    const scale = (v) => (v / top) * (base - 10);
    const root = svg('svg', { class: 'kvw-svg kvr-chart', width, height: H, viewBox: `0 0 ${width} ${H}`, role: 'img',
      'aria-label': `Residual stream norms for token ${this.pos} “${this.run.labelAt(this.pos)}”: ${pts.map(([l, s]) => `${l} ${s.toFixed(2)}`).join(', ')}` });
    root.append(svg('line', { x1: 40, y1: base, x2: width, y2: base, stroke: 'var(--kv-border)' }));
    root.append(svg('text', { x: 36, y: base - scale(top) + 4, 'text-anchor': 'end', 'font-size': 10, class: 'kvw-soft' }, top.toFixed(1)));
    root.append(svg('text', { x: 36, y: base + 4, 'text-anchor': 'end', 'font-size': 10, class: 'kvw-soft' }, '0'));
    pts.forEach(([label, stream, added], i) => {
      const x = 44 + i * slot;
      const bw = Math.max(3, slot * 0.38);
      root.append(svg('rect', { x, y: base - scale(stream), width: bw, height: scale(stream), style: `fill: ${STREAM}`, 'data-kind': 'stream' },
        svg('title', {}, `${label}: stream norm ${stream.toFixed(3)}`)));
      if (added !== null) {
        root.append(svg('rect', { x: x + bw + 1, y: base - scale(added), width: bw, height: scale(added), style: `fill: ${ADDED}`, 'data-kind': 'added' },
          svg('title', {}, `${label} added a vector of norm ${added.toFixed(3)}`)));
      }
      root.append(svg('text', { x: x + bw, y: base + 12, 'text-anchor': 'end', 'font-size': 9, transform: `rotate(-35 ${x + bw} ${base + 12})` }, label));
    });
    this.chartEl.replaceChildren(root);
    this.renderNorm();
    this.dataset.points = String(pts.length);
  }

  /** RMSNorm (layer 0's input norm) of the vector at `pos`: the engine's, else the same rule
   *  on the token's embedding row with the engine's weight and ε; null when neither is known. */
  rmsnormAt(pos) {
    if (this.rmsnorms.has(pos)) return this.rmsnorms.get(pos);
    const input = this.embeddingRows.get(pos);
    const known = this.rmsnorms.values().next().value;
    if (!input || !known) return null;
    const rms = Math.sqrt(input.reduce((s, x) => s + x * x, 0) / input.length + known.eps);
    return { position: pos, layer: 0, eps: known.eps, rms, input, weight: known.weight,
      output: input.map((x, i) => (x / rms) * known.weight[i]) };
  }

  renderNorm() {
    const n = this.rmsnormAt(this.pos);
    this.dataset.normPosition = n ? String(n.position) : '';
    if (!n) { this.normEl.replaceChildren(); return; }
    const width = Math.min(this.normEl.clientWidth || 600, 700) - 30;
    const sq = (v) => Math.sqrt(v.reduce((s, x) => s + x * x, 0));
    this.normEl.replaceChildren(
      h('h4', {}, `RMSNorm on one real vector: “${this.run.labelAt(n.position)}” entering layer 0`),
      h('p', { class: 'kvw-note' }, `Before: ${n.input.length} numbers, root mean square ${n.rms.toFixed(4)} (norm ${sq(n.input).toFixed(3)}).`),
      stripOf(n.input, width, 'the vector before RMSNorm'),
      h('p', { class: 'kvw-note' }, `Divide every number by ${n.rms.toFixed(4)} (ε = ${n.eps} keeps it from being 0), then multiply each by its learned weight: norm ${sq(n.output).toFixed(3)}. Which numbers are large and which small barely changes; the overall size does.`),
      stripOf(n.output, width, 'the vector after RMSNorm'),
    );
  }

  exportData() {
    return { request_id: this.run.rid, position: this.pos, token: this.pos >= 0 ? this.run.labelAt(this.pos) : null,
      stream: this.points(this.pos).map(([label, stream, added]) => ({ point: label, stream_norm: stream, added_norm: added })),
      rmsnorm: this.pos >= 0 ? this.rmsnormAt(this.pos) : null };
  }
}

customElements.define('kv-residual', KvResidual);
