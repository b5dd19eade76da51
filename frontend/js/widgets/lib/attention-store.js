// The attention a widget has received for one request: per layer, per query position, the
// mean over heads and each head's row of weights (as the `attention` events carry them, one
// event a step with every layer it watches: weights[layer][head][row], mean[layer][row]).

export class AttentionStore {
  constructor() { this.clear(); }

  clear() {
    this.layers = new Map();     // layer -> Map(position -> {mean, heads: Map(head -> row)})
    this.headsSeen = new Set();
    this.numHeads = 0;
  }

  add(e) {
    this.numHeads = e.num_heads;
    e.layers.forEach((layer, l) => {
      if (!this.layers.has(layer)) this.layers.set(layer, new Map());
      const rows = this.layers.get(layer);
      e.query_positions.forEach((pos, r) => {
        const heads = new Map();
        e.heads.forEach((hd, k) => { heads.set(hd, e.weights[l][k][r]); this.headsSeen.add(hd); });
        const old = rows.get(pos);
        if (old) for (const [hd, row] of old.heads) if (!heads.has(hd)) heads.set(hd, row);
        rows.set(pos, { mean: e.mean[l][r], heads });
      });
    });
  }

  /** Rows (query positions) known: one past the largest position received. */
  get size() {
    let n = 0;
    for (const rows of this.layers.values()) for (const pos of rows.keys()) n = Math.max(n, pos + 1);
    return n;
  }

  /** The n×n matrix of a layer and head ('mean' or an index): zeros above the diagonal, null for rows missing. */
  matrix(layer, head) {
    const n = this.size;
    const rows = this.layers.get(layer) || new Map();
    return Array.from({ length: n }, (_, pos) => {
      const entry = rows.get(pos);
      if (!entry) return null;
      const src = head === 'mean' ? entry.mean : entry.heads.get(Number(head));
      if (!src) return null;
      return Array.from({ length: n }, (_, c) => (c <= pos ? src[c] || 0 : 0));
    });
  }

  summary() {
    const out = {};
    for (const [layer, rows] of this.layers) {
      out[layer] = {
        rows: [...rows.keys()].sort((x, y) => x - y),
        heads: [...new Set([...rows.values()].flatMap((r) => [...r.heads.keys()]))].sort((x, y) => x - y),
      };
    }
    return out;
  }
}
