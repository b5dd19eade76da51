// <kv-router>: what a cache-aware router decides, live. Attached to two or more vLLM pools
// (`kvscope serve --attach URL URL ...`, or one server's data-parallel ranks), every prompt
// sent from the pages is routed by the policy the instructor picks — round robin, least
// loaded, or the longest cached prefix scored from the KV events as llm-d's scorer does —
// and the server broadcasts each decision as a `route` event. The widget lists, per
// request, each pool's matched prefix and the choice, with the cached tokens and TTFT vLLM
// reported; per policy, the hit rate and mean TTFT the servers' own /metrics counted while
// that policy routed (engine.vllm.router.totals). Its Run button sends the same shared-prefix
// pairs each time, each run under its own opening words so no run finds another's blocks.

import { KvWidget, formatInt, formatSeconds } from '../widget-base.js';
import { h } from './lib/svg.js';
import { injectStyle } from './lib/style.js';
import { clientHandlers, withHandlers } from './lib/listen.js';
import { modeBadge, showMode } from './lib/controls.js';

const MAX_ROWS = 24;
const POLICY_NAMES = { round_robin: 'Round robin', least_loaded: 'Least loaded', prefix: 'Longest cached prefix' };
// Shared prefixes longer than two blocks of 32 tokens, then the question that differs.
const PAIRS = [
  ['You are a careful librarian who answers questions about old maps, ships and the sea. Keep each answer to two plain sentences and name one book a reader could open next. Question:', 'Who drew the first map of the coast?', 'Why did ships carry a compass?'],
  ['You are a friendly gardener who helps children grow beans, peas and sunflowers in small pots on a windowsill. Answer in short steps a child can follow. Question:', 'How much water do beans need?', 'When do sunflowers open?'],
  ['You are a patient bicycle mechanic. You explain how to fix a flat tyre, tighten a chain or adjust the brakes, one step at a time, with the tool each step needs. Question:', 'How do I find the hole in a tube?', 'Why does my chain slip?'],
  ['You are a baker who teaches bread to beginners: flour, water, salt and yeast, and the time each stage takes in a cool or a warm kitchen. Question:', 'How long should dough rise?', 'Why is my crust pale?'],
];

const STYLE = `
kv-router .krt-policies { display: flex; flex-wrap: wrap; gap: .3rem 1rem; border: 0; padding: 0; margin: .3rem 0; }
kv-router .krt-policies legend { font-weight: 600; padding: 0; margin-bottom: .2rem; }
kv-router table { border-collapse: collapse; font-size: .82rem; font-variant-numeric: tabular-nums; width: 100%; margin: .4rem 0; }
kv-router th, kv-router td { padding: .15rem .35rem; border-bottom: 1px solid var(--kv-border); text-align: right; vertical-align: top; }
kv-router th:first-child, kv-router td:first-child, kv-router td.krt-prompt { text-align: left; }
kv-router .krt-scroll { overflow-x: auto; }
kv-router caption { text-align: left; font-weight: 600; padding: .2rem 0; }
kv-router td.krt-prompt { max-width: 9rem; overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
kv-router td[data-chosen=true] { font-weight: 700; outline: 2px solid var(--kv-focus); outline-offset: -2px; }
kv-router tr[data-current=true] th { text-decoration: underline; }
kv-router .krt-bar { display: inline-block; height: .6em; background: var(--kv-cached); vertical-align: middle; margin-right: .25rem; }
`;

class KvRouter extends withHandlers(KvWidget) {
  static events = [];
  static requires = ['requests'];
  static label = 'Router';

  setup() {
    injectStyle('kv-router', STYLE);
    this.rows = [];            // [{ rid, prompt, route, finished }]
    this.byId = new Map();
    this.routes = new Map();   // request id -> its route event (it comes before the submit's ack)
    this.early = new Map();    // request id -> request.finished that beat the ack
    this.runs = 0;
    this.running = false;
    this.modeBadge = modeBadge();
    this.noteEl = h('p', { class: 'kvw-note', 'data-router-note': '' });
    this.policyBox = h('fieldset', { class: 'krt-policies' }, h('legend', {}, 'Routing policy'));
    this.radios = new Map();
    for (const [value, name] of Object.entries(POLICY_NAMES)) {
      const input = h('input', { type: 'radio', name: `${this.id || 'kv-router'}-policy`, value });
      input.addEventListener('change', () => { if (input.checked) this.setPolicy(value); });
      this.radios.set(value, input);
      this.policyBox.append(h('label', {}, input, ` ${name}`));
    }
    this.policyNote = h('p', { class: 'kvw-note', 'aria-live': 'polite' });
    // chapter pages connect as learners; the instructor unlocks the policy with the token
    this.tokenInput = h('input', { class: 'kvw-input', type: 'password', autocomplete: 'off', 'aria-label': 'Instructor token' });
    this.tokenForm = h('form', { class: 'kvw-row', 'aria-label': 'Pick the policy as the instructor', onsubmit: (e) => { e.preventDefault(); this.unlock(); } },
      h('label', {}, 'Instructor token ', this.tokenInput), h('button', { type: 'submit', class: 'kvw-btn' }, 'Pick the policy'));
    this.runButton = h('button', { type: 'button', class: 'kvw-btn kvw-btn--primary', onclick: () => this.runPairs() },
      `Send ${PAIRS.length} shared-prefix pairs`);
    this.freeInput = h('input', { class: 'kvw-input', type: 'text', value: PAIRS[0][0], 'aria-label': 'Your own prompt' });
    this.freeButton = h('button', { type: 'submit', class: 'kvw-btn' }, 'Route my prompt');
    this.freeForm = h('form', { class: 'kvw-row', 'aria-label': 'Route a prompt of your own', onsubmit: (e) => { e.preventDefault(); this.send(this.freeInput.value); } },
      h('label', {}, 'Or your own prompt ', this.freeInput), this.freeButton);
    this.errorEl = h('p', { class: 'kvw-error', role: 'alert' });
    this.requestsHead = h('thead', {});
    this.requestsBody = h('tbody', {});
    this.policiesBody = h('tbody', {});
    this.body.append(
      h('div', { class: 'kvw-row' }, h('strong', {}, 'Where each prompt goes'), this.modeBadge),
      this.noteEl, this.policyBox, this.policyNote, this.tokenForm,
      h('div', { class: 'kvw-row' }, this.runButton), this.freeForm, this.errorEl,
      h('div', { class: 'krt-scroll' }, h('table', { 'data-policies': '' }, h('caption', {}, 'Per policy, as the vLLM servers counted it while the policy routed'),
        h('thead', {}, h('tr', {}, h('th', { scope: 'col' }, 'policy'), h('th', { scope: 'col' }, 'requests'),
          h('th', { scope: 'col' }, 'prefix-cache hits / tokens looked up'), h('th', { scope: 'col' }, 'hit rate'),
          h('th', { scope: 'col' }, 'mean TTFT'))), this.policiesBody)),
      h('div', { class: 'krt-scroll', tabindex: '0', role: 'region', 'aria-label': 'Routed requests' },
        h('table', { 'data-requests': '' }, h('caption', {}, 'Per request: each pool’s cached prefix of the prompt (blocks), and the choice'),
          this.requestsHead, this.requestsBody)),
    );
    this.handlers = clientHandlers(this, {
      route: (e) => this.onRoute(e),
      'request.finished': (e) => this.onFinished(e),
    });
    this.handlers.attach();
    this.setLegend([
      { label: 'the pool the router chose (outlined)', color: 'var(--kv-focus)', shape: 'line' },
      { label: 'cached prefix of the prompt in that pool', color: 'var(--kv-cached)' },
    ]);
    this.updateMode(this.client.mode);
  }

  get instructor() {
    return Boolean(this.client.session && this.client.session.role === 'instructor');
  }

  get pools() {
    return this.client.hello?.deployment?.pools || [];
  }

  get routable() {
    return this.isLive && this.client.hello?.backend?.engine === 'vllm' && this.pools.length > 1;
  }

  onModeChange(mode) {
    this.updateMode(mode);
    this.requestRender();
  }

  updateMode(mode) {
    showMode(this.modeBadge, mode);
  }

  onEvent(event) {
    if (event.type === 'hello' || event.type === 'engine' || event.type === 'session') this.requestRender();
  }

  async unlock() {
    this.errorEl.textContent = '';
    try {
      await this.client.command('auth', { token: this.tokenInput.value });
      this.tokenInput.value = '';
    } catch (error) {
      this.errorEl.textContent = this.describeError(error);
    }
  }

  async setPolicy(policy) {
    this.errorEl.textContent = '';
    try {
      await this.client.command('route_policy', { policy });
    } catch (error) {
      this.errorEl.textContent = this.describeError(error);
    }
  }

  /** Send one prompt (routed by the server); resolves when it has finished. */
  async send(prompt) {
    this.errorEl.textContent = '';
    let ack;
    try {
      // eight tokens each, EOS or not: the small model often ends at once, leaving no inter-token latency to read
      ack = await this.client.command('submit', { prompt, params: { temperature: 0, max_tokens: 8, ignore_eos: true } });
    } catch (error) {
      this.errorEl.textContent = this.describeError(error);
      return null;
    }
    const row = this.rowOf(ack.request_id);
    row.prompt = prompt;
    row.route = row.route || this.routes.get(ack.request_id) || null;
    row.finished = row.finished || this.early.get(ack.request_id) || null;
    this.requestRender();
    return new Promise((resolve) => { row.done = resolve; if (row.finished) resolve(row); });
  }

  /** The pairs, one after the other: the second of a pair sent once the first has finished
   *  (so its blocks are cached), each run opening with its own words. */
  async runPairs() {
    if (this.running) return;
    this.running = true;
    this.runButton.disabled = true;
    this.runs += 1;
    const tag = `Run ${(Date.now() % 100000) + this.runs}.`;
    try {
      for (const [prefix, first, second] of PAIRS) {
        if (!(await this.send(`${tag} ${prefix} ${first}`))) break;
        if (!(await this.send(`${tag} ${prefix} ${second}`))) break;
      }
    } finally {
      this.running = false;
      this.runButton.disabled = !this.routable;
    }
  }

  rowOf(rid) {
    if (!this.byId.has(rid)) {
      const row = { rid, prompt: '', route: null, finished: null, done: null };
      this.byId.set(rid, row);
      this.rows.unshift(row);
      for (const old of this.rows.splice(MAX_ROWS)) this.byId.delete(old.rid);
    }
    return this.byId.get(rid);
  }

  /** Every routed request is broadcast; this widget lists its own (matched after the ack). */
  onRoute(event) {
    const row = this.byId.get(event.request_id);
    if (row) {
      row.route = event;
      this.requestRender();
      return;
    }
    this.routes.set(event.request_id, event);
    if (this.routes.size > 64) this.routes.delete(this.routes.keys().next().value);
  }

  onFinished(event) {
    const row = this.byId.get(event.request_id);
    if (!row) {
      this.early.set(event.request_id, event);
      if (this.early.size > 64) this.early.delete(this.early.keys().next().value);
      return;
    }
    row.finished = event;
    row.done?.(row);
    this.requestRender();
  }

  render() {
    const vllm = this.client.engine?.vllm;
    const router = vllm?.router;
    const policy = router?.policy;
    for (const [value, input] of this.radios) {
      input.checked = value === policy;
      input.disabled = !this.routable || !this.instructor;
    }
    this.dataset.policy = policy || '';
    this.policyNote.textContent = !this.routable ? ''
      : (this.instructor ? 'You pick the policy for the whole class; every prompt sent from any page is routed by it.'
        : `The instructor picks the policy; now: ${POLICY_NAMES[policy] || '—'}.`);
    this.tokenForm.hidden = !this.routable || this.instructor;
    this.runButton.disabled = !this.routable || this.running;
    this.freeButton.disabled = !this.routable;
    this.noteEl.textContent = this.routable
      ? `${this.pools.length} pools: ${this.pools.map((p) => p.name).join(', ')}. A pool’s score is how many of the prompt’s blocks of ${this.client.hello.deployment.block_size} tokens it holds in a row from the first, read from its KV events.`
      : (this.isLive
        ? 'A router needs two or more vLLM pools: start kvscope with `kvscope serve --attach URL URL` (two servers), or attach one vLLM started with `--data-parallel-size 2`.'
        : 'The router works live only, attached to two or more vLLM pools (`kvscope serve --attach URL URL`).');
    this.renderPolicies(router);
    this.renderRequests();
  }

  renderPolicies(router) {
    const totals = router?.totals || {};
    const opt = (x, f) => (x === null || x === undefined ? '—' : f(x));
    this.policiesBody.replaceChildren(...Object.entries(POLICY_NAMES).map(([key, name]) => {
      const t = totals[key] || {};
      return h('tr', { 'data-policy': key, 'data-current': String(key === router?.policy) },
        h('th', { scope: 'row' }, name), h('td', {}, formatInt(t.requests ?? 0)),
        h('td', { 'data-hits': String(t.prefix_cache_hits ?? 0) }, `${formatInt(t.prefix_cache_hits ?? 0)} / ${formatInt(t.prefix_cache_queries ?? 0)}`),
        h('td', { 'data-hit-rate': String(t.hit_rate ?? '') }, opt(t.hit_rate, (x) => `${(x * 100).toFixed(1)} %`)),
        h('td', { 'data-ttft': String(t.ttft_s ?? '') }, opt(t.ttft_s, formatSeconds)));
    }));
  }

  renderRequests() {
    const pools = this.pools;
    this.requestsHead.replaceChildren(h('tr', {}, h('th', { scope: 'col' }, 'request'), h('th', { scope: 'col' }, 'prompt'),
      h('th', { scope: 'col' }, 'policy'),
      ...pools.map((p) => h('th', { scope: 'col' }, p.name)),
      h('th', { scope: 'col' }, 'cached tokens (vLLM)'), h('th', { scope: 'col' }, 'TTFT')));
    this.requestsBody.replaceChildren(...this.rows.map((row) => {
      const r = row.route;
      const f = row.finished;
      const cells = pools.map((p) => {
        const c = r?.candidates.find((x) => x.pool === p.pool);
        if (!c) return h('td', {}, '—');
        const chosen = r.choice === p.pool;
        const width = Math.min(5, c.matched_blocks) * 0.8;
        return h('td', { 'data-pool': String(p.pool), 'data-chosen': String(chosen), 'data-matched': String(c.matched_blocks),
          'aria-label': `${p.name}: ${c.matched_blocks} blocks cached${c.up ? '' : ', not answering'}, load ${c.load}${chosen ? ', chosen' : ''}` },
        h('span', { class: 'krt-bar', style: `width:${width}em` }), `${c.matched_blocks}${chosen ? ' ✓' : ''}`);
      });
      const outcome = f ? (f.error ? f.error : formatInt(f.num_cached_tokens)) : '…';
      return h('tr', { 'data-request': row.rid, 'data-choice': String(r?.choice ?? ''), 'data-cached': String(f?.num_cached_tokens ?? '') },
        h('td', {}, row.rid), h('td', { class: 'krt-prompt', title: row.prompt }, row.prompt),
        h('td', {}, r ? POLICY_NAMES[r.policy] : '—'), ...cells,
        h('td', { class: f?.error ? 'kvw-error' : '' }, outcome), h('td', {}, f?.ttft_s != null ? formatSeconds(f.ttft_s) : '—'));
    }));
  }

  exportData() {
    return { policy: this.client.engine?.vllm?.router ?? null, requests: this.rows.map(({ rid, prompt, route, finished }) => ({ rid, prompt, route, finished })) };
  }
}

customElements.define('kv-router', KvRouter);
