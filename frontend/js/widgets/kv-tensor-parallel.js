// <kv-tensor-parallel>: how the live model's weights and KV cache split over N ranks under
// tensor parallelism, the way kvscope's engine splits them (layers/parallel.py): q/k/v and
// gate/up cut by output features (column-parallel), o and down by input features
// (row-parallel, then an all-reduce), embedding and LM head by vocabulary, KV heads by rank.
// Per rank: bytes of weights and of KV cache per token; per token: bytes all-reduced. When the
// server itself runs with --tensor-parallel-size N, the figures it measured are shown beside.

import { KvWidget, formatBytes, formatInt } from '../widget-base.js';
import { h, svg } from './lib/svg.js';
import { injectStyle } from './lib/style.js';
import { modeBadge, showMode } from './lib/controls.js';

const RANK_COLORS = ['var(--kv-cat-1)', 'var(--kv-cat-2)', 'var(--kv-cat-3)', 'var(--kv-cat-4)',
  'var(--kv-cat-5)', 'var(--kv-cat-6)', 'var(--kv-cat-7)', 'var(--kv-cat-8)'];
const ROW_H = 16;
const PITCH = ROW_H + 20;
const LABEL_W = 110;
const BAR_W = 300;

const STYLE = `
kv-tensor-parallel .kvt-cut { fill: var(--kv-fg-soft); font-size: 11px; }
kv-tensor-parallel .kvt-edge { stroke: var(--kv-surface, #fff); stroke-width: 1.5; }
`;

/** The matrices of one layer (and the ends of the model) and how each is cut. */
export function splitPlan(m) {
  const b = m.dtype_bytes;
  const qkv = (m.num_heads + 2 * m.num_kv_heads) * m.head_dim;
  return [
    { name: 'embedding', shape: [m.vocab_size, m.hidden_size], cut: 'cut by vocabulary rows', bytes: m.vocab_size * m.hidden_size * b, per: 'model' },
    { name: 'qkv_proj', shape: [qkv, m.hidden_size], cut: 'cut by output features: each rank its own heads', bytes: qkv * m.hidden_size * b, per: 'layer' },
    { name: 'o_proj', shape: [m.hidden_size, m.num_heads * m.head_dim], cut: 'cut by input features, partial sums all-reduced', bytes: m.hidden_size * m.num_heads * m.head_dim * b, per: 'layer', reduce: true },
    { name: 'gate_up_proj', shape: [2 * m.intermediate_size, m.hidden_size], cut: 'cut by output features', bytes: 2 * m.intermediate_size * m.hidden_size * b, per: 'layer' },
    { name: 'down_proj', shape: [m.hidden_size, m.intermediate_size], cut: 'cut by input features, partial sums all-reduced', bytes: m.hidden_size * m.intermediate_size * b, per: 'layer', reduce: true },
    { name: 'lm_head', shape: [m.vocab_size, m.hidden_size], cut: m.tie_word_embeddings ? 'the embedding matrix itself (tied), logits gathered' : 'cut by vocabulary rows, logits gathered', bytes: m.tie_word_embeddings ? 0 : m.vocab_size * m.hidden_size * b, per: 'model' },
    { name: 'KV cache', shape: [m.num_kv_heads, m.head_dim], cut: 'cut by KV heads', bytes: m.kv_bytes_per_token, per: 'token' },
  ];
}

/** Bytes rank 0 sends per token computed: the embedding's all-reduce, two per layer, and
 *  its share of the logits gathered to every rank (for a token that samples). */
export function commBytesPerToken(m, n) {
  if (n <= 1) return 0;
  const b = m.dtype_bytes;
  return m.hidden_size * b * (1 + 2 * m.num_layers) + Math.ceil(m.vocab_size / n) * (n - 1) * b;
}

class KvTensorParallel extends KvWidget {
  static events = ['step'];
  static requires = ['steps'];
  static label = 'Tensor parallelism: who holds what';

  setup() {
    injectStyle('kv-tensor-parallel', STYLE);
    const uid = this.getAttribute('aria-labelledby');
    this.ranksEl = h('select', { class: 'kvw-select', id: `${uid}-ranks`, onchange: () => this.requestRender() });
    this.modeBadge = modeBadge();
    this.noteEl = h('p', { class: 'kvw-note' });
    this.figuresEl = h('dl', { class: 'kvw-figures', 'aria-label': 'Per-rank figures' });
    this.chartEl = h('div', { class: 'kvw-scroll' });
    this.measuredEl = h('p', { class: 'kvw-note', 'data-measured': '' });
    this.body.append(
      h('div', { class: 'kvw-row' }, h('label', { for: this.ranksEl.id }, 'Ranks (N)'), this.ranksEl, this.modeBadge),
      this.noteEl, this.figuresEl, this.chartEl, this.measuredEl,
    );
    this.steps = [];
  }

  connectedCallback() {
    super.connectedCallback();
    this.onModeChange(this.client.mode);
  }

  onModeChange(mode) {
    showMode(this.modeBadge, mode);
  }

  onEvent(event) {
    if (event.type === 'hello') this.fillRanks();
    if (event.type === 'step' && event.allreduce_bytes !== undefined) {
      this.steps.push({ step: event.step, tokens: event.num_batched_tokens, bytes: event.allreduce_bytes });
      if (this.steps.length > 200) this.steps.shift();
    }
    this.requestRender();
  }

  get model() { return this.client.hello ? this.client.hello.model : null; }
  get serverRanks() { return this.client.hello && this.client.hello.engine ? this.client.hello.engine.tensor_parallel_size || 1 : 1; }

  /** N that divide both head counts (the engine refuses the others). */
  fillRanks() {
    const m = this.model;
    if (!m) return;
    const valid = [1, 2, 4, 8].filter((n) => m.num_heads % n === 0 && m.num_kv_heads % n === 0);
    const current = Number(this.ranksEl.value) || (this.serverRanks > 1 ? this.serverRanks : Math.min(2, valid[valid.length - 1]));
    this.ranksEl.replaceChildren(...valid.map((n) => h('option', { value: n }, String(n))));
    this.ranksEl.value = String(valid.includes(current) ? current : valid[0]);
  }

  figures() {
    const m = this.model;
    if (!m) return null;
    const n = Number(this.ranksEl.value) || 1;
    const plan = splitPlan(m);
    const layerBytes = plan.filter((p) => p.per === 'layer').reduce((s, p) => s + p.bytes, 0);
    const endBytes = plan.filter((p) => p.per === 'model').reduce((s, p) => s + p.bytes, 0);
    const split = (layerBytes * m.num_layers + endBytes) / n;
    const normBytes = Math.max(0, m.weight_bytes - layerBytes * m.num_layers - endBytes);   // norms: every rank keeps all
    return {
      ranks: n, weight_bytes: m.weight_bytes, rank_weight_bytes: Math.round(split + normBytes),
      kv_bytes_per_token: m.kv_bytes_per_token, rank_kv_bytes_per_token: m.kv_bytes_per_token / n,
      heads_per_rank: m.num_heads / n, kv_heads_per_rank: m.num_kv_heads / n,
      allreduce_bytes_per_token: commBytesPerToken(m, n), allreduces_per_step: n > 1 ? 1 + 2 * m.num_layers : 0,
    };
  }

  measured() {
    const hello = this.client.hello;
    if (!hello || this.serverRanks <= 1) return null;
    const tokens = this.steps.reduce((s, x) => s + x.tokens, 0);
    const bytes = this.steps.reduce((s, x) => s + x.bytes, 0);
    return { ranks: this.serverRanks, rank_weight_bytes: hello.engine.rank_weight_bytes, rank_kv_cache_bytes: hello.engine.kv_cache_bytes,
      steps: this.steps.length, allreduce_bytes_per_token: tokens ? bytes / tokens : null };
  }

  render() {
    const m = this.model;
    if (!m) {
      this.noteEl.textContent = 'Waiting for the model’s configuration…';
      return;
    }
    if (!this.ranksEl.options.length) this.fillRanks();
    const f = this.figures();
    this.noteEl.textContent = `${m.name}: ${m.num_layers} layers, ${m.num_heads} query heads and ${m.num_kv_heads} KV heads, `
      + `so N must divide ${m.num_kv_heads}. Each colour is one rank.`;
    const fig = (label, value, key) => h('div', {}, h('dt', {}, label), h('dd', { 'data-figure': key }, value));
    this.figuresEl.replaceChildren(
      fig('Weights per rank', `${formatBytes(f.rank_weight_bytes)} of ${formatBytes(f.weight_bytes)}`, 'rank_weight_bytes'),
      fig('Heads per rank', `${f.heads_per_rank} query, ${f.kv_heads_per_rank} KV`, 'heads_per_rank'),
      fig('KV cache per token per rank', formatBytes(f.rank_kv_bytes_per_token), 'rank_kv_bytes_per_token'),
      fig('Sent per token computed', formatBytes(f.allreduce_bytes_per_token), 'allreduce_bytes_per_token'),
      fig('Collectives per step', formatInt(f.allreduces_per_step + (f.ranks > 1 ? 1 : 0)), 'collectives'),
    );
    this.chartEl.replaceChildren(this.chart(m, f.ranks));
    this.setLegend(RANK_COLORS.slice(0, f.ranks).map((color, i) => ({ label: `rank ${i}`, color }))
      .concat([{ label: 'a bar marked ⊕: partial results summed by an all-reduce', color: 'var(--kv-fg)', shape: 'line' }]));
    const meas = this.measured();
    this.measuredEl.textContent = meas
      ? `Measured on this server (${meas.ranks} ranks): rank 0 holds ${formatBytes(meas.rank_weight_bytes)} of weights and a `
        + `${formatBytes(meas.rank_kv_cache_bytes)} KV cache; ${meas.allreduce_bytes_per_token === null ? 'no step yet'
          : `${formatBytes(meas.allreduce_bytes_per_token)} sent per token over the last ${meas.steps} steps`}.`
      : 'This server runs the model in one process; start it with --tensor-parallel-size 2 to see its own per-rank figures here.';
  }

  chart(m, n) {
    const plan = splitPlan(m);
    const height = plan.length * PITCH + 4;
    const width = LABEL_W + BAR_W + 110;   // room for the longest description under a bar
    const root = svg('svg', { class: 'kvw-svg', width, height, viewBox: `0 0 ${width} ${height}`, role: 'img',
      'aria-label': `How ${plan.length} parts of the model split over ${n} ranks` });
    plan.forEach((p, i) => {
      const y = 4 + i * PITCH;
      root.append(svg('text', { x: 0, y: y + 12, 'font-size': 12 }, `${p.name}${p.reduce ? ' ⊕' : ''}`));
      root.append(svg('text', { x: LABEL_W, y: y + ROW_H + 13, class: 'kvt-cut' }, `${p.shape.join(' × ')}: ${p.cut}`));
      const columns = p.cut.startsWith('cut by input');   // row-parallel: cut along the input (horizontal) axis
      for (let r = 0; r < n; r += 1) {
        const attrs = columns
          ? { x: LABEL_W + (r * BAR_W) / n, y, width: BAR_W / n, height: ROW_H }
          : { x: LABEL_W, y: y + (r * ROW_H) / n, width: BAR_W, height: ROW_H / n };
        root.append(svg('rect', { ...attrs, fill: p.bytes || p.per === 'token' ? RANK_COLORS[r] : 'none', class: 'kvt-edge' },
          svg('title', {}, `rank ${r}: ${p.name} ${columns ? 'input columns' : 'rows'} ${r + 1} of ${n}`)));
      }
    });
    return root;
  }

  exportData() {
    return { figures: this.figures(), measured: this.measured(), plan: this.model ? splitPlan(this.model) : [] };
  }
}

customElements.define('kv-tensor-parallel', KvTensorParallel);
