// <kv-hash-chain>: chapter 16's prefix hash chain. One prompt, tokenized by the engine's own
// tokenizer, cut to the length the learner picks; its blocks drawn as a chain, each full
// block with what its hash is made of (the parent's hash, its tokens, its extra keys: the
// `cache_salt` on the first block only) and the hash the engine gave it (from `kv` events).
// Two rules decide how much of the prompt a later identical request can take from the
// cache: only full blocks are hashed, and at least one token is always computed (it yields
// the next token's logits). So with blocks of 16, 31 and 32 tokens share one block and 33
// share two. The learner's button sends the prompt twice under its salt and shows what the
// engine's second request really found (`num_cached_tokens`); the recording did so for 31,
// 32 and 33 tokens under one salt, and for 33 under another.

import { KvWidget, formatInt } from '../widget-base.js';
import { h } from './lib/svg.js';
import { injectStyle } from './lib/style.js';
import { namedRecordingEvents } from './lib/recording.js';
import { runBusy } from './lib/busy.js';
import { controlRow, modeBadge, showMode } from './lib/controls.js';

const RECORDING = 'hash-chain';
// The recording's prompt and salts (scripts/make_recordings.py, CHAIN_PROMPT and CHAIN_SALTS).
const PROMPT = 'A lighthouse stood at the end of a long stone pier. Every night its keeper climbed the '
  + 'winding stairs, wiped the salt from the glass, and lit the lamp for the boats coming home.';
const RECORDED_SALTS = ['tenant-A', 'tenant-B'];
const PARAMS = { temperature: 0, max_tokens: 4, ignore_eos: true };   // as the recording's

const STYLE = `
kv-hash-chain .khc-chain { display: flex; flex-wrap: wrap; gap: .4rem; align-items: stretch; margin: .5rem 0; padding: 0; list-style: none; }
kv-hash-chain .khc-block { flex: 1 1 11rem; max-width: 15rem; border: 2px solid var(--kv-border); border-radius: var(--kv-radius, 6px);
  padding: .4rem .5rem; font-size: .85rem; background: var(--kv-surface); position: relative; }
kv-hash-chain .khc-block[data-state=shared] { border-color: var(--kv-shared); }
kv-hash-chain .khc-block[data-state=recomputed] { border-color: var(--kv-prefill); }
kv-hash-chain .khc-block[data-state=partial] { border-style: dashed; }
kv-hash-chain .khc-block h4 { margin: 0 0 .2rem; font-size: .9rem; }
kv-hash-chain .khc-text { font-family: var(--kv-font-mono); font-size: .78rem; color: var(--kv-fg-soft); overflow-wrap: anywhere; margin: .2rem 0; }
kv-hash-chain .khc-hash { font-family: var(--kv-font-mono); font-weight: 600; }
kv-hash-chain .khc-formula { font-family: var(--kv-font-mono); font-size: .76rem; overflow-wrap: anywhere; }
kv-hash-chain .khc-badge { display: inline-block; margin-top: .25rem; padding: 0 .35rem; border-radius: 3px; font-size: .78rem; background: var(--kv-bg-soft); }
kv-hash-chain .khc-block[data-state=shared] .khc-badge { background: var(--kv-shared); color: #fff; }
kv-hash-chain .khc-block[data-state=recomputed] .khc-badge { background: var(--kv-prefill); color: #fff; }
kv-hash-chain .khc-link { align-self: center; font-size: 1.2rem; color: var(--kv-fg-soft); }
kv-hash-chain input[type=range] { width: min(22rem, 100%); }
kv-hash-chain input:focus-visible, kv-hash-chain button:focus-visible { outline: 3px solid var(--kv-focus); outline-offset: 2px; }
kv-hash-chain .khc-verdict { font-size: .95rem; margin: .3rem 0; }
`;

const plural = (n, one, many = `${one}s`) => `${formatInt(n)} ${n === 1 ? one : many}`;
const saltKeys = (salt) => (salt ? `("${salt}",)` : '()');

/** The requests of an event stream, each with its prompt, the engine's hash of each of its
 *  blocks (as `kv` events showed them) and the tokens it found in the cache. */
class ChainRuns {
  constructor() {
    this.requests = new Map();   // rid -> { ids, hashes: [], cached: null, salt }
    this.blockHash = new Map();  // physical block id -> short hash
  }

  apply(event) {
    if (event.type === 'request.added' && event.prompt_token_ids) {
      this.requests.set(event.request_id, { rid: event.request_id, ids: event.prompt_token_ids, hashes: [], cached: null, salt: null });
    } else if (event.type === 'kv') {
      if (event.kind === 'snapshot') this.blockHash.clear();
      for (const b of event.blocks || []) this.blockHash.set(b.id, b.hash);
      for (const [rid, table] of Object.entries(event.tables || {})) {
        const r = this.requests.get(rid);
        if (!r) continue;
        const full = Math.floor(r.ids.length / this.blockSize(event));
        table.slice(0, full).forEach((id, i) => { r.hashes[i] = r.hashes[i] || this.blockHash.get(id) || null; });
      }
    } else if (event.type === 'request.finished') {
      const r = this.requests.get(event.request_id);
      if (r) r.cached = event.num_cached_tokens;
    }
  }

  blockSize(event) {
    if (event.block_size) this.size = event.block_size;
    return this.size || 16;
  }

  finished() { return [...this.requests.values()].filter((r) => r.cached !== null); }

  /** Salts of a recording, which does not carry them: requests whose first block hashed
   *  differently over the same tokens ran under different salts, named in order of first use. */
  nameSalts(names) {
    const seen = [];
    for (const r of this.finished()) {
      const key = `${r.ids.slice(0, this.size).join(',')}|${r.hashes[0]}`;
      if (!r.hashes[0]) continue;
      if (!seen.includes(key)) seen.push(key);
      r.salt = names[seen.indexOf(key)] ?? `salt ${seen.indexOf(key) + 1}`;
    }
  }
}

class KvHashChain extends KvWidget {
  static events = ['kv', 'request'];
  static requires = ['requests', 'tokenize', 'kv'];
  static label = 'The prefix hash chain';

  setup() {
    injectStyle('kv-hash-chain', STYLE);
    this.blockSize = 16;
    this.recorded = new ChainRuns();
    this.live = new ChainRuns();
    this.tokens = null;       // [{id, text}] of the prompt
    this.mine = new Set();
    const uid = this.getAttribute('aria-labelledby');
    this.slider = h('input', { type: 'range', id: `${uid}-len`, min: 1, max: 49, value: 33, step: 1,
      'aria-describedby': `${uid}-figures`, oninput: () => this.requestRender() });
    this.lengthOut = h('output', { for: this.slider.id });
    this.saltInput = h('input', { type: 'text', class: 'kvw-input', id: `${uid}-salt`, value: RECORDED_SALTS[0], maxlength: 64,
      spellcheck: 'false', oninput: () => this.requestRender() });
    this.presets = controlRow('Prompt lengths around two blocks');
    this.sendButton = h('button', { type: 'button', class: 'kvw-btn kvw-btn--primary', onclick: () => this.sendTwice() },
      'Send it twice to the engine');
    this.modeBadge = modeBadge();
    this.errorEl = h('p', { class: 'kvw-error', role: 'alert' });
    this.figures = h('dl', { class: 'kvw-figures', id: `${uid}-figures` });
    this.verdictEl = h('p', { class: 'khc-verdict', 'data-verdict': '' });
    this.chain = h('ol', { class: 'khc-chain', 'aria-label': 'The prompt’s blocks, each hashed after the one before it' });
    this.body.append(
      h('div', { class: 'kvw-row' }, h('label', { for: this.slider.id }, 'Prompt length'), this.slider, this.lengthOut),
      this.presets,
      h('div', { class: 'kvw-row' }, h('label', { for: this.saltInput.id }, 'cache_salt'), this.saltInput, this.sendButton, this.modeBadge),
      this.errorEl, this.figures, this.verdictEl, this.chain);
    this.setLegend([
      { label: 'reused from the cache by an identical later request', color: 'var(--kv-shared)' },
      { label: 'full and hashed, but computed again (the last prompt token must be computed)', color: 'var(--kv-prefill)' },
      { label: 'partly filled: not hashed, never shared (dashed)', color: 'var(--kv-border)' },
    ]);
    this.updateMode(this.client.mode);
    namedRecordingEvents(RECORDING).then((events) => {
      for (const e of events) {
        if (e.type === 'hello') this.setBlockSize(e.engine.block_size);
        if (e.type === 'tokens' && !this.tokens) this.tokens = e.tokens.map((t) => ({ id: t.id, text: t.text }));
        this.recorded.apply(e);
      }
      this.recorded.nameSalts(RECORDED_SALTS);
      this.dataset.recordedRuns = String(this.recorded.finished().length);
      this.fitSlider();
      this.requestRender();
    });
  }

  setBlockSize(size) {
    if (!size || size === this.blockSize && this.presets.childElementCount) return;
    this.blockSize = size;
    this.recorded.size = this.live.size = size;
    const lengths = [2 * size - 1, 2 * size, 2 * size + 1];
    this.presets.replaceChildren(h('span', { class: 'kvw-note' }, 'Try:'), ...lengths.map((n) => h('button', {
      type: 'button', class: 'kvw-btn', 'data-length': n, onclick: () => { this.slider.value = String(n); this.requestRender(); },
    }, `${n} tokens`)));
    this.fitSlider();
  }

  fitSlider() {
    const most = this.tokens ? this.tokens.length : 3 * this.blockSize + 1;
    this.slider.max = String(Math.min(most, 3 * this.blockSize + 1));
  }

  onModeChange(mode) { this.updateMode(mode); }

  updateMode(mode) {
    showMode(this.modeBadge, mode);
    this.sendButton.disabled = mode !== 'live';
    this.sendButton.title = mode === 'live' ? '' : 'Needs the live engine; the recorded runs are shown.';
  }

  onEvent(event) {
    if (event.type === 'hello' && event.engine) this.setBlockSize(event.engine.block_size);
    if (this.client.mode !== 'live') return;
    // its own requests only (their ack may come after their `request.added`)
    const session = this.client.session;
    if (event.type === 'request.added' && !(session && event.owner === session.client_id)) return;
    this.live.apply(event);
    if (event.type === 'request.finished' && this.mine.has(event.request_id)) this.requestRender();
  }

  // -- the learner's run --------------------------------------------------------------------
  async promptTokens() {
    if (this.liveTokens) return this.liveTokens;
    const reply = await this.client.command('tokenize', { text: PROMPT });
    this.liveTokens = reply.tokens.map((t) => ({ id: t.id, text: t.text }));
    this.tokens = this.liveTokens;
    this.fitSlider();
    return this.liveTokens;
  }

  sendTwice() {
    return runBusy(this, this.sendButton, this.errorEl, async () => {
      const tokens = await this.promptTokens();
      const n = Number(this.slider.value);
      const salt = this.saltInput.value.trim();
      for (let i = 0; i < 2; i += 1) {
        const done = this.finishedPromise();
        const fields = { prompt_token_ids: tokens.slice(0, n).map((t) => t.id), params: PARAMS };
        if (salt) fields.cache_salt = salt;
        const ack = await this.submitWithin(fields);
        this.mine.add(ack.request_id);
        if (!this.live.requests.has(ack.request_id)) this.live.apply({ type: 'request.added', request_id: ack.request_id, prompt_token_ids: fields.prompt_token_ids });
        this.live.requests.get(ack.request_id).salt = salt;
        await done(ack.request_id);
      }
      this.dataset.liveRuns = String(this.live.finished().length / 2);
      this.requestRender();
      const run = this.runFor(n, salt);
      if (run) this.announce(this.verdict(n, run));
    });
  }

  /** Submit; when the per-learner limit says to wait a few seconds, wait and submit again. */
  async submitWithin(fields) {
    for (;;) {
      try {
        return await this.client.command('submit', fields);
      } catch (error) {
        const wait = error.code === 'rate_limited' && /in (\d+) s/.exec(error.message);
        if (!wait || Number(wait[1]) > 30) throw error;
        this.announce(`The engine allows a learner a few prompts at a time; sending again in ${wait[1]} s.`);
        await new Promise((resolve) => { setTimeout(resolve, 1000 * Number(wait[1])); });
      }
    }
  }

  /** A function that waits for the finish of a request id given later (it may come first). */
  finishedPromise() {
    const seen = new Set();
    let want = null;
    let resolve;
    const promise = new Promise((r) => { resolve = r; });
    const off = this.client.on('request.finished', (e) => {
      seen.add(e.request_id);
      if (e.request_id === want) resolve();
    });
    return async (rid) => {
      want = rid;
      if (seen.has(rid)) resolve();
      await promise;
      off();
    };
  }

  // -- what is shown --------------------------------------------------------------------------
  /** The latest pair (first, second) of identical prompts of n tokens under `salt`, live first. */
  runFor(n, salt) {
    for (const runs of [this.live, this.recorded]) {
      const done = runs.finished().filter((r) => r.ids.length === n && (r.salt || '') === salt);
      if (done.length >= 2) return { first: done[done.length - 2], second: done[done.length - 1], live: runs === this.live };
    }
    return null;
  }

  /** The engine's hash of block i under `salt`: from any request of that salt whose block i
   *  was full (its hash depends only on the tokens up to its end, and the salt). */
  hashOf(i, salt, ids) {
    for (const runs of [this.live, this.recorded]) {
      for (const r of runs.finished()) {
        const end = (i + 1) * this.blockSize;
        if ((r.salt || '') === salt && r.hashes[i] && r.ids.length >= end
          && r.ids.slice(0, end).every((id, k) => id === ids[k])) return r.hashes[i];
      }
    }
    return null;
  }

  verdict(n, run) {
    const cachedBlocks = run.second.cached / this.blockSize;
    return `The engine${run.live ? '' : ' (recorded)'}: the second identical request of ${plural(n, 'token')} found `
      + `${plural(run.second.cached, 'token')} in the cache (${plural(cachedBlocks, 'block')}) `
      + `and computed ${plural(n - run.second.cached, 'token')}.`;
  }

  render() {
    const bs = this.blockSize;
    const n = Number(this.slider.value);
    const salt = this.saltInput.value.trim();
    const full = Math.floor(n / bs);
    const shareable = Math.floor((n - 1) / bs);
    const blocks = Math.ceil(n / bs);
    this.lengthOut.textContent = plural(n, 'token');
    this.slider.setAttribute('aria-valuetext', `${plural(n, 'token')}: ${plural(full, 'full block')}, ${shareable} shareable`);
    this.dataset.length = String(n);
    this.dataset.full = String(full);
    this.dataset.shareable = String(shareable);
    for (const b of this.presets.querySelectorAll('button')) b.setAttribute('aria-pressed', String(Number(b.dataset.length) === n));
    const fig = (label, value, key) => h('div', {}, h('dt', {}, label), h('dd', { [`data-${key}`]: value }, String(value)));
    this.figures.replaceChildren(
      fig('block size', bs, 'block-size'), fig('blocks', blocks, 'blocks'), fig('full (hashed)', full, 'full'),
      fig('shareable with a later identical prompt', shareable, 'shareable'), fig('tokens always computed', n - shareable * bs, 'computed'));
    const run = this.runFor(n, salt);
    if (run) {
      this.dataset.engineShared = String(run.second.cached / bs);
      this.verdictEl.textContent = this.verdict(n, run);
    } else {
      delete this.dataset.engineShared;
      this.verdictEl.textContent = this.isLive ? `Not sent yet with ${plural(n, 'token')} under this salt: press the button to ask the engine.`
        : `The recording sent ${RECORDED_SALTS.map((s) => `“${s}”`).join(' and ')} with ${2 * bs - 1}, ${2 * bs} and ${2 * bs + 1} tokens; pick one of those to see the engine’s answer.`;
    }
    const ids = this.tokens ? this.tokens.map((t) => t.id) : [];
    const items = [];
    for (let i = 0; i < blocks; i += 1) {
      const start = i * bs;
      const end = Math.min(n, start + bs);
      const isFull = end - start === bs;
      const state = i < shareable ? 'shared' : isFull ? 'recomputed' : 'partial';
      const hash = isFull && this.tokens ? this.hashOf(i, salt, ids) : null;
      const text = this.tokens ? this.tokens.slice(start, end).map((t) => t.text).join('') : '';
      const parent = i === 0 ? 'root' : `h${i - 1}`;
      const badge = { shared: 'shared: taken from the cache', recomputed: 'hashed, yet computed again: the last token must run',
        partial: `partial (${end - start} of ${bs}): not hashed` }[state];
      if (i) items.push(h('li', { class: 'khc-link', 'aria-hidden': 'true' }, '→'));
      items.push(h('li', { class: 'khc-block', 'data-state': state, 'data-block': i, 'data-hash': hash || '' },
        h('h4', {}, `Block ${i} · tokens ${start}–${end - 1}`),
        h('div', { class: 'khc-text' }, `“${text}”`),
        isFull ? h('div', { class: 'khc-formula' }, `h${i} = H(${parent}, ${bs} token ids, ${i === 0 ? saltKeys(salt) : '()'})`)
          : h('div', { class: 'khc-formula' }, 'no hash until it is full'),
        isFull ? h('div', {}, 'engine’s hash: ', h('span', { class: 'khc-hash' }, hash || 'not sent yet')) : null,
        h('span', { class: 'khc-badge' }, badge)));
    }
    this.chain.replaceChildren(...items);
  }

  exportData() {
    const n = Number(this.slider.value);
    return { block_size: this.blockSize, length: n, salt: this.saltInput.value.trim(), full_blocks: Math.floor(n / this.blockSize),
      shareable_blocks: Math.floor((n - 1) / this.blockSize),
      hashes: [...this.chain.querySelectorAll('[data-block]')].map((b) => b.dataset.hash || null),
      runs: [...this.recorded.finished(), ...this.live.finished()].map((r) => ({ rid: r.rid, tokens: r.ids.length, salt: r.salt, cached: r.cached, hashes: r.hashes })) };
  }
}

customElements.define('kv-hash-chain', KvHashChain);
