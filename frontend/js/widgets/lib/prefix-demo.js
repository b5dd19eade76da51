// <kv-pages prompt="…">: one click sends the shared prompt (a system prompt, say) twice, each
// time with a different question, and holds both requests after their first token so their
// blocks stay on screen: the second request's leading full blocks hash the same as the
// first's, so the engine reuses them (ref count 2) and computes only the rest. What each
// request cost is read from the engine's own `step` events: prefill tokens computed, tokens
// found in the cache, and the prefill step's measured time.

import { h } from './svg.js';
import { formatInt, formatSeconds } from '../../widget-base.js';

const QUESTIONS = ['What is a byte?', 'Why is the sky blue?', 'How does a bicycle stay up?', 'What is a block table?'];

export class PrefixDemo {
  constructor(host, prompt) {
    this.host = host;
    this.prompt = prompt;
    this.sent = 0;
    this.runs = new Map();       // request id -> { question, computed, cached, prefillS, row, firstToken }
    this.held = [];
    this.sendButton = h('button', { type: 'button', class: 'kvw-btn kvw-btn--primary', onclick: () => this.run() },
      'Send two requests with this prompt');
    this.finishButton = h('button', { type: 'button', class: 'kvw-btn', disabled: '', onclick: () => this.finish() },
      'Let them finish');
    this.list = h('ul', { class: 'kvp-prefix-results', 'aria-live': 'polite' });
    this.verdict = h('p', { class: 'kvw-note' });
    this.errorEl = h('p', { class: 'kvw-error', role: 'alert' });
    this.noteEl = h('p', { class: 'kvw-note', 'data-engine-note': '' });
    // a prompt of the learner's own: how much of it the engine found cached (a short one: none)
    this.freeInput = h('input', { class: 'kvw-input kvp-free', type: 'text', value: 'Hi there',
      'aria-label': 'Your own prompt', placeholder: 'Any prompt' });
    this.freeButton = h('button', { type: 'button', class: 'kvw-btn', onclick: () => this.sendFree() }, 'Send my prompt');
    this.freeForm = h('form', { class: 'kvw-row', 'aria-label': 'Send a prompt of your own', onsubmit: (e) => { e.preventDefault(); this.sendFree(); } },
      h('label', {}, 'Or your own prompt ', this.freeInput), this.freeButton);
    this.el = h('section', { class: 'kvw-panel', 'aria-label': 'Shared prefix' },
      h('h4', {}, 'A shared prefix'), this.noteEl,
      h('blockquote', { class: 'kvp-prefix' }, prompt),
      h('div', { class: 'kvw-row' }, this.sendButton, this.finishButton), this.freeForm, this.errorEl, this.list, this.verdict);
    this.showEngine();
  }

  get attached() {
    return this.host.client.hello?.backend?.engine === 'vllm';
  }

  /** What the demo does depends on the engine that answers: say what is true of it. */
  showEngine() {
    this.noteEl.textContent = this.attached
      ? 'One click sends the prompt below twice, each time with a different question. Attached to vLLM the requests are not held: vLLM runs each to its end, so their blocks are back in the cache (hatched, reference count 0) by the time the pool draws them, and the second one’s leading blocks show as hits. The numbered steps under this widget describe kvscope’s own engine, which can hold them.'
      : 'One click sends the prompt below twice, each time with a different question. Both requests are held after their first token, so their blocks stay in the pool: the second one’s leading blocks are the first one’s, with a reference count of 2.';
    this.finishButton.hidden = this.attached;
  }

  /** A prompt of the learner's own, sent once (not held): its row says what the engine found cached. */
  async sendFree() {
    const prompt = this.freeInput.value.trim();
    if (!prompt || this.freeButton.disabled) return;
    this.errorEl.textContent = '';
    this.freeButton.disabled = true;
    try {
      const run = { question: null, own: prompt, prompt: 0, computed: 0, cached: 0, prefillS: 0, row: h('li', {}), firstToken: null };
      const ack = await this.host.client.command('submit', { prompt, params: { temperature: 0, max_tokens: 8 } });
      run.prompt = ack.num_prompt_tokens;
      run.row.dataset.request = ack.request_id;
      run.row.dataset.own = '';
      run.row.textContent = `${ack.request_id} (your prompt): ${formatInt(run.prompt)} prompt tokens, sent.`;
      this.runs.set(ack.request_id, run);
      this.list.append(run.row);
    } catch (error) {
      this.errorEl.textContent = this.host.describeError(error);
    } finally {
      this.freeButton.disabled = false;
    }
  }

  /** Called by the host for every `step` event: count what each of our requests computed. */
  onStep(event) {
    for (const s of event.seqs) {
      const run = this.runs.get(s.request_id);
      if (!run || s.kind !== 'prefill') continue;
      run.computed += s.num_tokens;
      run.cached = Math.max(run.cached, s.cached_tokens);
      run.prefillS += event.duration_s;
      this.show(s.request_id);
      if (s.samples && run.firstToken) run.firstToken();   // the prefill is complete
    }
  }

  async run() {
    this.errorEl.textContent = '';
    this.sendButton.disabled = true;
    try {
      await this.release();
      this.list.replaceChildren();
      this.verdict.textContent = '';
      const first = await this.sendHeld();
      const second = await this.sendHeld();
      this.host.pinnedSeq = second;
      this.host.setHighlight(second);
      this.finishButton.disabled = false;
      this.explain(first, second);
    } catch (error) {
      this.errorEl.textContent = this.host.describeError(error);
    } finally {
      this.sendButton.disabled = false;
    }
  }

  /** Submit one held request and let it run its prefill (one `next`): resolves after its first token.
   *  Attached to vLLM (no hold, no steps) the request runs to the end and its cached tokens
   *  come from vLLM's own answer (usage.prompt_tokens_details.cached_tokens). */
  async sendHeld() {
    const client = this.host.client;
    if (this.attached) return this.sendAttached();
    const question = QUESTIONS[this.sent % QUESTIONS.length];
    this.sent += 1;
    const ack = await client.command('submit', {
      prompt: `${this.prompt}\n\nQuestion: ${question}`, params: { temperature: 0, max_tokens: 16, ignore_eos: true }, hold: true,
    });
    const rid = ack.request_id;
    const row = h('li', { 'data-request': rid }, `${rid} (“${question}”): ${formatInt(ack.num_prompt_tokens)} prompt tokens, held.`);
    const run = { question, prompt: ack.num_prompt_tokens, computed: 0, cached: 0, prefillS: 0, row, firstToken: null };
    const prefilled = new Promise((resolve) => { run.firstToken = resolve; });
    this.runs.set(rid, run);
    this.held.push(rid);
    this.list.append(row);
    await client.command('next', { request_id: rid });
    await prefilled;
    return rid;
  }

  async sendAttached() {
    const question = QUESTIONS[this.sent % QUESTIONS.length];
    this.sent += 1;
    const run = { question, prompt: 0, computed: 0, cached: 0, prefillS: 0, row: h('li', {}), firstToken: null };
    const finished = new Promise((resolve) => { run.firstToken = resolve; });
    const ack = await this.host.client.command('submit', {
      prompt: `${this.prompt}\n\nQuestion: ${question}`, params: { temperature: 0, max_tokens: 16, ignore_eos: true },
    });
    run.prompt = ack.num_prompt_tokens;
    run.row.dataset.request = ack.request_id;
    this.runs.set(ack.request_id, run);
    this.list.append(run.row);
    await finished;
    return ack.request_id;
  }

  show(rid) {
    const run = this.runs.get(rid);
    run.row.dataset.computed = String(run.computed);
    run.row.dataset.cached = String(run.cached);
    run.row.textContent = `${rid} (${run.question ? `“${run.question}”` : 'your prompt'}): ${formatInt(run.prompt)} prompt tokens — `
      + `${formatInt(run.computed)} computed, ${formatInt(run.cached)} found in the prefix cache; `
      + `${this.attached ? 'time to first token' : 'prefill step'} ${formatSeconds(run.prefillS)}.`;
  }

  explain(first, second) {
    const a = this.runs.get(first);
    const b = this.runs.get(second);
    const faster = b.prefillS < a.prefillS;
    const step = this.attached ? 'time to first token' : 'prefill step';
    if (b.computed >= a.computed) {
      // no saving for the second: either both found the prefix (an earlier pair left it in
      // the cache) or neither did (prefix caching off, or the blocks were evicted)
      this.verdict.textContent = `Both requests computed ${formatInt(b.computed)} prompt tokens and found `
        + `${formatInt(a.cached)} and ${formatInt(b.cached)} in the prefix cache: `
        + (a.cached > 0
          ? 'an earlier request had already left the shared blocks there, so the first gained as much as the second.'
          : 'the second reused nothing the first left behind.');
      return;
    }
    this.verdict.textContent = `The second request computed ${formatInt(b.computed)} prompt tokens instead of ${formatInt(a.computed)}: `
      + `the engine reused ${formatInt(b.cached)} tokens’ worth of blocks. `
      + (this.attached
        ? `Its ${step} was ${formatSeconds(b.prefillS)}, the first’s ${formatSeconds(a.prefillS)}.`
        : faster
          ? `Its prefill step was faster too (${formatSeconds(b.prefillS)} vs ${formatSeconds(a.prefillS)}).`
          : `Its prefill step was not faster (${formatSeconds(b.prefillS)} vs ${formatSeconds(a.prefillS)}): on a tiny model on a CPU, each step’s fixed cost dwarfs the work per token, so skipping tokens saves little time. On a large model on a GPU, prefill time grows with the tokens computed, and the saving shows in the time to first token.`);
  }

  async finish() {
    this.finishButton.disabled = true;
    await this.release();
  }

  async release() {
    const ids = this.held.splice(0);
    await Promise.all(ids.map((rid) => this.host.client.command('release', { request_id: rid }).catch(() => {})));
  }

  onFinished(e) {
    const run = this.runs.get(e.request_id);
    if (!run) return;
    if (this.attached || run.own) {
      // the engine's answer: the cached tokens it reported, the rest computed; TTFT as seen by its client
      Object.assign(run, { cached: e.num_cached_tokens, computed: e.num_prompt_tokens - e.num_cached_tokens, prefillS: e.ttft_s ?? 0 });
      this.show(e.request_id);
      run.firstToken?.();
    }
    run.row.dataset.cached = String(e.num_cached_tokens);
    run.row.append(` Finished (${e.reason}${e.error ? `: ${e.error}` : ''}): ${formatInt(e.num_cached_tokens)} tokens came from the cache.`);
    if (this.host.pinnedSeq === e.request_id) this.host.pinnedSeq = null;
  }
}

export const PREFIX_CSS = `
kv-pages .kvp-prefix { margin: .3rem 0; padding: .3rem .6rem; border-left: 3px solid var(--kv-cached); font-size: .88rem; color: var(--kv-fg-soft); }
kv-pages .kvp-prefix-results { font-size: .88rem; padding-left: 1.2rem; }
kv-pages .kvp-free { width: min(24rem, 60vw); }
`;
