// <kv-mlp prompt="…">: the SwiGLU MLP of the live model, for one token and one layer of
// the learner's prompt: histograms of the gate (before and after SiLU), of up and of
// their product over all the layer's neurons, the most active neurons, and how large
// the down projection's output is next to the stream it is added to.

import { KvWidget, CATEGORICAL } from '../widget-base.js';
import { h, svg } from './lib/svg.js';
import { injectStyle } from './lib/style.js';
import { WatchedRun } from './lib/watched-run.js';

const STYLE = `
kv-mlp .kvm-hists { display: grid; grid-template-columns: repeat(auto-fit, minmax(15rem, 1fr)); gap: .5rem; }
kv-mlp .kvm-top { font-family: var(--kv-font-mono); font-size: .85rem; border-collapse: collapse; }
kv-mlp .kvm-top td, kv-mlp .kvm-top th { padding: .1rem .5rem; text-align: right; border-bottom: 1px solid var(--kv-border); }
`;
const KINDS = [
  ['gate', 'gate (before SiLU)', CATEGORICAL[0]],
  ['activation', 'SiLU(gate)', CATEGORICAL[2]],
  ['up', 'up', CATEGORICAL[1]],
  ['product', 'SiLU(gate) × up', CATEGORICAL[3]],
];

function histogram(edges, counts, color, title) {
  const W = 240;
  const H = 110;
  const top = Math.max(...counts) || 1;
  const bw = (W - 10) / counts.length;
  const root = svg('svg', { class: 'kvw-svg', width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: 'img',
    'aria-label': `${title}: ${counts.reduce((a, b) => a + b, 0)} neurons from ${edges[0].toFixed(2)} to ${edges[edges.length - 1].toFixed(2)}` });
  counts.forEach((c, i) => {
    const bh = (c / top) * (H - 34);
    root.append(svg('rect', { x: 5 + i * bw, y: H - 20 - bh, width: Math.max(1, bw - 1), height: bh, style: `fill: ${color}` },
      svg('title', {}, `${edges[i].toFixed(2)} to ${edges[i + 1].toFixed(2)}: ${c} neurons`)));
  });
  const zero = 5 + ((0 - edges[0]) / (edges[edges.length - 1] - edges[0])) * (W - 10);
  root.append(svg('line', { x1: zero, y1: 8, x2: zero, y2: H - 20, stroke: 'var(--kv-fg-soft)', 'stroke-dasharray': '2 2' }));
  root.append(svg('text', { x: 5, y: H - 6, 'font-size': 10, class: 'kvw-soft' }, edges[0].toFixed(2)));
  root.append(svg('text', { x: W - 5, y: H - 6, 'font-size': 10, 'text-anchor': 'end', class: 'kvw-soft' }, edges[edges.length - 1].toFixed(2)));
  root.append(svg('text', { x: zero, y: H - 6, 'font-size': 10, 'text-anchor': 'middle', class: 'kvw-soft' }, '0'));
  root.append(svg('text', { x: 5, y: 10, 'font-size': 11 }, title));
  return root;
}

class KvMlp extends KvWidget {
  static events = [];
  static requires = ['requests', 'internals'];
  static label = 'Inside one MLP: gate, up and their product';

  setup() {
    injectStyle('kv-mlp', STYLE);
    this.run = new WatchedRun(this, {
      watch: { internals: true, layers: [], sampling: false }, wants: ['internals.mlp'],
      params: { temperature: 0, max_tokens: 2 },
      onEvent: (e) => { if (e.type === 'internals.mlp') this.add(e); },
      onReset: () => { this.byPos = new Map(); this.pos = -1; this.intermediate = 0; },
    });
    this.layer = 0;
    const uid = this.getAttribute('aria-labelledby');
    this.tokenSel = h('select', { class: 'kvw-select', id: `${uid}-token`, onchange: () => { this.pos = Number(this.tokenSel.value); this.requestRender(); } });
    this.layerSel = h('select', { class: 'kvw-select', id: `${uid}-layer`, onchange: () => { this.layer = Number(this.layerSel.value); this.requestRender(); } });
    this.histEl = h('div', { class: 'kvm-hists' });
    this.infoEl = h('p', { class: 'kvw-note' });
    this.topEl = h('div', { class: 'kvw-scroll' });
    this.body.append(this.run.controls,
      h('div', { class: 'kvw-row' }, h('label', { for: this.tokenSel.id }, 'Token'), this.tokenSel,
        h('label', { for: this.layerSel.id }, 'Layer'), this.layerSel),
      this.infoEl, this.histEl, this.topEl);
    this.setLegend([...KINDS.map(([, label, color]) => ({ label: `${label}: how many neurons have each value`, color })),
      { label: 'zero', color: 'var(--kv-fg-soft)', shape: 'line' }]);
  }

  connectedCallback() { super.connectedCallback(); this.run?.attach(); }
  disconnectedCallback() { super.disconnectedCallback(); this.run?.detach(); }

  add(e) {
    this.intermediate = e.intermediate_size;
    e.positions.forEach((p, r) => {
      this.byPos.set(p, e.layers.map((l) => ({
        layer: l.layer, active: l.active_share[r], top: l.top[r], down: l.down_norm[r], stream: l.stream_norm[r],
        hist: Object.fromEntries(KINDS.map(([k]) => [k, { edges: l[k].edges, counts: l[k].counts[r] }])),
      })));
    });
    if (this.pos < 0 || !this.byPos.has(this.pos)) this.pos = e.positions[e.positions.length - 1];
  }

  get current() { return this.byPos.get(this.pos)?.[this.layer]; }

  render() {
    const positions = [...this.byPos.keys()].sort((a, b) => a - b);
    if (!positions.length) {
      this.histEl.replaceChildren(h('p', { class: 'kvw-note' }, this.run.rid ? 'Waiting for the model…' : 'Press Run to see the MLP neurons your prompt switches on.'));
      this.topEl.replaceChildren();
      this.infoEl.textContent = '';
      return;
    }
    const numLayers = this.byPos.get(positions[0]).length;
    if (this.tokenSel.options.length !== positions.length) {
      this.tokenSel.replaceChildren(...positions.map((p) => h('option', { value: p }, `${p}: ${this.run.labelAt(p)}`)));
    }
    if (this.layerSel.options.length !== numLayers) {
      this.layerSel.replaceChildren(...Array.from({ length: numLayers }, (_, i) => h('option', { value: i }, `layer ${i}`)));
    }
    this.layer = Math.min(this.layer, numLayers - 1);
    this.tokenSel.value = String(this.pos);
    this.layerSel.value = String(this.layer);
    const c = this.current;
    this.histEl.replaceChildren(...KINDS.map(([k, label, color]) => histogram(c.hist[k].edges, c.hist[k].counts, color, label)));
    this.infoEl.textContent = `“${this.run.labelAt(this.pos)}”, layer ${this.layer}: ${this.intermediate} neurons; `
      + `${(c.active * 100).toFixed(0)}% have a product above a tenth of the largest. The down projection turns them into a vector of norm `
      + `${c.down.toFixed(3)}, added to a stream of norm ${c.stream.toFixed(3)} (${((c.down / (c.stream || 1)) * 100).toFixed(0)}% of its size).`;
    this.topEl.replaceChildren(h('table', { class: 'kvm-top' },
      h('caption', { class: 'kvw-note' }, 'The most active neurons (largest |SiLU(gate) × up|)'),
      h('thead', {}, h('tr', {}, h('th', {}, 'neuron'), h('th', {}, 'gate'), h('th', {}, 'up'), h('th', {}, 'product'))),
      h('tbody', {}, ...c.top.map((n) => h('tr', {}, h('td', {}, String(n.neuron)), h('td', {}, n.gate.toFixed(3)),
        h('td', {}, n.up.toFixed(3)), h('td', {}, n.product.toFixed(3)))))));
    this.dataset.histograms = String(this.histEl.querySelectorAll('svg').length);
  }

  exportData() {
    return { request_id: this.run.rid, position: this.pos, layer: this.layer, intermediate_size: this.intermediate,
      token: this.pos >= 0 ? this.run.labelAt(this.pos) : null, mlp: this.current || null };
  }
}

customElements.define('kv-mlp', KvMlp);
