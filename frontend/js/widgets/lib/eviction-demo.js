// Eviction order under pressure, step by step in the learner's own sandbox (the engine's
// BlockManager class, 8 blocks of 4 slots, drawn by the sandbox grid below the pool): two
// sequences share a prefix and finish; a bigger one then needs more blocks than were never
// used, and the block manager evicts the least recently freed cached blocks first. A
// finished sequence frees its blocks last-first, so the unique tails go before the shared
// prefix. Which blocks were evicted is read from the sandbox's own replies (a cached block's
// hash gone, the block now someone's), never predicted by the page. Replaying, the steps
// are the recording's own sandbox replies (scripts/make_recordings.py sends these STEPS).

import { h } from './svg.js';
import { recordedOfType } from './recording.js';

const STEPS = [
  { cmd: { op: 'reset', num_blocks: 8, block_size: 4 }, text: 'Reset your sandbox to 8 blocks of 4 slots.' },
  { cmd: { op: 'allocate', seq: 'A', tokens: 12 }, text: 'A: 12 tokens, 3 full blocks, each hashed.' },
  { cmd: { op: 'allocate', seq: 'B', tokens: 12, prefix_of: 'A', prefix_tokens: 8 }, text: 'B: the same first 8 tokens as A, then 4 of its own.' },
  { cmd: { op: 'free', seq: 'A' }, text: 'A finishes.' },
  { cmd: { op: 'free', seq: 'B' }, text: 'B finishes.' },
  { cmd: { op: 'allocate', seq: 'C', tokens: 24 }, text: 'C: 24 new tokens, 6 blocks: more than the never-used ones.' },
  { cmd: { op: 'allocate', seq: 'D', tokens: 8 }, text: 'D: 8 new tokens, 2 blocks: the last cached ones.' },
];

export class EvictionDemo {
  constructor(host) {
    this.host = host;
    this.next = 0;
    this.roles = new Map();      // block id -> what it held ("A's own block", "the shared prefix")
    this.before = null;          // the sandbox state before the last step
    this.stepButton = h('button', { type: 'button', class: 'kvw-btn', onclick: () => this.step() }, '');
    this.log = h('ol', { class: 'kvp-evict-log', 'aria-live': 'polite', 'aria-label': 'Eviction steps and what the block manager did' });
    this.errorEl = h('p', { class: 'kvw-error', role: 'alert' });
    this.el = h('section', { class: 'kvw-panel kvp-evict', 'aria-label': 'Eviction order under pressure' },
      h('h4', {}, 'Eviction order under pressure'),
      h('p', { class: 'kvw-note' }, 'The engine’s pool is too big, and shared, to fill on purpose; your own sandbox (below the pool) runs the same block manager in 8 blocks. Step through: watch the sandbox grid, and the list here says which cached blocks each allocation took back, as the block manager reported.'),
      h('div', { class: 'kvw-row' }, this.stepButton), this.errorEl, this.log);
    this.showButton();
  }

  showButton() {
    const done = this.next >= STEPS.length;
    this.stepButton.textContent = done ? 'Start again' : `Step ${this.next + 1} of ${STEPS.length}: ${STEPS[this.next].text}`;
    this.stepButton.setAttribute('aria-label', done ? 'Start the eviction steps again (resets your sandbox)' : `Eviction step ${this.next + 1} of ${STEPS.length}: ${STEPS[this.next].text}`);
    this.stepButton.disabled = !this.host.sandbox || this.busy || (!this.host.isLive && this.recorded === null);
    if (!this.host.isLive && this.recorded === null) this.stepButton.textContent += ' (needs the live engine)';
  }

  async step() {
    if (this.next >= STEPS.length) {
      this.next = 0;
      this.log.replaceChildren();
    }
    const { cmd, text } = STEPS[this.next];
    this.busy = true;
    this.showButton();
    this.errorEl.textContent = '';
    try {
      const reply = this.host.isLive ? await this.host.sandbox.send(cmd) : await this.recordedStep(this.next);
      if (!reply) throw new Error(this.host.sandbox.errorEl?.textContent || 'the sandbox refused the step');
      this.log.append(h('li', { 'data-step': String(this.next + 1) }, `${text} ${this.describe(cmd, reply)}`));
      this.before = reply;
      this.next += 1;
    } catch (error) {
      this.errorEl.textContent = this.host.describeError(error);
    } finally {
      this.busy = false;
      this.showButton();
    }
  }

  /** Replaying: the recording's reply to step i, shown in the sandbox grid too. The
   *  recording's replies to these steps are the run of sandbox replies whose ops match. */
  async recordedStep(i) {
    if (this.recorded === undefined) {
      const all = await recordedOfType(this.host.client, 'sandbox');
      const ops = STEPS.map((s) => s.cmd.op);
      const start = all.findIndex((_, k) => ops.every((op, j) => all[k + j]?.op === op));
      this.recorded = start < 0 ? null : { all, start };
    }
    if (this.recorded === null) throw new Error('This recording holds no eviction steps; they need the live engine.');
    const index = this.recorded.start + i;
    this.host.sandbox.showRecorded(index);
    return this.recorded.all[index];
  }

  /** What the block manager did, from its reply (and the state before it). */
  describe(cmd, st) {
    const table = (name) => st.seqs.find((s) => s.name === name)?.block_table ?? [];
    if (cmd.op === 'reset') {
      this.roles.clear();
      return '';
    }
    if (cmd.op === 'allocate' && cmd.seq === 'A') {
      const t = table('A');
      t.forEach((b, i) => this.roles.set(b, i < 2 ? 'the shared prefix' : 'A’s own block'));
      return `It holds blocks ${t.join(', ')}.`;
    }
    if (cmd.op === 'allocate' && cmd.seq === 'B') {
      const t = table('B');
      this.roles.set(t[t.length - 1], 'B’s own block');
      const hits = st.last?.hits ?? 0;
      return `${hits} block${hits === 1 ? '' : 's'} reused from A (ref count 2), block ${t[t.length - 1]} new.`;
    }
    if (cmd.op === 'free') {
      return `Its blocks are freed last block first, and keep their hashes: ${st.num_cached} cached, ${st.num_free} free.`;
    }
    const t = table(cmd.seq);
    const was = new Map(this.before.blocks.map((b) => [b.id, b]));
    const evicted = t.filter((b) => was.get(b)?.hash && was.get(b).ref === 0);
    const fresh = t.filter((b) => !was.get(b)?.hash);
    const kept = st.blocks.filter((b) => b.ref === 0 && b.hash).map((b) => `${b.id} (${this.roles.get(b.id) ?? 'cached'})`);
    const named = (b) => `${b} (${this.roles.get(b) ?? 'cached'})`;
    const parts = [];
    if (fresh.length) parts.push(`the never-used ${fresh.join(', ')} first`);
    if (evicted.length) parts.push(`${fresh.length ? 'then ' : ''}the cached ${evicted.map(named).join(', ')}, least recently freed first, evicting their hashes`);
    const prefixOutlived = kept.length && evicted.some((b) => this.roles.get(b) !== 'the shared prefix')
      && st.blocks.some((b) => b.ref === 0 && b.hash && this.roles.get(b.id) === 'the shared prefix');
    return `${cmd.seq} took block${t.length === 1 ? '' : 's'} ${t.join(', ')}: ${parts.join(', ')}.`
      + (kept.length ? ` Still cached: ${kept.join(', ')}.` : ' Nothing is cached any more.')
      + (prefixOutlived ? ' The shared prefix outlived the tails: B freed its own block before the prefix blocks.' : '');
  }
}

export const EVICTION_CSS = `
kv-pages .kvp-evict-log { font-size: .88rem; padding-left: 1.4rem; }
kv-pages .kvp-evict > p:empty { display: none; }
`;
