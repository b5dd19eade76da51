// The memory hierarchy as an SVG: one row per level, fastest and smallest at the top, with
// log-scale bars for capacity and bandwidth; the live device's own figures beside the H100's.

import { svg } from './svg.js';
import { formatBytes, formatSI } from '../../widget-base.js';

const ROW_H = 62;
const LOCAL_H = 14;   // the extra line of a level the live device has
const CAP = [1e5, 1e12];   // log-scale ranges of the bars
const BW = [1e10, 1e14];

function logFrac(v, [lo, hi]) {
  if (!v || v <= 0) return 0;
  return Math.max(0.02, Math.min(1, (Math.log10(v) - Math.log10(lo)) / (Math.log10(hi) - Math.log10(lo))));
}

export function rate(bps) {
  return bps ? `${formatSI(bps)}B/s` : '—';
}

/** Spec-sheet sizes are decimal (80 GB); the binary figure follows when it differs much. */
export function specBytes(bytes) {
  const dec = `${formatSI(bytes, bytes >= 1e9 ? 0 : 1)}B`;
  return bytes >= 1e9 ? `${dec} (${formatBytes(bytes)})` : formatBytes(bytes);
}

/** levels: from memory-model.hierarchy(); local: {key → {bytes, bandwidth, label}} for the live device. */
export function drawHierarchy(levels, local, width) {
  const W = Math.max(width, 380);
  const nameW = Math.min(200, Math.max(150, Math.floor(W * 0.34)));
  const barX = nameW + 10;
  const barW = W - barX - 8;
  const H = 24 + levels.length * ROW_H + Object.keys(local).length * LOCAL_H + 6;
  const root = svg('svg', {
    class: 'kvw-svg kvm-hier', width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: 'img',
    'aria-label': `Memory hierarchy of an H100, fastest first: ${levels.map((l) => `${l.name}${l.bytes ? `, ${specBytes(l.bytes)}` : ''}${l.bandwidth ? `, ${l.approx ? 'about ' : ''}${rate(l.bandwidth)}` : ''}`).join('; ')}`
      + `${Object.values(local).map((m) => `; this ${m.label}: ${m.bytes ? formatBytes(m.bytes) : ''} ${m.bandwidth ? rate(m.bandwidth) : ''}`).join('')}`,
  });
  root.append(
    svg('text', { x: 0, y: 14, 'font-size': 12, 'font-weight': 700 }, 'level (H100 SXM)'),
    svg('text', { x: barX, y: 14, 'font-size': 12, 'font-weight': 700 }, 'capacity ▬ and bandwidth ▬ (log scales)'),
  );
  let y = 22;
  levels.forEach((l, i) => {
    if (i > 0) y += ROW_H + (local[levels[i - 1].key] ? LOCAL_H : 0);
    const g = svg('g', { transform: `translate(0,${y})`, 'data-level': l.key });
    // A pyramid cue: faster levels drawn narrower.
    const inset = (levels.length - 1 - i) * 5;
    g.append(svg('rect', { x: inset, y: 2, width: nameW - 2 * inset, height: ROW_H - 8, rx: 4, class: `kvm-level kvm-level--${l.key}` }));
    g.append(svg('text', { x: inset + 6, y: 19, 'font-size': 12, 'font-weight': 600 }, l.name));
    g.append(svg('text', { x: inset + 6, y: 34, 'font-size': 10, class: 'kvw-soft' }, l.scope));
    const cap = l.bytes;
    g.append(svg('rect', { x: barX, y: 4, width: barW, height: 9, class: 'kvm-track' }));
    if (cap) g.append(svg('rect', { x: barX, y: 4, width: barW * logFrac(cap, CAP), height: 9, class: 'kvm-cap' }));
    g.append(svg('text', { x: barX, y: 24, 'font-size': 10 }, cap ? `${specBytes(cap)}${l.per ? ` · ${l.per}` : ''}` : (l.per || '')));
    g.append(svg('rect', { x: barX, y: 29, width: barW, height: 9, class: 'kvm-track' }));
    if (l.bandwidth) g.append(svg('rect', { x: barX, y: 29, width: barW * logFrac(l.bandwidth, BW), height: 9, class: 'kvm-bw' }));
    const mine = local[l.key];
    const bwText = l.bandwidth ? `${l.approx ? '≈ ' : ''}${rate(l.bandwidth)}` : 'operands every cycle';
    g.append(svg('text', { x: barX, y: 49, 'font-size': 10 }, bwText));
    if (mine) {
      if (mine.bandwidth) {
        const mx = barX + barW * logFrac(mine.bandwidth, BW);
        g.append(svg('line', { x1: mx, y1: 26, x2: mx, y2: 41, class: 'kvm-localmark' }));
      }
      g.append(svg('text', { x: barX, y: 49 + LOCAL_H, 'font-size': 10, class: 'kvm-local' },
        `┃ this ${mine.label}: ${mine.bytes ? formatBytes(mine.bytes) : ''}${mine.bandwidth ? `, ${rate(mine.bandwidth)}` : ''}`));
    }
    root.append(g);
  });
  return root;
}

export const HIERARCHY_CSS = `
kv-memory .kvm-level { fill: var(--kv-bg-soft); stroke: var(--kv-border); }
kv-memory .kvm-level--hbm { stroke: var(--kv-cat-1); stroke-width: 2; }
kv-memory .kvm-track { fill: var(--kv-bg-soft); stroke: var(--kv-border); }
kv-memory .kvm-cap { fill: var(--kv-cat-1); }
kv-memory .kvm-bw { fill: var(--kv-cat-2); }
kv-memory .kvm-local { fill: var(--kv-cat-4); font-weight: 600; }
kv-memory .kvm-localmark { stroke: var(--kv-cat-4); stroke-width: 3; }
`;
