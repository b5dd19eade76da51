// The allocator's panel when kvscope is attached to a vLLM server (`kvscope serve --attach`):
// which server, whether it answers, its own /metrics figures (engine.vllm.metrics), and
// its prefix-cache blocks by content — hash, the tokens as text, how often a request sent
// from these pages reused them. vLLM's KV events name blocks by hash only, so the places
// in the pool above are kvscope's drawing, not vLLM's physical block ids.

import { h } from './svg.js';
import { formatInt, formatSeconds } from '../../widget-base.js';

const MAX_ROWS = 16;

export class AttachedPanel {
  constructor() {
    this.statusEl = h('p', { class: 'kvw-note', 'data-attached-status': '', 'aria-live': 'polite' });
    this.figuresEl = h('dl', { class: 'kvw-figures', 'aria-label': 'vLLM metrics' });
    this.hintEl = h('p', { class: 'kvw-error', role: 'status' });
    this.rowsEl = h('tbody', {});
    this.table = h('table', { class: 'kvp-attached-blocks' },
      h('caption', {}, 'vLLM’s cached blocks, by content'),
      h('thead', {}, h('tr', {}, h('th', { scope: 'col' }, 'place'), h('th', { scope: 'col' }, 'hash'),
        h('th', { scope: 'col' }, 'hits'), h('th', { scope: 'col' }, 'held by'), h('th', { scope: 'col' }, 'tokens'))),
      this.rowsEl);
    this.moreEl = h('p', { class: 'kvw-note' });
    this.reportEl = h('p', { class: 'kvw-note', 'data-report-mode': '' });
    this.el = h('section', { class: 'kvw-panel', 'aria-label': 'Attached vLLM server', hidden: '' },
      h('h4', {}, 'Attached to vLLM'), this.statusEl, this.hintEl, this.figuresEl, this.reportEl);
    // below the pool: the blocks by content
    this.blocksEl = h('section', { class: 'kvp-attached', 'aria-label': 'vLLM’s cached blocks', hidden: '' }, this.table, this.moreEl,
      h('p', { class: 'kvw-note' }, 'vLLM names a cached block by a hash of its tokens and its parent’s hash; the place a block takes in the grid is the order vLLM stored it in, not its physical index. Reference counts and owners count only requests sent from these pages.'));
  }

  /** From `engine` events: the server, whether it answers, its metrics. */
  onEngine(event) {
    const v = event.vllm;
    if (!v) return;
    this.el.hidden = false;
    this.el.dataset.connected = String(v.connected);
    this.statusEl.textContent = v.connected
      ? `vLLM ${v.version} at ${v.url}, serving ${v.model}.`
      : `Disconnected: the vLLM server at ${v.url} is not answering. The page reconnects when it returns.`;
    // only the pools whose events do not come (vLLM without them, or a publisher that does
    // not answer); with several pools, each named
    const troubled = (v.pools || []).filter((p) => p.events === 'off' || p.events === 'silent');
    this.hintEl.textContent = v.pools
      ? troubled.map((p) => (v.pools.length > 1 ? `${p.name}: ${p.events_note}` : p.events_note)).join(' ')
      : (v.kv_events.startsWith('subscribed') ? '' : v.kv_events);
    this.hintEl.hidden = !this.hintEl.textContent;
    this.reportEl.dataset.reportMode = v.kv_cache_report_mode || 'incremental';
    this.reportEl.textContent = v.kv_cache_report_mode === 'full'
      ? 'Hits in the pool: requests sent from these pages ask vLLM to publish the blocks they reuse (kv_cache_report_mode “full”), and so do other clients’ requests that ask the same; vLLM publishes nothing for blocks reused by requests sent without it, so those hits count only in vLLM’s figures above.'
      : 'Hits in the pool: this vLLM does not publish the blocks a request reuses, so the pool counts only requests sent from these pages (from the cached tokens vLLM answers); other clients’ hits count only in vLLM’s figures above.';
    const m = v.metrics || {};
    const fig = (label, value, key) => h('div', {}, h('dt', {}, label), h('dd', { 'data-vllm': key }, value));
    const opt = (x, f) => (x === null || x === undefined ? '—' : f(x));
    this.figuresEl.replaceChildren(
      fig('Running / waiting', `${formatInt(m.running ?? 0)} / ${formatInt(m.waiting ?? 0)}`, 'queues'),
      fig('KV cache used', opt(m.kv_usage, (x) => `${(x * 100).toFixed(1)} %`), 'kv_usage'),
      fig('Prefix-cache hits (tokens)', opt(m.prefix_cache_hits, formatInt), 'prefix_cache_hits'),
      fig('… of tokens looked up', opt(m.prefix_cache_queries, formatInt), 'prefix_cache_queries'),
      fig('Hit rate', opt(m.prefix_cache_hit_rate, (x) => `${(x * 100).toFixed(1)} %`), 'hit_rate'),
      fig('TTFT (mean, last second)', opt(m.ttft_s, formatSeconds), 'ttft_s'),
      fig('Inter-token latency', opt(m.itl_s, formatSeconds), 'itl_s'),
      fig('Output tokens/s', opt(m.generation_tokens_per_s, (x) => x.toFixed(0)), 'tokens_per_s'),
      fig('Preemptions', opt(m.preemptions, formatInt), 'preemptions'),
    );
  }

  /** The pool's hashed blocks, most reused first. */
  renderBlocks(blocks) {
    const hashed = blocks.filter((b) => b.hash).sort((a, b) => (b.hits || 0) - (a.hits || 0) || a.id - b.id);
    this.rowsEl.replaceChildren(...hashed.slice(0, MAX_ROWS).map((b) => h('tr', { 'data-hash': b.hash, 'data-hits': String(b.hits || 0) },
      h('td', {}, String(b.id)), h('td', { class: 'kvp-mono' }, b.hash), h('td', {}, formatInt(b.hits || 0)),
      h('td', {}, b.owners.length ? b.owners.join(', ') : (b.ref ? String(b.ref) : 'free, cached')),
      h('td', { class: 'kvp-mono' }, b.text === null || b.text === undefined ? '…' : JSON.stringify(b.text)))));
    this.moreEl.textContent = hashed.length > MAX_ROWS ? `… and ${hashed.length - MAX_ROWS} more cached blocks (hover the grid to read any of them).` : '';
    this.blocksEl.hidden = hashed.length === 0;
  }
}

export const ATTACHED_CSS = `
kv-pages .kvp-attached-blocks { border-collapse: collapse; font-size: .82rem; margin: .4rem 0; width: 100%; }
kv-pages .kvp-attached-blocks caption { text-align: left; font-weight: 600; padding: .2rem 0; }
kv-pages .kvp-attached-blocks th, kv-pages .kvp-attached-blocks td { border-bottom: 1px solid var(--kv-border); padding: .15rem .4rem; text-align: left; vertical-align: top; }
kv-pages .kvp-mono { font-family: var(--kv-font-mono); white-space: pre-wrap; word-break: break-word; }
kv-pages [data-connected=false] [data-attached-status] { color: var(--kv-danger, #b00020); font-weight: 600; }
`;
