// Chapter 16's two traps, shown on the live engine. Sharing happens in whole blocks: a pair
// of prompts whose common beginning is shorter than one block shares nothing (a 0 % hit),
// and a longer one shares its full blocks only, the rest of the common part recomputed.
// And `cache_salt`: the same prompt under two salts shares nothing, under one salt it does.
// The cached counts are the engine's own (`request.finished`.num_cached_tokens); the page
// only counts how many tokens a prompt has in common with the one sent before it. The
// block size is the engine's (hello: engine.block_size). Replaying a recording, the rows
// come from the recorded requests' events, through the same code.

import { h } from './svg.js';
import { formatInt } from '../../widget-base.js';
import { controlRow } from './controls.js';

// Two endings that differ from their first token on, so a pair shares exactly its prefix,
// each long enough that the second prompt has full blocks after the shared part.
const ENDINGS = [
  ' What is a byte, and how many different numbers can one byte hold? Explain it with a small example I can check by hand.',
  ' Tell me why the sky looks blue at noon but red at sunset, in three short sentences, with one experiment I can try at home.',
];
const SALT_ENDING = ' How does a bicycle stay up when it moves, and why does it fall over when it stops?';
const PARAMS = { temperature: 0, max_tokens: 1, ignore_eos: true };
const KEEP_FINISHED = 64;

/** A fresh salt part per run (crypto.randomUUID needs a secure context; a class server may not be one). */
function nonce() {
  return `${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 10)}`;
}

/** How many leading tokens two prompts have in common. */
function commonPrefix(a, b) {
  let n = 0;
  while (n < a.length && n < b.length && a[n] === b[n]) n += 1;
  return n;
}

export class PrefixLessons {
  constructor(host, prompt) {
    this.host = host;
    this.prompt = prompt;
    this.rows = new Map();       // request id -> { ids, label, previous }
    this.last = null;            // the request sent last (live: in this run; null before a run's first)
    this.mine = new Set();       // live: the requests this panel sent
    this.finished = new Map();   // request id -> request.finished event (may beat the ack)
    this.waiters = new Map();    // request id -> resolve(request.finished)
    this.tokens = null;          // tokenized pieces, fetched once
    const id = `${host.getAttribute('aria-labelledby') || 'kvp'}-lessons`;
    this.blockNote = h('p', { class: 'kvw-note', 'data-block-size': '' });
    this.shortButton = h('button', { type: 'button', class: 'kvw-btn', onclick: () => this.sendPreset('short') }, 'Share less than a block');
    this.longButton = h('button', { type: 'button', class: 'kvw-btn', onclick: () => this.sendPreset('long') }, 'Share more than a block');
    this.sharedIn = h('input', {
      class: 'kvw-input', type: 'number', id: `${id}-n`, min: 1, max: 64, value: 12,
      'aria-describedby': `${id}-bs`,
    });
    this.pairButton = h('button', { type: 'button', class: 'kvw-btn', onclick: () => this.sendPair(Number(this.sharedIn.value)) }, 'Send the pair');
    this.saltButton = h('button', { type: 'button', class: 'kvw-btn', onclick: () => this.sendSalted() },
      'Send one prompt as tenant A, tenant B, then A again');
    this.blockNote.id = `${id}-bs`;
    for (const button of [this.shortButton, this.longButton, this.pairButton]) button.setAttribute('aria-describedby', this.blockNote.id);
    this.errorEl = h('p', { class: 'kvw-error', role: 'alert' });
    this.statusEl = h('p', { class: 'kvw-note', 'aria-live': 'polite' });
    this.body = h('tbody', {});
    this.table = h('table', { class: 'kvp-lessons', 'aria-label': 'Prefix-cache results, one row per request' },
      h('thead', {}, h('tr', {},
        h('th', { scope: 'col' }, 'Request'), h('th', { scope: 'col' }, 'Prompt tokens'),
        h('th', { scope: 'col' }, 'In common with the one before'), h('th', { scope: 'col' }, 'Cached tokens (engine)'),
        h('th', { scope: 'col' }, 'Its blocks'))),
      this.body);
    this.verdict = h('ul', { class: 'kvw-note kvp-lessons-verdict', 'aria-live': 'polite', 'aria-label': 'What the last requests show' });
    this.whys = [];              // [request id, explanation] of the last few rows
    this.el = h('section', { class: 'kvw-panel kvp-lessons-panel', 'aria-label': 'Whole blocks and cache salts' },
      h('h4', {}, 'Whole blocks, and cache salts'),
      this.blockNote,
      controlRow('Share a beginning shorter or longer than a block', this.shortButton, this.longButton,
        h('label', { class: 'kvp-field', for: `${id}-n` }, 'or share ', this.sharedIn, ' tokens'), this.pairButton),
      controlRow('Cache salts', this.saltButton),
      this.errorEl, this.statusEl,
      h('div', { class: 'kvp-lessons-wrap' }, this.table),
      h('p', { class: 'kvw-note kvp-strip-key' }, 'Its blocks: ', h('span', { class: 'kvp-cell kvp-cell--cached', 'aria-hidden': 'true' }), ' reused from the cache · ',
        h('span', { class: 'kvp-cell kvp-cell--recomputed', 'aria-hidden': 'true' }), ' holds tokens in common, yet recomputed · ',
        h('span', { class: 'kvp-cell kvp-cell--own', 'aria-hidden': 'true' }), ' the request’s own (a number: a partly filled last block).'),
      this.verdict);
    this.buttons = [this.shortButton, this.longButton, this.pairButton, this.saltButton];
    this.showBlockSize();
  }

  get blockSize() {
    return this.host.client.hello?.engine?.block_size ?? 0;
  }

  /** The presets, from the engine's block size: ¾ of a block, and 2½ blocks. */
  presets() {
    const bs = this.blockSize;
    return { short: Math.max(1, Math.floor((bs * 3) / 4)), long: 2 * bs + Math.floor(bs / 2) };
  }

  showBlockSize() {
    const bs = this.blockSize;
    const attached = this.host.client.hello?.backend?.engine === 'vllm';
    const live = this.host.isLive && !attached;
    for (const b of this.buttons) b.disabled = !live || !bs || this.busy;
    this.sharedIn.disabled = !live;
    if (!bs) {
      this.blockNote.textContent = 'Waiting for the engine’s block size…';
      return;
    }
    const { short, long } = this.presets();
    this.sharedIn.max = String(4 * bs);
    // The visible words are the buttons' names too (no aria-label to say other words);
    // what a press sends is in the note they point to.
    this.shortButton.textContent = `Share ${short} tokens (less than a block of ${bs})`;
    this.longButton.textContent = `Share ${long} tokens (more than ${Math.floor(long / bs)} blocks of ${bs})`;
    this.blockNote.dataset.blockSize = String(bs);
    this.blockNote.textContent = `The engine’s blocks hold ${bs} tokens. Each button sends two prompts that begin alike and then differ, one after the other, each under a fresh cache_salt of its own so that earlier runs cannot help it.`
      + (attached ? ' These pairs need kvscope’s own engine; attached to vLLM, use the demo above.'
        : (live ? '' : ' They need the live engine; below, the recorded requests.'));
  }

  // -- sending (live) -------------------------------------------------------------------
  async pieces() {
    if (this.tokens) return this.tokens;
    const ids = async (text) => (await this.host.client.command('tokenize', { text })).ids;
    const [prompt, ...endings] = await Promise.all([this.prompt, ...ENDINGS, SALT_ENDING].map(ids));
    this.tokens = { prompt, endings: endings.slice(0, 2), saltEnding: endings[2] };
    return this.tokens;
  }

  /** The first n tokens of the system prompt (repeated if it is shorter than n). */
  async sharedIds(n) {
    const { prompt } = await this.pieces();
    let ids = prompt;
    while (ids.length < n) ids = ids.concat(prompt);
    return ids.slice(0, n);
  }

  sendPreset(which) {
    const n = this.presets()[which];
    this.sharedIn.value = String(n);
    return this.sendPair(n);
  }

  async sendPair(n) {
    const bs = this.blockSize;
    if (!Number.isInteger(n) || n < 1 || n > 4 * bs) {
      this.errorEl.textContent = `Choose a whole number of tokens from 1 to ${4 * bs}.`;
      return;
    }
    await this.exclusive(async () => {
      const shared = await this.sharedIds(n);
      const { endings } = await this.pieces();
      const salt = `pair-${nonce()}`;
      for (const [i, ending] of endings.entries()) {
        await this.send(shared.concat(ending), salt, i === 0 ? `pair sharing ${n}: 1st` : `pair sharing ${n}: 2nd`);
      }
    });
  }

  async sendSalted() {
    await this.exclusive(async () => {
      const { prompt, saltEnding } = await this.pieces();
      const ids = prompt.concat(saltEnding);
      const run = nonce();
      for (const tenant of ['A', 'B', 'A']) await this.send(ids, `tenant-${tenant}-${run}`, `tenant ${tenant}`);
    });
  }

  async exclusive(fn) {
    this.errorEl.textContent = '';
    this.last = null;   // each run compares its requests with each other only
    this.busy = true;
    this.showBlockSize();
    try {
      await fn();
    } catch (error) {
      this.errorEl.textContent = this.host.describeError(error);
    } finally {
      this.busy = false;
      this.showBlockSize();
    }
  }

  /** Submit one request, waiting out the learner's submit allowance if it is spent. */
  async submit(fields) {
    for (;;) {
      try {
        return await this.host.client.command('submit', fields);
      } catch (error) {
        if (error.code !== 'rate_limited') throw error;
        const seconds = Number(/try again in (\d+) s/.exec(error.message)?.[1] ?? 3);
        this.statusEl.textContent = `The server lets a learner send a few prompts at once, then one every few seconds: waiting ${seconds} s.`;
        await new Promise((resolve) => setTimeout(resolve, seconds * 1000));
        this.statusEl.textContent = '';
      }
    }
  }

  /** Submit one request and wait until the engine reports it finished. */
  async send(ids, salt, label) {
    const ack = await this.submit({ prompt_token_ids: ids, params: PARAMS, cache_salt: salt });
    const rid = ack.request_id;
    this.mine.add(rid);
    this.track(rid, ids, label);
    this.last = rid;
    const done = this.finished.get(rid) ?? await new Promise((resolve) => this.waiters.set(rid, resolve));
    this.show(rid, done);
  }

  // -- events (live: this panel's requests; replay: every recorded one) ------------------
  onAdded(e) {
    if (this.host.isLive) return;   // live, the panel knows what it sent
    this.track(e.request_id, e.prompt_token_ids, null);
    this.last = e.request_id;   // replaying, runs are not told apart: the request recorded before
  }

  onFinished(e) {
    if (this.host.isLive) {
      this.finished.set(e.request_id, e);
      if (this.finished.size > KEEP_FINISHED) this.finished.delete(this.finished.keys().next().value);
      this.waiters.get(e.request_id)?.(e);
      this.waiters.delete(e.request_id);
    } else if (this.rows.has(e.request_id)) {
      this.show(e.request_id, e);
    }
  }

  track(rid, ids, label) {
    const previous = this.rows.get(rid)?.previous ?? (this.last !== rid ? this.last : null);
    this.rows.set(rid, { ids, label, previous });
  }

  /** One row: the engine's cached count, the tokens in common, and the prompt's blocks. */
  show(rid, finished) {
    const row = this.rows.get(rid);
    const bs = this.blockSize;
    if (!row || !bs) return;
    const before = row.previous ? this.rows.get(row.previous) : null;
    const common = before ? commonPrefix(row.ids, before.ids) : 0;
    const cached = finished.num_cached_tokens;
    const tr = h('tr', { 'data-request': rid, 'data-common': String(common), 'data-cached': String(cached) },
      h('th', { scope: 'row' }, rid, row.label ? h('span', { class: 'kvp-label' }, row.label) : ''),
      h('td', { 'data-cell': 'prompt' }, formatInt(row.ids.length)),
      h('td', {}, before ? formatInt(common) : '—'),
      h('td', { 'data-cell': 'cached' }, formatInt(cached)),
      h('td', {}, this.strip(row.ids.length, common, cached)));
    const old = this.body.querySelector(`tr[data-request="${CSS.escape(rid)}"]`);
    if (old) old.replaceWith(tr);
    else this.body.append(tr);
    this.whys = this.whys.filter(([r]) => r !== rid).concat([[rid, this.explain(rid, row, common, cached)]]).slice(-3);
    this.verdict.replaceChildren(...this.whys.map(([r, text]) => h('li', { 'data-request': r }, text)));
  }

  /** The prompt cut into blocks: reused from the cache, holding common tokens yet
   *  recomputed, or the request's own. */
  strip(numTokens, common, cached) {
    const bs = this.blockSize;
    const cells = [];
    for (let start = 0; start < numTokens; start += bs) {
      const size = Math.min(bs, numTokens - start);
      const kind = start + size <= cached ? 'cached' : (start < common ? 'recomputed' : 'own');
      const what = { cached: 'reused from the cache', recomputed: 'holds tokens in common, recomputed', own: 'computed' }[kind];
      cells.push(h('span', { class: `kvp-cell kvp-cell--${kind}`, title: `tokens ${start}–${start + size - 1}: ${what}` },
        size < bs ? `${size}` : ''));
    }
    const reused = Math.floor(cached / bs);
    return h('span', { class: 'kvp-strip', role: 'img', 'aria-label': `${cells.length} blocks: ${reused} reused from the cache, the rest computed` }, ...cells);
  }

  explain(rid, row, common, cached) {
    const bs = this.blockSize;
    if (!row.previous) return `${rid} is the first of its run: nothing to share yet.`;
    if (cached > 0) {
      const blocks = cached / bs;
      const partial = common - cached;
      return `${rid} shares ${formatInt(common)} tokens with the request before it, and the engine reused ${formatInt(cached)} = ${blocks} × ${bs}: `
        + `only whole blocks are cached.${partial > 0 ? ` The other ${formatInt(partial)} tokens in common sit in a partly shared block, which ${rid} recomputes.` : ''}`;
    }
    if (common < bs) {
      return `${rid} shares ${formatInt(common)} tokens with the request before it, fewer than a block of ${bs}: its first block also holds tokens of its own, so its hash differs, and every later hash with it. A 0 % hit.`;
    }
    return `${rid} has ${formatInt(common)} tokens in common with the request before it, yet the engine found none of them cached: `
      + `its cache_salt differs, so even its first block hashes differently. Requests share blocks only under equal salts.`;
  }
}

export const LESSONS_CSS = `
kv-pages .kvp-lessons-wrap { overflow-x: auto; }
kv-pages .kvp-lessons-panel > p:empty { display: none; }
kv-pages .kvp-lessons .kvp-label { display: block; font-weight: 400; font-size: .78rem; color: var(--kv-fg-soft); }
kv-pages .kvp-lessons td { font-variant-numeric: tabular-nums; }
kv-pages .kvp-lessons-verdict { padding-left: 1.2rem; margin: .3rem 0; }
kv-pages .kvp-lessons { border-collapse: collapse; font-size: .85rem; width: 100%; }
kv-pages .kvp-lessons th, kv-pages .kvp-lessons td { text-align: left; padding: .15rem .4rem; border-bottom: 1px solid var(--kv-border); vertical-align: middle; }
kv-pages .kvp-lessons thead th { font-weight: 600; color: var(--kv-fg-soft); }
kv-pages .kvp-field .kvw-input { width: 4.5em; }
kv-pages .kvp-strip { display: inline-flex; gap: 2px; flex-wrap: wrap; max-width: 16rem; }
kv-pages .kvp-cell { display: inline-block; min-width: 1.1rem; height: 1.1rem; border-radius: 2px; font-size: .7rem; line-height: 1.1rem; text-align: center; }
kv-pages .kvp-cell--cached { background: var(--kv-cached); }
kv-pages .kvp-cell--recomputed { background: repeating-linear-gradient(45deg, var(--kv-cached) 0 3px, var(--kv-used) 3px 6px); }
kv-pages .kvp-cell--own { background: var(--kv-used); }
`;
