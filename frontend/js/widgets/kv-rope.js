// <kv-rope prompt="…">: rotary position embedding with the live model's own numbers.
// Running a prompt fetches the rotation frequencies the engine really uses (rope_theta,
// head_dim, any scaling). Two sliders place a query at position m and a key at position
// n; for a chosen pair of dimensions both arrows turn by their position times that
// pair's frequency, and the score summed over every pair depends only on m − n: shift
// both and it stays; the curve shows it against the distance.

import { KvWidget, CATEGORICAL } from '../widget-base.js';
import { h, svg } from './lib/svg.js';
import { injectStyle } from './lib/style.js';
import { WatchedRun } from './lib/watched-run.js';

const STYLE = `
kv-rope .kvp-ctl { display: grid; grid-template-columns: auto minmax(8rem, 18rem) 3rem; gap: .3rem .6rem; align-items: center; }
kv-rope .kvp-ctl input[type=range]:focus-visible { outline: 2px solid var(--kv-focus); }
kv-rope .kvp-cols { display: flex; flex-wrap: wrap; gap: 1rem; align-items: flex-start; }
`;
const Q = CATEGORICAL[0];
const K = CATEGORICAL[1];
const CURVE = CATEGORICAL[7];
const MAX_POS = 64;

/** The score of a query at m and a key at n when every pair starts as the same unit
 * vector: each pair contributes cos((m − n) · frequency). */
export function ropeScore(invFreq, m, n) {
  return invFreq.reduce((s, f) => s + Math.cos((m - n) * f), 0);
}

class KvRope extends KvWidget {
  static events = [];
  static requires = ['requests', 'internals'];
  static label = 'RoPE: rotation by position';

  setup() {
    injectStyle('kv-rope', STYLE);
    this.run = new WatchedRun(this, {
      watch: { internals: true, layers: [], sampling: false }, wants: ['internals.rope'],
      params: { temperature: 0, max_tokens: 1 },
      onEvent: (e) => { if (e.type === 'internals.rope') this.rope = e; },
      onReset: () => { this.rope = null; },
    });
    const uid = this.getAttribute('aria-labelledby');
    this.state = { m: 5, n: 2, pair: 0 };
    this.inputs = {};
    const ctl = h('div', { class: 'kvp-ctl' });
    for (const [key, label, max] of [['m', 'Query position m', MAX_POS], ['n', 'Key position n', MAX_POS], ['pair', 'Dimension pair i', 1]]) {
      const input = h('input', { type: 'range', id: `${uid}-${key}`, min: 0, max, step: 1, value: this.state[key], 'data-param': key,
        oninput: () => { this.state[key] = Number(input.value); this.requestRender(); } });
      const out = h('output', { for: input.id });
      this.inputs[key] = { input, out };
      ctl.append(h('label', { for: input.id }, label), input, out);
    }
    this.shiftBtn = h('button', { type: 'button', class: 'kvw-btn', onclick: () => this.shift(5) }, 'Shift both by +5');
    this.circleEl = h('div', {});
    this.curveEl = h('div', {});
    this.freqEl = h('div', { class: 'kvw-scroll' });
    this.infoEl = h('p', { 'aria-live': 'polite' });
    this.body.append(this.run.controls, ctl, h('div', { class: 'kvw-row' }, this.shiftBtn), this.infoEl,
      h('div', { class: 'kvp-cols' }, this.circleEl, this.curveEl), this.freqEl);
    this.setLegend([
      { label: 'query at position m', color: Q, shape: 'line' },
      { label: 'key at position n', color: K, shape: 'line' },
      { label: 'score against distance m − n (dot = now)', color: CURVE, shape: 'line' },
    ]);
  }

  connectedCallback() { super.connectedCallback(); this.run?.attach(); }
  disconnectedCallback() { super.disconnectedCallback(); this.run?.detach(); }

  shift(d) {
    const room = MAX_POS - Math.max(this.state.m, this.state.n);
    const by = room >= d ? d : -Math.min(this.state.m, this.state.n);
    this.state.m += by;
    this.state.n += by;
    this.requestRender();
  }

  render() {
    for (const [key, { input, out }] of Object.entries(this.inputs)) {
      input.value = String(this.state[key]);
      out.textContent = String(this.state[key]);
    }
    const r = this.rope;
    this.shiftBtn.disabled = !r;
    if (!r) {
      this.infoEl.textContent = this.run.rid ? 'Waiting for the model…' : 'Press Run to fetch the rotation frequencies the engine uses.';
      this.circleEl.replaceChildren();
      this.curveEl.replaceChildren();
      this.freqEl.replaceChildren();
      return;
    }
    const pairs = r.inv_freq.length;
    this.inputs.pair.input.max = String(pairs - 1);
    this.state.pair = Math.min(this.state.pair, pairs - 1);
    const { m, n, pair } = this.state;
    const f = r.inv_freq[pair];
    const score = ropeScore(r.inv_freq, m, n);
    this.infoEl.textContent = `Pair ${pair} turns ${f.toPrecision(3)} radians per position (one full turn every ${(2 * Math.PI / f).toFixed(1)} positions). `
      + `Query at ${m}, key at ${n}: distance ${m - n}, score ${score.toFixed(3)} (summed over all ${pairs} pairs).`;
    this.circleEl.replaceChildren(this.circle(f, m, n));
    this.curveEl.replaceChildren(this.curve(r.inv_freq, m - n));
    this.freqEl.replaceChildren(this.frequencies(r));
    this.dataset.score = score.toFixed(6);
  }

  circle(f, m, n) {
    const S = 200;
    const c = S / 2;
    const R = 58;   // room for the labels
    const arrow = (angle, color, label) => {
      const x = c + R * Math.cos(angle);
      const y = c - R * Math.sin(angle);
      return [svg('line', { x1: c, y1: c, x2: x, y2: y, style: `stroke: ${color}`, 'stroke-width': 3 }),
        svg('circle', { cx: x, cy: y, r: 4, style: `fill: ${color}` }),
        svg('text', { x: x + (x > c ? 6 : -6), y: y - 4, 'text-anchor': x > c ? 'start' : 'end', 'font-size': 12 }, label)];
    };
    return svg('svg', { class: 'kvw-svg', width: S, height: S, viewBox: `0 0 ${S} ${S}`, role: 'img',
      'aria-label': `pair rotated: query by ${(m * f).toFixed(2)} radians, key by ${(n * f).toFixed(2)} radians; angle between them ${((m - n) * f).toFixed(2)}` },
    svg('circle', { cx: c, cy: c, r: R, fill: 'none', stroke: 'var(--kv-border)' }),
    ...arrow(m * f, Q, `q @${m}`), ...arrow(n * f, K, `k @${n}`));
  }

  curve(invFreq, distance) {
    const W = 300;
    const H = 180;
    const ds = Array.from({ length: 2 * MAX_POS + 1 }, (_, i) => i - MAX_POS);
    const vals = ds.map((d) => ropeScore(invFreq, d, 0));
    const [lo, hi] = [Math.min(...vals), Math.max(...vals)];
    const x = (d) => 10 + ((d + MAX_POS) / (2 * MAX_POS)) * (W - 20);
    const y = (v) => H - 24 - ((v - lo) / (hi - lo || 1)) * (H - 40);
    const path = ds.map((d, i) => `${i ? 'L' : 'M'} ${x(d).toFixed(1)} ${y(vals[i]).toFixed(1)}`).join(' ');
    return svg('svg', { class: 'kvw-svg', width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: 'img',
      'aria-label': `score against distance from −${MAX_POS} to ${MAX_POS}; now ${distance}` },
    svg('path', { d: path, fill: 'none', style: `stroke: ${CURVE}`, 'stroke-width': 1.5 }),
    svg('circle', { cx: x(distance), cy: y(ropeScore(invFreq, distance, 0)), r: 5, style: `fill: ${Q}` }),
    svg('text', { x: W / 2, y: H - 6, 'text-anchor': 'middle', 'font-size': 11, class: 'kvw-soft' }, 'distance m − n'),
    svg('text', { x: 10, y: 12, 'font-size': 11, class: 'kvw-soft' }, 'score'));
  }

  frequencies(r) {
    const W = Math.min(this.clientWidth || 640, 700);
    const H = 120;
    const n = r.inv_freq.length;
    const bw = (W - 50) / n;
    const logs = r.inv_freq.map((f) => Math.log10(2 * Math.PI / f));
    const top = Math.max(...logs) || 1;
    const root = svg('svg', { class: 'kvw-svg', width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: 'img',
      'aria-label': `${n} pairs; one turn every ${(2 * Math.PI / r.inv_freq[0]).toFixed(1)} positions for pair 0 up to ${(2 * Math.PI / r.inv_freq[n - 1]).toFixed(0)} for pair ${n - 1}` });
    r.inv_freq.forEach((f, i) => {
      const bh = Math.max(1, (logs[i] / top) * (H - 40));
      root.append(svg('rect', { x: 40 + i * bw, y: H - 20 - bh, width: Math.max(1, bw - 1), height: bh,
        style: `fill: ${i === this.state.pair ? Q : CURVE}` }, svg('title', {}, `pair ${i}: one turn every ${(2 * Math.PI / f).toFixed(1)} positions`)));
    });
    root.append(svg('text', { x: 40, y: 12, 'font-size': 11 }, `Positions per full turn, log scale (rope_theta ${r.rope_theta}, head_dim ${r.head_dim}, ${r.rope_type})`));
    root.append(svg('text', { x: 40, y: H - 6, 'font-size': 10, class: 'kvw-soft' }, 'pair 0 (fastest)'));
    root.append(svg('text', { x: W - 4, y: H - 6, 'font-size': 10, 'text-anchor': 'end', class: 'kvw-soft' }, `pair ${n - 1} (slowest)`));
    return root;
  }

  exportData() {
    const r = this.rope;
    return { request_id: this.run.rid, ...this.state, rope_theta: r?.rope_theta ?? null, head_dim: r?.head_dim ?? null,
      inv_freq: r?.inv_freq ?? [], score: r ? ropeScore(r.inv_freq, this.state.m, this.state.n) : null };
  }
}

customElements.define('kv-rope', KvRope);
