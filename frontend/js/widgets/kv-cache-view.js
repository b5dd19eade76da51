// <kv-cache-view prompt="…">: step *your own* request one token at a time and watch its KV
// cache fill — for every layer, a K row and a V row, one column per position. The request is
// submitted held (`hold: true`); "Next token" sends `next`, which computes exactly one more
// token for it and holds it again (nobody else's request waits). Bytes come from the live
// config: kv_bytes_per_token (hello) × tokens stored.
// With no backend it follows a request of the page's recording; "Next token" steps the replay.

import { KvWidget, formatInt, formatBytes } from '../widget-base.js';
import { h } from './lib/svg.js';
import { injectStyle } from './lib/style.js';
import { clientHandlers, withHandlers } from './lib/listen.js';
import { drawCacheGrid, CACHE_GRID_CSS } from './lib/cache-grid.js';
import { visibleText, tokenLabel, idLabel } from './lib/tokens.js';
import { setBusy } from './lib/busy.js';
import { recordedPromptTokens } from './lib/recording.js';
import { modeBadge, showMode } from './lib/controls.js';

const DEFAULT_PROMPT = 'Once upon a time, a little fox';
const DEFAULT_MAX_TOKENS = 24;

const STYLE = `${CACHE_GRID_CSS}
kv-cache-view .kvc-history { font-size: .85rem; max-height: 9rem; overflow-y: auto; margin: .3rem 0; padding-left: 1.4rem; }
kv-cache-view .kvc-text { font-family: var(--kv-font-mono); white-space: pre-wrap; background: var(--kv-bg-soft); padding: .3rem .5rem; border-radius: 4px; }
kv-cache-view .kvc-text mark { background: var(--kv-cat-5); color: #111; }
`;

class KvCacheView extends withHandlers(KvWidget) {
  static events = [];
  static requires = ['requests', 'kv', 'steps'];
  static replayEvents = ['request'];
  static label = 'KV cache, one token at a time';

  setup() {
    injectStyle('kv-cache-view', STYLE);
    const uid = this.getAttribute('aria-labelledby');
    this.promptEl = h('input', { class: 'kvw-input', id: `${uid}-prompt`, type: 'text', size: 34 });
    this.promptEl.value = this.getAttribute('prompt') || DEFAULT_PROMPT;
    this.startBtn = h('button', { type: 'button', class: 'kvw-btn', onclick: () => this.start() }, 'Start');
    this.nextBtn = h('button', {
      type: 'button', class: 'kvw-btn kvw-btn--primary', disabled: true, 'aria-keyshortcuts': 'N',
      onclick: () => this.next(),
    }, 'Next token');
    this.stopBtn = h('button', { type: 'button', class: 'kvw-btn', disabled: true, onclick: () => this.stop() }, 'Stop');
    this.modeBadge = modeBadge();
    this.figuresEl = h('dl', { class: 'kvw-figures', 'aria-label': 'KV cache figures' });
    this.gridEl = h('div', { class: 'kvw-scroll' });
    this.textEl = h('p', { class: 'kvc-text', 'aria-label': 'Text so far' });
    this.historyEl = h('ol', { class: 'kvc-history', 'aria-label': 'Steps' });
    this.errorEl = h('p', { class: 'kvw-error', role: 'alert' });
    this.body.append(
      h('div', { class: 'kvw-row' }, h('label', { for: this.promptEl.id }, 'Prompt'), this.promptEl, this.startBtn, this.modeBadge),
      h('div', { class: 'kvw-row' }, this.nextBtn, this.stopBtn,
        h('span', { class: 'kvw-note' }, 'Press N (or the button) for the next token.')),
      this.errorEl, this.figuresEl, this.gridEl, this.textEl, this.historyEl,
    );
    this.addEventListener('keydown', (e) => {
      if ((e.key === 'n' || e.key === 'N') && !e.target.matches('input, textarea, select') && !this.nextBtn.disabled) {
        e.preventDefault();
        this.next();
      }
    });
    this.setLegend([
      { label: 'K (keys) stored for a position', color: 'var(--kv-cat-1)' },
      { label: 'V (values) stored for a position', color: 'var(--kv-cat-2)' },
      { label: 'empty: positions not computed yet', color: 'var(--kv-border)', shape: 'line' },
      { label: 'outlined: written by the last step', color: 'var(--kv-fg)', shape: 'line' },
      { label: 'dashed line: block boundary (block_size positions)', color: 'var(--kv-fg-soft)', shape: 'line' },
    ]);
    this.handlers = clientHandlers(this, {
      'request.added': (e) => this.onAdded(e),
      'request.token': (e) => this.onToken(e),
      'request.finished': (e) => this.onFinished(e),
      error: (e) => { if (e.request_id && e.request_id === this.rid) this.errorEl.textContent = e.message; },
      engine: (e) => { if (e.reason === 'reset' && this.client.mode === 'replay') this.clear(); },
    });
    this.handlers.attach();
    this.clear();
  }

  clear() {
    this.rid = null;
    this.numPrompt = 0;
    this.promptLabels = [];
    this.outputs = [];           // generated tokens: {id, text}
    this.history = [];           // {tokens_in_cache, added, token}
    this.finished = false;
    this.waiting = false;
    this.fresh = null;
    this.maxTokens = Number(this.getAttribute('max-tokens')) || DEFAULT_MAX_TOKENS;
    this.updateButtons();
    this.requestRender();
  }

  connectedCallback() {
    super.connectedCallback();
    this.onModeChange(this.client.mode);
  }

  onModeChange(mode) {
    showMode(this.modeBadge, mode);
    this.updateButtons();
  }

  onEvent(event) {
    if (event.type === 'hello') this.requestRender();
  }

  get tokensInCache() {
    // After k tokens are drawn, the prompt and the first k-1 of them have K/V stored: the
    // newest token is written by the step that computes the one after it.
    return this.outputs.length ? this.numPrompt + this.outputs.length - 1 : 0;
  }

  updateButtons() {
    const replay = this.client.mode === 'replay';
    const live = Boolean(this.rid) && !this.finished;
    // Busy (a command on its way) is not disabled: a disabled button drops the keyboard focus
    // to <body>, and then N does nothing until the learner tabs back.
    this.startBtn.disabled = replay;
    setBusy(this.startBtn, !replay && Boolean(this.starting));
    this.nextBtn.disabled = replay ? false : !live;
    setBusy(this.nextBtn, !replay && live && this.waiting);
    this.stopBtn.disabled = replay || !live;
    this.dataset.state = this.finished ? 'finished' : (this.waiting ? 'waiting' : (this.rid ? 'held' : 'idle'));
  }

  async start() {
    const prompt = this.promptEl.value.trim();
    if (!prompt || this.starting) return;
    this.errorEl.textContent = '';
    if (this.rid && !this.finished) this.client.command('cancel', { request_id: this.rid }).catch(() => {});
    this.clear();
    this.starting = true;
    this.updateButtons();
    this.client.command('tokenize', { text: prompt }).then((t) => {
      this.promptLabels = t.tokens.map(tokenLabel);
      this.requestRender();
    }).catch(() => {});
    try {
      const ack = await this.client.command('submit', { prompt, hold: true, params: { temperature: 0, max_tokens: this.maxTokens } });
      this.rid = ack.request_id;
      this.numPrompt = ack.num_prompt_tokens;
      this.dataset.requestId = this.rid;
      this.announce(`Request ${this.rid} is held with ${ack.num_prompt_tokens} prompt tokens and an empty cache. Press Next token.`);
    } catch (error) {
      this.errorEl.textContent = this.describeError(error);
    } finally {
      this.starting = false;
      this.updateButtons();
      if (document.activeElement === this.startBtn && !this.nextBtn.disabled) this.nextBtn.focus();   // what the learner presses next
      this.requestRender();
    }
  }

  async next() {
    if (this.client.mode === 'replay') {
      this.client.replay.step();
      return;
    }
    if (!this.rid || this.finished || this.waiting) return;
    this.waiting = true;
    this.updateButtons();
    try {
      await this.client.command('next', { request_id: this.rid });
    } catch (error) {
      this.waiting = false;
      this.errorEl.textContent = this.describeError(error);
      this.updateButtons();
    }
  }

  async stop() {
    if (!this.rid || this.finished) return;
    try {
      await this.client.command('cancel', { request_id: this.rid });
    } catch (error) {
      this.errorEl.textContent = this.describeError(error);
    }
  }

  /** Replay: follow the first held request (else the first) the recording shows. */
  onAdded(e) {
    if (this.client.mode !== 'replay') return;
    if (this.rid && !this.finished) return;
    if (this.rid && this.finished) this.clear();
    this.rid = e.request_id;
    this.numPrompt = e.num_prompt_tokens;
    this.promptLabels = e.prompt_token_ids.map(idLabel);
    recordedPromptTokens(this.client, e.prompt_token_ids).then((t) => {
      if (!t || this.rid !== e.request_id) return;
      t.tokens.forEach((token, i) => { this.promptLabels[i] = tokenLabel(token); });
      this.requestRender();
    });
    if (e.prompt) this.promptEl.value = e.prompt;
    this.maxTokens = e.params.max_tokens;
    this.updateButtons();
    this.requestRender();
  }

  onToken(e) {
    if (e.request_id !== this.rid) return;
    if (e.index < this.outputs.length) return;   // already seen
    const before = this.tokensInCache;
    this.outputs.push({ id: e.token_id, text: e.text });
    const after = this.tokensInCache;
    this.fresh = [before, after];
    this.history.push({ step: e.step, tokens_in_cache: after, added: after - before, token: e.text });
    this.waiting = false;
    this.dataset.tokensInCache = String(after);
    this.announce(`Step ${e.step}: ${after - before} position${after - before === 1 ? '' : 's'} written; ${after} in the cache. New token “${visibleText(e.text)}”.`);
    this.updateButtons();
    this.requestRender();
  }

  onFinished(e) {
    if (e.request_id !== this.rid) return;
    const hadFocus = this.contains(document.activeElement) && document.activeElement !== this.promptEl;
    this.finished = true;
    this.waiting = false;
    this.announce(`The request finished (${e.reason}); its blocks are freed.`);
    this.updateButtons();
    if (hadFocus && document.activeElement !== this.startBtn && !this.startBtn.disabled) this.startBtn.focus();   // Next and Stop are off now
    this.requestRender();
  }

  figures() {
    const hello = this.client.hello;
    const m = hello ? hello.model : null;
    const n = this.tokensInCache;
    const blockSize = hello ? hello.engine.block_size : 16;
    const per = m ? m.kv_bytes_per_token : 0;
    const blocks = Math.ceil(n / blockSize);
    return {
      tokens_in_cache: n, kv_bytes_per_token: per, bytes_used: n * per,
      bytes_per_layer_per_token: m ? per / m.num_layers : 0,
      k_bytes_per_layer_per_token: m ? per / m.num_layers / 2 : 0,
      blocks, block_size: blockSize, bytes_reserved: blocks * blockSize * per,
      num_layers: m ? m.num_layers : 0, num_kv_heads: m ? m.num_kv_heads : 0, head_dim: m ? m.head_dim : 0,
      dtype: m ? m.dtype : null,
    };
  }

  render() {
    const f = this.figures();
    const m = this.client.hello ? this.client.hello.model : null;
    const fig = (label, value, key) => h('div', {}, h('dt', {}, label), h('dd', { 'data-figure': key }, value));
    this.figuresEl.replaceChildren(
      fig('Tokens in the cache', formatInt(f.tokens_in_cache), 'tokens_in_cache'),
      fig('Bytes per token (all layers)', m ? formatBytes(f.kv_bytes_per_token) : '—', 'kv_bytes_per_token'),
      fig('Cache used', m ? formatBytes(f.bytes_used) : '—', 'bytes_used'),
      fig('Blocks reserved', `${formatInt(f.blocks)} × ${f.block_size} slots`, 'blocks'),
      fig('One K (or V) per layer per token', m ? `${formatBytes(f.k_bytes_per_layer_per_token)} = ${f.num_kv_heads}×${f.head_dim}×${m.dtype_bytes} B` : '—', 'k_bytes'),
    );
    const labels = [...this.promptLabels];
    this.outputs.forEach((o, i) => { labels[this.numPrompt + i] = visibleText(o.text) || idLabel(o.id); });
    const capacity = Math.max(this.numPrompt + this.maxTokens, f.tokens_in_cache, 1);
    if (!m) {
      this.gridEl.replaceChildren(h('p', { class: 'kvw-note' }, 'Waiting for the model’s configuration…'));
    } else {
      this.gridEl.replaceChildren(drawCacheGrid({
        layers: m.num_layers, capacity: this.rid ? capacity : Math.max(capacity, 16), filled: f.tokens_in_cache,
        fresh: this.fresh, labels, blockSize: f.block_size, width: Math.min(this.gridEl.clientWidth || this.clientWidth || 640, 960),
      }));
    }
    const promptText = this.promptEl.value;
    const generated = this.outputs.map((o) => o.text).join('');
    this.textEl.replaceChildren(promptText, h('mark', {}, generated));
    this.historyEl.replaceChildren(...this.history.map((s, i) => h('li', {},
      `${i === 0 ? 'prefill' : 'decode'} (engine step ${s.step}): +${s.added} → ${s.tokens_in_cache} positions; drew “${visibleText(s.token)}”`)));
    this.historyEl.scrollTop = this.historyEl.scrollHeight;
    if (!this.rid) this.textEl.replaceChildren(h('span', { class: 'kvw-note' }, this.client.mode === 'replay'
      ? 'Replaying: the cache of the recording’s request fills as it plays; Next token steps it.'
      : 'Press Start: the engine takes your prompt and holds it, with nothing computed yet.'));
  }

  exportData() {
    return { request_id: this.rid, num_prompt_tokens: this.numPrompt, ...this.figures(), outputs: this.outputs, history: this.history, finished: this.finished };
  }
}

customElements.define('kv-cache-view', KvCacheView);
