// <kv-pages prompt="…">: a shared prompt (a system prompt, say) sent with one question, then
// another. The second request's full blocks hash the same as the first's, so they hit the
// prefix cache: ref counts rise while both run, and its time to first token falls.

import { h } from './svg.js';
import { formatInt, formatSeconds } from '../../widget-base.js';

const QUESTIONS = ['What is a byte?', 'Why is the sky blue?', 'How does a bicycle stay up?', 'What is a block table?'];

export class PrefixDemo {
  constructor(host, prompt) {
    this.host = host;
    this.prompt = prompt;
    this.sent = 0;
    this.mine = new Map();   // request id -> row element
    this.button = h('button', { type: 'button', class: 'kvw-btn kvw-btn--primary', onclick: () => this.send() }, 'Send the prompt with a question');
    this.list = h('ul', { class: 'kvp-prefix-results', 'aria-live': 'polite' });
    this.errorEl = h('p', { class: 'kvw-error', role: 'alert' });
    this.el = h('section', { class: 'kvw-panel', 'aria-label': 'Shared prefix' },
      h('h4', {}, 'A shared prefix'),
      h('p', { class: 'kvw-note' }, 'Send the prompt below with a question, then again with another. Its full blocks are hashed; the second request finds them in the cache and skips computing them.'),
      h('blockquote', { class: 'kvp-prefix' }, prompt),
      h('div', { class: 'kvw-row' }, this.button), this.errorEl, this.list);
  }

  async send() {
    this.errorEl.textContent = '';
    const question = QUESTIONS[this.sent % QUESTIONS.length];
    this.sent += 1;
    try {
      const ack = await this.host.client.command('submit', {
        prompt: `${this.prompt}\n\nQuestion: ${question}`, params: { temperature: 0, max_tokens: 16 },
      });
      const row = h('li', { 'data-request': ack.request_id }, `${ack.request_id} (“${question}”): ${formatInt(ack.num_prompt_tokens)} prompt tokens, running…`);
      this.mine.set(ack.request_id, row);
      this.list.append(row);
      this.host.pinnedSeq = ack.request_id;
      this.host.setHighlight(ack.request_id);
    } catch (error) {
      this.errorEl.textContent = this.host.describeError(error);
    }
  }

  onFinished(e) {
    const row = this.mine.get(e.request_id);
    if (!row) return;
    row.dataset.cached = String(e.num_cached_tokens);
    row.textContent = `${e.request_id}: ${formatInt(e.num_prompt_tokens)} prompt tokens, ${formatInt(e.num_cached_tokens)} from the prefix cache`
      + `${e.ttft_s !== null ? `, first token after ${formatSeconds(e.ttft_s)}` : ''} (${e.reason}).`;
    if (this.host.pinnedSeq === e.request_id) this.host.pinnedSeq = null;
  }
}

export const PREFIX_CSS = `
kv-pages .kvp-prefix { margin: .3rem 0; padding: .3rem .6rem; border-left: 3px solid var(--kv-cached); font-size: .88rem; color: var(--kv-fg-soft); }
kv-pages .kvp-prefix-results { font-size: .88rem; padding-left: 1.2rem; }
`;
