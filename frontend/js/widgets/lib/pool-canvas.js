// The engine's block pool drawn on a canvas (a pool can hold thousands of blocks): one cell
// per block, coloured by owner, filled from the bottom in proportion to its used slots,
// hatched when free but still cached, outlined thick when shared (ref count > 1). A pool too
// large for legible cells is drawn a window at a time (`offset`, `count`): pool-density.js
// draws the whole of it.

import { cssVar, CATEGORICAL } from '../../widget-base.js';

export class PoolCanvas {
  constructor(canvas) {
    this.canvas = canvas;
    this.cols = 1;
    this.cell = 16;
    this.gap = 2;
    this.offset = 0;
    this.count = 0;
  }

  /** Cell size so the pool fits `width` and about `height` px (a pool card: less). */
  layout(numBlocks, width, height = 380) {
    const small = height < 380;
    const w = Math.max(width, small ? 120 : 280);
    let cell = Math.floor(Math.sqrt((w * height) / Math.max(numBlocks, 1)));
    cell = Math.max(small ? 3 : 6, Math.min(26, cell));
    this.gap = cell >= 12 ? 2 : 1;
    this.cell = cell;
    this.cols = Math.max(1, Math.floor((w + this.gap) / (cell + this.gap)));
    this.rows = Math.ceil(numBlocks / this.cols);
    return { width: this.cols * (cell + this.gap), height: this.rows * (cell + this.gap) };
  }

  /** The block id under a point, or -1. */
  blockAt(x, y) {
    const step = this.cell + this.gap;
    const col = Math.floor(x / step);
    const row = Math.floor(y / step);
    if (col < 0 || col >= this.cols || row < 0) return -1;
    const local = row * this.cols + col;
    return local < this.count ? this.offset + local : -1;
  }

  /**
   * blocks: [{id, ref, filled, hash, owners}]; colourOf(owner) → CSS colour; highlight: Set of
   * block ids to emphasise (others dimmed) or null; cursor: focused block id or -1;
   * logical: Map(block id → logical index) for the highlighted sequence; offset, count: the
   * run of blocks to draw (all of them by default).
   */
  draw({ blocks, blockSize, colourOf, highlight, cursor, logical, width, height, offset = 0, count = blocks.length }) {
    this.offset = offset;
    this.count = Math.max(0, Math.min(count, blocks.length - offset));
    const { width: W, height: H } = this.layout(this.count, width, height);
    const ratio = window.devicePixelRatio || 1;
    const c = this.canvas;
    c.width = Math.ceil(W * ratio);
    c.height = Math.ceil(H * ratio);
    c.style.width = `${W}px`;
    c.style.height = `${H}px`;
    const ctx = c.getContext('2d');
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    const free = cssVar('--kv-free') || '#e3e6ea';
    const cached = cssVar('--kv-cached') || '#009e73';
    const border = cssVar('--kv-border') || '#c9ced6';
    const fg = cssVar('--kv-fg') || '#1b1d21';
    const focus = cssVar('--kv-focus') || '#0a58a8';
    const bg = cssVar('--kv-surface') || '#fff';
    ctx.fillStyle = bg;
    ctx.fillRect(0, 0, W, H);
    const s = this.cell;
    const step = s + this.gap;
    ctx.font = `${Math.max(8, Math.floor(s * 0.55))}px ${cssVar('--kv-font-mono') || 'monospace'}`;
    ctx.textAlign = 'center';
    ctx.textBaseline = 'middle';
    for (let i = 0; i < this.count; i += 1) {
      const b = blocks[offset + i];
      const x = (i % this.cols) * step;
      const y = Math.floor(i / this.cols) * step;
      ctx.globalAlpha = highlight && !highlight.has(b.id) ? 0.25 : 1;
      ctx.fillStyle = free;
      ctx.fillRect(x, y, s, s);
      if (b.ref > 0) {
        const colour = colourOf(b.owners[0]);
        ctx.fillStyle = colour;
        ctx.globalAlpha *= 0.35;
        ctx.fillRect(x, y, s, s);            // reserved
        ctx.globalAlpha = highlight && !highlight.has(b.id) ? 0.25 : 1;
        const hFill = Math.round((s * Math.min(b.filled, blockSize)) / Math.max(blockSize, 1));
        ctx.fillRect(x, y + s - hFill, s, hFill);   // slots holding K/V
        if (b.ref > 1) {
          ctx.strokeStyle = fg;
          ctx.lineWidth = 2;
          ctx.strokeRect(x + 1, y + 1, s - 2, s - 2);
          if (s >= 14) {
            ctx.fillStyle = bg;
            ctx.fillRect(x + s / 2 - s * 0.3, y + s / 2 - s * 0.3, s * 0.6, s * 0.6);
            ctx.fillStyle = fg;
            ctx.fillText(String(b.ref), x + s / 2, y + s / 2 + 0.5);
          }
        }
      } else if (b.hash) {
        ctx.save();
        ctx.beginPath();
        ctx.rect(x, y, s, s);
        ctx.clip();
        ctx.strokeStyle = cached;
        ctx.lineWidth = 1.5;
        for (let k = -s; k < s; k += 4) {
          ctx.beginPath();
          ctx.moveTo(x + k, y + s);
          ctx.lineTo(x + k + s, y);
          ctx.stroke();
        }
        ctx.restore();
      } else {
        ctx.strokeStyle = border;
        ctx.lineWidth = 1;
        ctx.strokeRect(x + 0.5, y + 0.5, s - 1, s - 1);
      }
      if (logical && logical.has(b.id) && s >= 14 && b.ref <= 1) {
        ctx.fillStyle = fg;
        ctx.globalAlpha = 1;
        ctx.fillText(String(logical.get(b.id)), x + s / 2, y + s / 2 + 0.5);
      }
    }
    ctx.globalAlpha = 1;
    if (cursor >= offset && cursor < offset + this.count) {
      const x = ((cursor - offset) % this.cols) * step;
      const y = Math.floor((cursor - offset) / this.cols) * step;
      ctx.strokeStyle = focus;
      ctx.lineWidth = 3;
      ctx.strokeRect(x - 1, y - 1, s + 2, s + 2);
    }
  }
}

/** Owner → colour (theme categorical colours resolved for canvas), stable per owner. */
export class OwnerPalette {
  constructor() { this.map = new Map(); this.next = 0; }

  index(owner) {
    if (!this.map.has(owner)) { this.map.set(owner, this.next % CATEGORICAL.length); this.next += 1; }
    return this.map.get(owner);
  }

  cssColour(owner) { return CATEGORICAL[this.index(owner)]; }

  resolved(owner) { return cssVar(this.cssColour(owner)); }
}
