// Beside an attached vLLM pool: how long its blocks lived, as vLLM itself measures them when
// started with --kv-cache-metrics (engine.vllm.pools[i].metrics.block_lifetimes): the time
// from a block's allocation to its eviction, how long it sat idle before it was evicted,
// and the gaps between two reuses of one block. Eviction policy made visible: in vLLM's
// LRU, a block idle longest goes first, so idle-before-eviction piles up at the long end
// when the pool is large for its load and moves short when the pool is under pressure.
// Without the flag, one line says how to turn it on.

import { h, svg } from './svg.js';
import { formatInt, formatSeconds } from '../../widget-base.js';

const CHARTS = [
  ['lifetime', 'Lifetime: allocation to eviction'],
  ['idle_before_evict', 'Idle before eviction'],
  ['reuse_gap', 'Gap between two reuses'],
];
const W = 220;
const H = 70;

export class BlockLifetimes {
  constructor() {
    this.chartsEl = h('div', { class: 'kvp-lifetimes' });
    this.noteEl = h('p', { class: 'kvw-note', 'data-lifetimes-note': '' });
    this.el = h('section', { class: 'kvw-panel', 'aria-label': 'Block lifetimes, as vLLM measures them', hidden: '' },
      h('h4', {}, 'Block lifetimes (vLLM’s own histograms)'), this.noteEl, this.chartsEl);
  }

  /** `metrics`: the drawn pool's figures (null: not attached, nothing to show). */
  show(metrics, poolName) {
    this.el.hidden = !metrics;
    if (!metrics) return;
    const life = metrics.block_lifetimes;
    this.el.dataset.reported = String(Boolean(life));
    if (!life) {
      this.noteEl.textContent = `${poolName}: vLLM reports how long blocks live only when started with --kv-cache-metrics (add --kv-cache-metrics-sample 1.0 to measure every block; by default 1 % are sampled).`;
      this.chartsEl.replaceChildren();
      return;
    }
    const sampled = life.lifetime?.count ?? 0;
    this.noteEl.textContent = sampled
      ? `${poolName}: ${formatInt(sampled)} evicted blocks measured so far (a sample, as vLLM's --kv-cache-metrics-sample sets). vLLM evicts the block idle longest first.`
      : `${poolName}: vLLM measures a block when it is evicted; no block of this pool has been evicted yet (the pool has room for everything cached so far).`;
    this.chartsEl.replaceChildren(...CHARTS.map(([key, title]) => this.chart(life[key], title, key)));
  }

  chart(hist, title, key) {
    const counts = hist?.counts || [];
    const max = Math.max(1, ...counts);
    const bw = counts.length ? W / counts.length : W;
    const label = (le) => (le === null ? 'more' : `≤${formatSeconds(le)}`);
    const words = counts.map((c, i) => `${label(hist.le[i])}: ${c}`).filter((_, i) => counts[i]).join(', ') || 'none yet';
    const mean = hist?.count ? ` · mean ${formatSeconds(hist.sum / hist.count)}` : '';
    return h('figure', { class: 'kvp-lifetime', 'data-histogram': key, 'data-count': String(hist?.count ?? 0) },
      svg('svg', { viewBox: `0 0 ${W} ${H + 14}`, width: W, height: H + 14, role: 'img', 'aria-label': `${title}: ${words}` },
        ...counts.map((c, i) => svg('rect', { x: i * bw + 1, y: H - (c / max) * H, width: Math.max(1, bw - 2), height: (c / max) * H, fill: 'var(--kv-cached)' })),
        svg('line', { x1: 0, y1: H, x2: W, y2: H, stroke: 'var(--kv-border)' }),
        ...(hist?.le?.length ? [svg('text', { x: 0, y: H + 12, 'font-size': 10, fill: 'currentColor' }, label(hist.le[0])),
          svg('text', { x: W, y: H + 12, 'font-size': 10, 'text-anchor': 'end', fill: 'currentColor' }, label(hist.le[hist.le.length - 2] ?? null))] : [])),
      h('figcaption', {}, `${title} (${formatInt(hist?.count ?? 0)}${mean})`));
  }
}

export const LIFETIMES_CSS = `
kv-pages .kvp-lifetimes { display: flex; flex-wrap: wrap; gap: .6rem 1rem; }
kv-pages .kvp-lifetime { margin: 0; font-size: .8rem; }
`;
