// A large block pool (a GPU server holds 10^5 blocks and more) as one strip: the pool cut
// into as many runs of consecutive blocks as the strip has columns, each column filled from
// the bottom with the share of its blocks in use, then the share free but cached; the rest
// is free. Bars above and below the strip, and a tint over it, mark the run of blocks the
// detail view draws cell by cell (never a line over a column: one block must stay visible).

import { cssVar } from '../../widget-base.js';

export const STRIP_HEIGHT = 48;
const MARK = 5;   // px of the window's bars above and below the strip

export class DensityStrip {
  constructor(canvas) {
    this.canvas = canvas;
    this.columns = 1;
    this.perColumn = 1;
  }

  /** Counts per column: [{used, cached}] over runs of `perColumn` blocks. */
  static bucket(blocks, columns) {
    const perColumn = Math.max(1, Math.ceil(blocks.length / Math.max(columns, 1)));
    const out = [];
    for (let start = 0; start < blocks.length; start += perColumn) {
      let used = 0;
      let cached = 0;
      const end = Math.min(blocks.length, start + perColumn);
      for (let i = start; i < end; i += 1) {
        const b = blocks[i];
        if (b.ref > 0) used += 1;
        else if (b.hash) cached += 1;
      }
      out.push({ start, count: end - start, used, cached });
    }
    return { perColumn, buckets: out };
  }

  /** The block a point on the strip stands for (the first of its column's run). */
  blockAt(x) {
    const col = Math.max(0, Math.min(this.columns - 1, Math.floor(x / this.colWidth)));
    return col * this.perColumn;
  }

  draw({ blocks, width, windowStart, windowSize }) {
    const W = Math.max(280, Math.floor(width));
    const columns = Math.min(blocks.length, Math.floor(W / 3));   // at least 3 px a column
    const { perColumn, buckets } = DensityStrip.bucket(blocks, columns);
    this.columns = buckets.length;
    this.perColumn = perColumn;
    this.colWidth = W / this.columns;
    const ratio = window.devicePixelRatio || 1;
    const c = this.canvas;
    c.width = Math.ceil(W * ratio);
    c.height = Math.ceil(STRIP_HEIGHT * ratio);
    c.style.width = `${W}px`;
    c.style.height = `${STRIP_HEIGHT}px`;
    const ctx = c.getContext('2d');
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    const H = STRIP_HEIGHT - 2 * MARK - 2;   // room for the window's bars
    const top = MARK + 1;
    ctx.fillStyle = cssVar('--kv-surface') || '#fff';
    ctx.fillRect(0, 0, W, STRIP_HEIGHT);
    ctx.fillStyle = cssVar('--kv-free') || '#e3e6ea';
    ctx.fillRect(0, top, W, H);
    const used = cssVar('--kv-used') || '#0072b2';
    const cached = cssVar('--kv-cached') || '#009e73';
    for (const [i, b] of buckets.entries()) {
      const x = i * this.colWidth;
      // a run with any block in use or cached shows at least 2 px: one block of 10^5 stays visible
      const hUsed = b.used ? Math.max(2, (H * b.used) / b.count) : 0;
      const hCached = b.cached ? Math.max(2, (H * b.cached) / b.count) : 0;
      ctx.fillStyle = used;
      ctx.fillRect(x, top + H - hUsed, Math.ceil(this.colWidth), hUsed);
      ctx.fillStyle = cached;
      ctx.fillRect(x, top + H - hUsed - hCached, Math.ceil(this.colWidth), hCached);
    }
    const x0 = (windowStart / perColumn) * this.colWidth;
    const x1 = Math.max(x0 + 3, Math.min(W, ((windowStart + windowSize) / perColumn) * this.colWidth));
    const focus = cssVar('--kv-focus') || '#0a58a8';
    ctx.fillStyle = focus;
    ctx.fillRect(x0, 0, x1 - x0, MARK);
    ctx.fillRect(x0, STRIP_HEIGHT - MARK, x1 - x0, MARK);
    ctx.globalAlpha = 0.12;
    ctx.fillRect(x0, top, x1 - x0, H);
    ctx.globalAlpha = 1;
    return { perColumn, buckets };
  }
}
