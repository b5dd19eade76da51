// The engine's block pool as a widget sees it: a `kv` snapshot, then deltas applied in order.

export class KvPool {
  constructor() { this.reset(); }

  reset() {
    this.ready = false;
    this.step = 0;
    this.blockSize = 0;
    this.blocks = [];            // index = block id: {id, ref, filled, hash, owners}
    this.tables = new Map();     // request id -> [physical block ids]
    this.totals = { num_free: 0, num_cached: 0, prefix_hits: 0, evictions: 0 };
    this.lastEvents = [];
  }

  /** Apply a `kv` event; returns false if a delta arrived before any snapshot. */
  apply(ev) {
    if (ev.kind === 'snapshot') {
      this.reset();
      this.ready = true;
      this.blockSize = ev.block_size;
      this.blocks = ev.blocks.map((b) => ({ ...b }));
      for (let i = this.blocks.length; i < ev.num_blocks; i += 1) {
        this.blocks.push({ id: i, ref: 0, filled: 0, hash: null, owners: [] });
      }
      for (const [rid, t] of Object.entries(ev.tables || {})) this.tables.set(rid, [...t]);
    } else {
      if (!this.ready) return false;
      for (const b of ev.blocks || []) this.blocks[b.id] = { ...b };
      for (const [rid, t] of Object.entries(ev.tables || {})) this.tables.set(rid, [...t]);
      for (const rid of ev.removed_tables || []) this.tables.delete(rid);
      this.lastEvents = ev.events || [];
    }
    this.step = ev.step;
    for (const k of Object.keys(this.totals)) if (k in ev) this.totals[k] = ev[k];
    return true;
  }

  get numBlocks() { return this.blocks.length; }

  /** Classify a block for drawing. */
  static state(b) {
    if (b.ref > 0) return b.ref > 1 ? 'shared' : 'used';
    return b.hash ? 'cached' : 'free';
  }

  counts() {
    const c = { used: 0, shared: 0, cached: 0, free: 0 };
    for (const b of this.blocks) c[KvPool.state(b)] += 1;
    return c;
  }

  toJSON() {
    return {
      step: this.step,
      block_size: this.blockSize,
      num_blocks: this.blocks.length,
      blocks: this.blocks,
      tables: Object.fromEntries(this.tables),
      ...this.totals,
    };
  }
}
