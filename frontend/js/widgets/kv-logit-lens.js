// <kv-logit-lens prompt="…">: the logit lens on the live model. For every layer, the
// model's final RMSNorm and LM head are applied to that layer's output, as if the model
// stopped there: the grid shows each position's most likely next token per layer (colour:
// its probability), and the panel below the top 5 of the chosen position at every layer.
// The top row is the model's real output, the distribution the engine samples from.

import { KvWidget, heatColor, heatTextColor } from '../widget-base.js';
import { h, svg } from './lib/svg.js';
import { injectStyle } from './lib/style.js';
import { WatchedRun } from './lib/watched-run.js';
import { visibleText } from './lib/tokens.js';

const STYLE = `
kv-logit-lens .kvl-grid text { font-family: var(--kv-font-mono); pointer-events: none; }
kv-logit-lens .kvl-grid .kvl-sel { fill: none; stroke: var(--kv-focus); stroke-width: 3; }
kv-logit-lens .kvl-grid:focus { outline: none; }
kv-logit-lens .kvl-grid:focus-visible { outline: 2px solid var(--kv-focus); outline-offset: 2px; }
kv-logit-lens .kvl-top { display: grid; grid-template-columns: auto 1fr; gap: .15rem .6rem; font-size: .85rem; }
kv-logit-lens .kvl-bars { display: flex; gap: .25rem; flex-wrap: wrap; }
kv-logit-lens .kvl-bars span { font-family: var(--kv-font-mono); padding: 0 .3rem; border-radius: 3px; white-space: pre; }
`;
const CELL_H = 30;
const LABEL_W = 92;

function short(text, n = 7) {
  const v = visibleText(text);
  return v.length > n ? `${v.slice(0, n - 1)}…` : v;
}

class KvLogitLens extends KvWidget {
  static events = [];
  static requires = ['requests', 'internals'];
  static label = 'Logit lens: what each layer would predict';

  setup() {
    injectStyle('kv-logit-lens', STYLE);
    this.run = new WatchedRun(this, {
      watch: { internals: true, layers: [], sampling: false }, wants: ['internals.logit_lens'],
      params: { temperature: 0, max_tokens: 3 },
      onEvent: (e) => { if (e.type === 'internals.logit_lens') this.add(e); },
      onReset: () => { this.byPos = new Map(); this.pos = -1; },
    });
    this.gridEl = h('div', { class: 'kvw-scroll' });
    this.detailEl = h('div', { class: 'kvw-panel', 'aria-live': 'polite' });
    this.body.append(this.run.controls, this.gridEl, this.detailEl,
      h('p', { class: 'kvw-note' }, 'Columns are positions (the token there is the input); each cell is the next token that layer would predict. Focus the grid and use ←/→ to choose a position.'));
    this.setLegend([
      { label: 'probability of the cell’s token: faint = unsure, strong colour = confident', color: heatColor(0.8) },
      { label: 'chosen position', color: 'var(--kv-focus)', shape: 'line' },
    ]);
  }

  connectedCallback() { super.connectedCallback(); this.run?.attach(); }
  disconnectedCallback() { super.disconnectedCallback(); this.run?.detach(); }

  add(e) {
    e.positions.forEach((p, r) => {
      this.byPos.set(p, e.layers.map((l) => l.top[r]));
    });
    if (this.pos < 0) this.pos = Math.max(...e.positions);
  }

  get positions() { return [...this.byPos.keys()].sort((a, b) => a - b); }

  render() {
    const positions = this.positions;
    if (!positions.length) {
      this.gridEl.replaceChildren(h('p', { class: 'kvw-note' }, this.run.rid ? 'Waiting for the model…' : 'Press Run: the engine runs your prompt and applies its last step to every layer.'));
      this.detailEl.replaceChildren();
      return;
    }
    const numLayers = this.byPos.get(positions[0]).length;
    const cellW = Math.max(44, Math.min(70, Math.floor(((this.clientWidth || 700) - LABEL_W - 20) / positions.length)));
    const W = LABEL_W + cellW * positions.length + 4;
    const H = 34 + CELL_H * numLayers + 4;
    const root = svg('svg', { class: 'kvw-svg kvl-grid', width: W, height: H, viewBox: `0 0 ${W} ${H}`, tabindex: 0, role: 'group',
      'aria-label': `Logit lens grid: ${numLayers} layers by ${positions.length} positions. Arrow keys choose a position.` });
    root.addEventListener('keydown', (ev) => this.onKey(ev));
    positions.forEach((p, c) => {
      const x = LABEL_W + c * cellW;
      root.append(svg('text', { x: x + cellW / 2, y: 14, 'text-anchor': 'middle', 'font-size': 11 }, short(this.run.labelAt(p), 8)));
      root.append(svg('text', { x: x + cellW / 2, y: 27, 'text-anchor': 'middle', 'font-size': 9, class: 'kvw-soft' }, `pos ${p}`));
      this.byPos.get(p).forEach((top, layer) => {
        const y = 34 + (numLayers - 1 - layer) * CELL_H;
        const best = top[0];
        const cell = svg('rect', { x, y, width: cellW - 2, height: CELL_H - 2, fill: heatColor(best.prob), 'data-pos': p, 'data-layer': layer, rx: 2 },
          svg('title', {}, `layer ${layer}, after “${this.run.labelAt(p)}”: ${visibleText(best.text)} ${(best.prob * 100).toFixed(1)}%`));
        cell.addEventListener('click', () => { this.pos = p; this.requestRender(); });
        root.append(cell, svg('text', { x: x + cellW / 2, y: y + CELL_H / 2 + 4, 'text-anchor': 'middle', 'font-size': 11, style: `fill: ${heatTextColor(best.prob)}` }, short(best.text)));
      });
    });
    for (let layer = 0; layer < numLayers; layer += 1) {
      const y = 34 + (numLayers - 1 - layer) * CELL_H + CELL_H / 2 + 4;
      root.append(svg('text', { x: LABEL_W - 6, y, 'text-anchor': 'end', 'font-size': 11 }, layer === numLayers - 1 ? `${layer} (output)` : `layer ${layer}`));
    }
    const c = positions.indexOf(this.pos);
    if (c >= 0) root.append(svg('rect', { x: LABEL_W + c * cellW - 1, y: 32, width: cellW, height: CELL_H * numLayers + 2, class: 'kvl-sel' }));
    const hadFocus = this.gridEl.contains(document.activeElement);
    this.gridEl.replaceChildren(root);
    if (hadFocus) root.focus();
    this.renderDetail(numLayers);
    this.dataset.positions = String(positions.length);
    this.dataset.layers = String(numLayers);
  }

  renderDetail(numLayers) {
    const tops = this.byPos.get(this.pos);
    if (!tops) return;
    const rows = [];
    for (let layer = numLayers - 1; layer >= 0; layer -= 1) {
      rows.push(h('span', {}, layer === numLayers - 1 ? `layer ${layer} = output` : `layer ${layer}`),
        h('span', { class: 'kvl-bars' }, ...tops[layer].map((t) => {
          const s = h('span', { title: `${(t.prob * 100).toFixed(2)}%` }, `${visibleText(t.text)} ${(t.prob * 100).toFixed(1)}%`);
          s.style.background = heatColor(t.prob);
          s.style.color = heatTextColor(t.prob);
          return s;
        })));
    }
    this.detailEl.replaceChildren(h('h4', {}, `After “${this.run.labelAt(this.pos)}” (position ${this.pos}): the top 5 at each layer`), h('div', { class: 'kvl-top' }, ...rows));
  }

  onKey(ev) {
    const positions = this.positions;
    const i = positions.indexOf(this.pos);
    const moves = { ArrowRight: i + 1, ArrowLeft: i - 1, Home: 0, End: positions.length - 1 };
    if (!(ev.key in moves)) return;
    ev.preventDefault();
    this.pos = positions[Math.max(0, Math.min(positions.length - 1, moves[ev.key]))];
    this.requestRender();
  }

  exportData() {
    return { request_id: this.run.rid, position: this.pos,
      positions: this.positions.map((p) => ({ position: p, token: this.run.labelAt(p), layers: this.byPos.get(p) })) };
  }
}

customElements.define('kv-logit-lens', KvLogitLens);
