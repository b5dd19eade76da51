// The KV cache of one request as a grid: for every layer a K row and a V row, one column per
// token position. Filled cells are positions whose keys and values are stored; the columns
// added by the last step are outlined; logical blocks are marked along the top.

import { svg } from './svg.js';

const LEFT = 64;
const TOP = 58;

function shorten(label, max = 8) {
  return label.length > max ? `${label.slice(0, max - 1)}…` : label;
}

/**
 * layers: number of layers; capacity: columns drawn; filled: positions stored;
 * fresh: [from, to) positions the last step wrote; labels: per position; blockSize.
 */
export function drawCacheGrid({ layers, capacity, filled, fresh, labels, blockSize, width }) {
  const cols = Math.max(capacity, 1);
  const cell = Math.max(5, Math.min(26, Math.floor((Math.max(width, 320) - LEFT - 10) / cols)));
  const rowH = Math.max(5, Math.min(14, Math.floor(360 / Math.max(layers * 2, 1))));
  const gap = Math.max(2, Math.floor(rowH / 2));
  const W = LEFT + cols * cell + 8;
  const H = TOP + layers * (2 * rowH + gap) + 8;
  const root = svg('svg', {
    class: 'kvw-svg kvc-grid', width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: 'img',
    'aria-label': `KV cache: ${layers} layers, each with a K row and a V row; ${filled} of ${cols} positions stored`,
  });
  // Logical blocks along the top.
  const top = svg('g', { transform: `translate(${LEFT},0)` });
  for (let b = 0; b * blockSize < cols; b += 1) {
    const x = b * blockSize * cell;
    const w = Math.min(blockSize, cols - b * blockSize) * cell;
    top.append(svg('rect', { x, y: 2, width: w - 1, height: 12, class: 'kvc-block' }));
    if (w > 40) top.append(svg('text', { x: x + 3, y: 12, 'font-size': 10, class: 'kvw-soft' }, `block ${b}`));
  }
  const every = cell >= 12 ? 1 : Math.ceil(12 / cell);
  for (let p = 0; p < cols; p += every) {
    const x = p * cell + cell / 2;
    top.append(svg('text', {
      x, y: TOP - 4, transform: `rotate(-55 ${x} ${TOP - 4})`, 'font-size': Math.min(11, Math.max(cell, 8)),
      class: p < filled ? 'kvc-label' : 'kvc-label kvw-soft',
    }, labels[p] !== undefined ? shorten(labels[p]) : ''));
  }
  root.append(top);

  const grid = svg('g', { transform: `translate(${LEFT},${TOP})` });
  for (let l = 0; l < layers; l += 1) {
    const y0 = l * (2 * rowH + gap);
    grid.append(svg('text', { x: -18, y: y0 + rowH, 'text-anchor': 'end', 'dominant-baseline': 'central', 'font-size': Math.min(11, rowH + 3) }, `L${l}`));
    for (const [k, kind] of [[0, 'k'], [1, 'v']]) {
      const y = y0 + k * rowH;
      if (rowH >= 8) {
        grid.append(svg('text', { x: -4, y: y + rowH / 2, 'text-anchor': 'end', 'dominant-baseline': 'central', 'font-size': Math.min(9, rowH), class: 'kvw-soft' }, kind.toUpperCase()));
      }
      // Empty slots: one outlined strip; stored positions: one rect per position.
      grid.append(svg('rect', { x: 0, y, width: cols * cell, height: rowH - 1, class: 'kvc-empty' }));
      if (filled > 0) {
        grid.append(svg('rect', {
          x: 0, y, width: Math.min(filled, cols) * cell, height: rowH - 1, class: `kvc-${kind}`,
          'data-layer': l, 'data-kind': kind, 'data-filled': filled,
        }));
      }
    }
  }
  // Position separators (when cells are wide enough to see them) and block boundaries.
  const side = layers * (2 * rowH + gap) - gap;
  if (cell >= 8) {
    for (let p = 1; p < Math.min(filled, cols); p += 1) {
      grid.append(svg('line', { x1: p * cell, y1: 0, x2: p * cell, y2: side, class: 'kvc-sep' }));
    }
  }
  for (let b = blockSize; b < cols; b += blockSize) {
    grid.append(svg('line', { x1: b * cell, y1: -4, x2: b * cell, y2: side + 4, class: 'kvc-blockline' }));
  }
  if (fresh && fresh[1] > fresh[0]) {
    grid.append(svg('rect', {
      x: fresh[0] * cell - 1, y: -3, width: (fresh[1] - fresh[0]) * cell + 2, height: side + 6, class: 'kvc-fresh',
    }));
  }
  root.append(grid);
  root.append(svg('text', { x: 2, y: TOP - 4, 'font-size': 10, class: 'kvw-soft' }, 'position →'));
  return root;
}

export const CACHE_GRID_CSS = `
kv-cache-view .kvc-block { fill: var(--kv-bg-soft); stroke: var(--kv-border); }
kv-cache-view .kvc-empty { fill: none; stroke: var(--kv-border); stroke-dasharray: 2 2; }
kv-cache-view .kvc-k { fill: var(--kv-cat-1); }
kv-cache-view .kvc-v { fill: var(--kv-cat-2); }
kv-cache-view .kvc-sep { stroke: var(--kv-surface); stroke-width: 1; }
kv-cache-view .kvc-blockline { stroke: var(--kv-fg-soft); stroke-width: 1.5; stroke-dasharray: 4 3; }
kv-cache-view .kvc-fresh { fill: none; stroke: var(--kv-fg); stroke-width: 2.5; }
kv-cache-view .kvc-label { fill: var(--kv-fg); font-family: var(--kv-font-mono); }
`;
