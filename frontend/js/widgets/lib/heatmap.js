// An attention heatmap in SVG: rows are query positions, columns key positions; the upper
// triangle (a query looking at later tokens) is the causal mask, drawn hatched.

import { h, svg, uniqueId } from './svg.js';
import { heatColor, heatTextColor, cssVar } from '../../widget-base.js';

const LABEL_W = 96;
const TOP_H = 74;

function shorten(label, max = 9) {
  return label.length > max ? `${label.slice(0, max - 1)}…` : label;
}

/**
 * rows: array (length n) of arrays (length n, zeros above the diagonal) or null for rows
 * not received; labels: n strings; active: highlighted row or -1; vmax: top of the scale;
 * split: the first generated row (a line is drawn above it); recomputed: a Set of rows
 * rebuilt from prefix-cached keys (marked beside the row). Returns {svg, cell, rowEls}.
 */
export function drawHeatmap({ n, rows, labels, active, vmax, width, title, rowScale = false, split = 0, recomputed = new Set() }) {
  const cell = Math.max(6, Math.min(30, Math.floor((Math.max(width, 320) - LABEL_W - 12) / Math.max(n, 1))));
  const side = cell * n;
  const W = LABEL_W + side + 8;
  const H = TOP_H + side + 8;
  const hatchId = uniqueId('kva-hatch');
  const root = svg('svg', {
    class: 'kvw-svg kva-heatmap', width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: 'group',
    'aria-label': title,
  });
  root.append(svg('defs', {},
    svg('pattern', { id: hatchId, width: 6, height: 6, patternUnits: 'userSpaceOnUse', patternTransform: 'rotate(45)' },
      svg('rect', { width: 6, height: 6, class: 'kva-mask-bg' }),
      svg('line', { x1: 0, y1: 0, x2: 0, y2: 6, class: 'kva-mask-line' }))));

  const grid = svg('g', { transform: `translate(${LABEL_W},${TOP_H})`, class: 'kva-cells' });
  // The causal mask: one hatched staircase over the upper triangle.
  if (n > 1) {
    let d = `M ${cell} 0 L ${side} 0 L ${side} ${side - cell}`;
    for (let r = n - 2; r >= 0; r -= 1) d += ` L ${(r + 1) * cell} ${(r + 1) * cell} L ${(r + 1) * cell} ${r * cell}`;
    grid.append(svg('path', { d: `${d} Z`, fill: `url(#${hatchId})`, class: 'kva-mask' }));
  }
  const scale = vmax > 0 ? vmax : 1;
  for (let r = 0; r < n; r += 1) {
    const row = rows[r];
    if (!row) {
      grid.append(svg('rect', { x: 0, y: r * cell, width: (r + 1) * cell, height: cell, class: 'kva-missing', 'data-row': r }));
      continue;
    }
    const top = rowScale ? Math.max(...row.slice(0, r + 1)) || 1 : scale;
    for (let c = 0; c <= r; c += 1) {
      const w = row[c] || 0;
      grid.append(svg('rect', {
        x: c * cell, y: r * cell, width: cell, height: cell, fill: heatColor(w / top),
        'data-row': r, 'data-col': c,
      }, svg('title', {}, `${labels[r]} → ${labels[c]}: ${w.toFixed(4)}`)));
    }
  }
  for (const r of recomputed) {
    if (r < n) grid.append(svg('rect', { x: -5, y: r * cell, width: 3, height: cell, class: 'kva-recomputed' }));
  }
  if (split > 0 && split < n) {
    grid.append(svg('line', { x1: -5, y1: split * cell, x2: side, y2: split * cell, class: 'kva-split' }));
  }
  if (active >= 0 && active < n) {
    grid.append(svg('rect', { x: -2, y: active * cell - 1, width: (active + 1) * cell + 3, height: cell + 2, class: 'kva-active' }));
  }
  grid.append(svg('rect', { x: 0, y: 0, width: side, height: side, class: 'kva-frame' }));
  root.append(grid);

  // Key labels along the top (rotated), thinned when cells are small.
  const every = cell >= 12 ? 1 : Math.ceil(12 / cell);
  const top = svg('g', { transform: `translate(${LABEL_W},${TOP_H - 4})`, 'aria-hidden': 'true' });
  for (let c = 0; c < n; c += every) {
    const x = c * cell + cell / 2;
    top.append(svg('text', { x, y: 0, transform: `rotate(-60 ${x} 0)`, class: 'kva-label', 'font-size': Math.min(12, cell) }, shorten(labels[c])));
  }
  root.append(top);
  root.append(svg('text', { x: LABEL_W, y: 12, class: 'kvw-soft', 'font-size': 11 }, 'keys (earlier tokens) →'));

  // Query labels down the left: focusable, one tab stop (roving).
  const left = svg('g', { transform: `translate(${LABEL_W - 6},${TOP_H})` });
  const rowEls = [];
  for (let r = 0; r < n; r += 1) {
    const focusable = r === (active >= 0 ? active : 0);
    const text = svg('text', {
      x: 0, y: r * cell + cell / 2, 'text-anchor': 'end', 'dominant-baseline': 'central',
      class: `kva-label kva-row${r === active ? ' kva-row--on' : ''}`, 'font-size': Math.min(12, Math.max(cell, 8)),
      tabindex: focusable ? 0 : -1, role: 'button', 'data-row': r,
      'aria-label': `query ${r}: ${labels[r]}${rows[r] ? '' : ' (not received)'}`,
      visibility: cell >= 9 || r === active || r % Math.ceil(9 / cell) === 0 ? 'visible' : 'hidden',
    }, shorten(labels[r], 11));
    rowEls.push(text);
    left.append(text);
  }
  root.append(left);
  return { svg: root, cell, rowEls };
}

/** Past this many rows the heatmap is drawn on a canvas (tens of thousands of cells). */
export const CANVAS_ROWS = 96;

/**
 * The same heatmap on a canvas, for long prompts: no per-cell labels; the canvas takes
 * focus and the widget moves the active row with the arrow keys. Returns {canvas, cell}.
 */
export function drawHeatmapCanvas({ n, rows, active, vmax, width, title, rowScale = false, split = 0 }) {
  const cell = Math.max(1, Math.floor(Math.max(width, 320) / n));
  const side = cell * n;
  const canvas = h('canvas', { class: 'kva-canvas', tabindex: '0', role: 'img', 'aria-label': `${title}. Arrow keys move between query rows.`, 'data-row-canvas': '' });
  const ratio = window.devicePixelRatio || 1;
  canvas.width = side * ratio;
  canvas.height = side * ratio;
  canvas.style.width = `${side}px`;
  canvas.style.height = `${side}px`;
  const ctx = canvas.getContext('2d');
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  ctx.fillStyle = cssVar('--kv-bg-soft') || '#eee';
  ctx.fillRect(0, 0, side, side);
  ctx.strokeStyle = cssVar('--kv-border') || '#ccc';
  ctx.lineWidth = 1;
  for (let k = -side; k < side; k += 6) {   // the causal mask, hatched (cells below paint over it)
    ctx.beginPath();
    ctx.moveTo(k, side);
    ctx.lineTo(k + side, 0);
    ctx.stroke();
  }
  const scale = vmax > 0 ? vmax : 1;
  for (let r = 0; r < n; r += 1) {
    const row = rows[r];
    if (!row) continue;
    const top = rowScale ? Math.max(...row.slice(0, r + 1)) || 1 : scale;
    for (let c = 0; c <= r; c += 1) {
      ctx.fillStyle = heatColor((row[c] || 0) / top);
      ctx.fillRect(c * cell, r * cell, cell, cell);
    }
  }
  if (split > 0 && split < n) {
    ctx.strokeStyle = cssVar('--kv-fg') || '#000';
    ctx.lineWidth = 2;
    ctx.beginPath();
    ctx.moveTo(0, split * cell);
    ctx.lineTo(side, split * cell);
    ctx.stroke();
  }
  if (active >= 0 && active < n) {
    ctx.strokeStyle = cssVar('--kv-focus') || '#06c';
    ctx.lineWidth = 2;
    ctx.strokeRect(0, active * cell, (active + 1) * cell, cell);
  }
  return { canvas, cell };
}

/** One query row's weights laid over the text: {caption, spans} (spans shaded by weight). */
export function weightsOverText(rows, labels, a) {
  if (a < 0 || !rows[a]) return { caption: 'Hover or focus a query row to see where that token looks.', spans: [] };
  const row = rows[a];
  const seen = row.slice(0, a + 1);
  const top = Math.max(...seen) || 1;
  const best = seen.indexOf(Math.max(...seen));
  const caption = `Query ${a} “${labels[a]}” attends most to ${best} “${labels[best]}” (${(row[best] * 100).toFixed(1)}%).`;
  const spans = labels.map((label, c) => {
    const w = row[c] || 0;
    const span = h('span', { class: c > a ? 'kva-future' : (c === a ? 'kva-q' : ''), title: `${label}: ${(w * 100).toFixed(1)}%` }, label);
    if (c <= a) {
      span.style.background = heatColor(w / top);
      span.style.color = heatTextColor(w / top);
    }
    return span;
  });
  return { caption, spans };
}

export const HEATMAP_CSS = `
kv-attention .kva-mask-bg { fill: var(--kv-bg-soft); }
kv-attention .kva-mask-line { stroke: var(--kv-border); stroke-width: 2; }
kv-attention .kva-missing { fill: none; stroke: var(--kv-border); stroke-dasharray: 2 2; }
kv-attention .kva-frame { fill: none; stroke: var(--kv-border); }
kv-attention .kva-split { stroke: var(--kv-fg); stroke-width: 2; }
kv-attention .kva-recomputed { fill: var(--kv-cached); }
kv-attention .kva-active { fill: none; stroke: var(--kv-focus); stroke-width: 3; }
kv-attention .kva-label { fill: var(--kv-fg); font-family: var(--kv-font-mono); }
kv-attention .kva-row { cursor: pointer; }
kv-attention .kva-row--on { font-weight: 700; fill: var(--kv-focus); }
kv-attention .kva-row:focus { outline: none; }
kv-attention .kva-row:focus-visible { outline: 2px solid var(--kv-focus); }
kv-attention .kva-canvas { display: block; cursor: pointer; }
`;
