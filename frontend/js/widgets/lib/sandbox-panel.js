// The block-manager sandbox of <kv-pages>: the learner's own small BlockManager on the
// server (`sandbox` commands), drawn from the state each reply reports — blocks with their
// slots, owners, ref counts and hashes; each sequence's block table; paged vs contiguous
// fragmentation. In replay it pages through the sandbox replies the recording holds.

import { h, svg, uniqueId } from './svg.js';
import { formatInt } from '../../widget-base.js';
import { recordedOfType } from './recording.js';

const NAMES = 'ABCDEFGHIJKLMNOPQRSTUVWXYZ';

export class SandboxPanel {
  /** host: the widget (client, announce, describeError); palette: OwnerPalette. */
  constructor(host, palette) {
    this.host = host;
    this.palette = palette;
    this.state = null;
    this.recorded = null;
    this.recordedIndex = 0;
    this.highlight = null;
    this.el = h('section', { class: 'kvw-panel kvp-sandbox', 'aria-label': 'Block manager sandbox' });
    const id = `${host.getAttribute('aria-labelledby')}-sb`;
    const field = (label, input) => h('label', { class: 'kvp-field' }, label, input);
    this.seqIn = h('input', { class: 'kvw-input', type: 'text', value: 'A', size: 4, maxlength: 32, 'aria-label': 'Sequence name', id: `${id}-seq` });
    this.tokIn = h('input', { class: 'kvw-input', type: 'number', value: 6, min: 1, max: 64, 'aria-label': 'Tokens' });
    this.prefixSel = h('select', { class: 'kvw-select', 'aria-label': 'Copy its first tokens from' }, h('option', { value: '' }, 'nothing (fresh tokens)'));
    this.forkIn = h('input', { class: 'kvw-input', type: 'text', value: 'B', size: 4, maxlength: 32, 'aria-label': 'Name of the fork' });
    this.bsIn = h('input', { class: 'kvw-input', type: 'number', value: 4, min: 1, max: 64, 'aria-label': 'Block size for reset' });
    this.nbIn = h('input', { class: 'kvw-input', type: 'number', value: 32, min: 1, max: 256, 'aria-label': 'Number of blocks for reset' });
    const btn = (text, fn, extra = {}) => h('button', { type: 'button', class: 'kvw-btn', onclick: fn, ...extra }, text);
    this.buttons = [
      btn('Allocate', () => this.send({ op: 'allocate', seq: this.seq(), tokens: this.tokens(), ...(this.prefixSel.value ? { prefix_of: this.prefixSel.value } : {}) }), { 'data-op': 'allocate' }),
      btn('Append', () => this.send({ op: 'append', seq: this.seq(), tokens: this.tokens() }), { 'data-op': 'append' }),
      btn('Free', () => this.send({ op: 'free', seq: this.seq() }), { 'data-op': 'free' }),
      btn('Fork', () => this.send({ op: 'fork', seq: this.seq(), new_seq: this.forkIn.value.trim() }), { 'data-op': 'fork' }),
      btn('Reset', () => this.send({ op: 'reset', block_size: Number(this.bsIn.value) || 4, num_blocks: Number(this.nbIn.value) || 32 }), { 'data-op': 'reset' }),
    ];
    this.replayNav = h('div', { class: 'kvw-row', hidden: true },
      btn('◀ Previous', () => this.showRecorded(this.recordedIndex - 1)),
      btn('Next ▶', () => this.showRecorded(this.recordedIndex + 1)),
      this.replayPos = h('span', { class: 'kvw-note' }));
    this.lastEl = h('p', { class: 'kvp-last', 'aria-live': 'polite' });
    this.errorEl = h('p', { class: 'kvw-error', role: 'alert' });
    this.gridEl = h('div', { class: 'kvw-scroll' });
    this.seqsEl = h('ul', { class: 'kvp-tables', 'aria-label': 'Sandbox block tables' });
    this.fragEl = h('div', { class: 'kvp-frag' });
    this.el.append(
      h('h4', {}, 'Sandbox: your own block manager'),
      h('p', { class: 'kvw-note' }, 'A real BlockManager on the server, just for you. Allocate a sequence, append to it, fork it (the fork shares all its blocks; the partly filled last one is copied when either first appends to it), allocate another that copies its first tokens (full blocks hit the prefix cache), free them, and watch ref counts and waste.'),
      h('div', { class: 'kvw-row' }, field('Sequence ', this.seqIn), field('tokens ', this.tokIn), field('copy first tokens from ', this.prefixSel)),
      h('div', { class: 'kvw-row' }, ...this.buttons.slice(0, 3), field('Fork it as ', this.forkIn), this.buttons[3]),
      h('div', { class: 'kvw-row' }, field('Reset with block size ', this.bsIn), field('blocks ', this.nbIn), this.buttons[4]),
      this.replayNav, this.errorEl, this.lastEl, this.gridEl, this.seqsEl, this.fragEl,
    );
    this.el.addEventListener('keydown', (e) => {
      if (e.key === 'Enter' && e.target.matches('input') && !e.target.closest('.kvp-tables')) {
        e.preventDefault();
        this.buttons[0].click();
      }
    });
  }

  seq() { return this.seqIn.value.trim(); }

  tokens() { return Math.max(1, Math.min(64, Number(this.tokIn.value) || 1)); }

  async start() {
    if (this.host.client.mode === 'replay') return this.enterReplay();
    this.replayNav.hidden = true;
    this.buttons.forEach((b) => { b.disabled = false; });
    return this.send({ op: 'state' });
  }

  async send(cmd) {
    this.errorEl.textContent = '';
    try {
      const reply = await this.host.client.command('sandbox', cmd);
      this.show(reply);
      if (cmd.op === 'allocate' || cmd.op === 'fork') this.suggestName();
      return reply;
    } catch (error) {
      if (error.code === 'replay') return this.enterReplay();
      this.errorEl.textContent = this.host.describeError(error);
      return null;
    }
  }

  suggestName() {
    const used = new Set((this.state?.seqs || []).map((s) => s.name));
    const free = [...NAMES].filter((n) => !used.has(n));
    if (free.length) this.forkIn.value = free[0];
  }

  async enterReplay() {
    this.buttons.forEach((b) => { b.disabled = true; });
    this.replayNav.hidden = false;
    this.recorded = await recordedOfType(this.host.client, 'sandbox');
    if (!this.recorded.length) {
      this.errorEl.textContent = 'The sandbox needs the live engine; this recording holds no sandbox session.';
      return null;
    }
    this.showRecorded(0);
    return this.recorded[0];
  }

  showRecorded(i) {
    if (!this.recorded || !this.recorded.length) return;
    this.recordedIndex = Math.max(0, Math.min(this.recorded.length - 1, i));
    this.replayPos.textContent = `recorded sandbox reply ${this.recordedIndex + 1} of ${this.recorded.length}`;
    this.show(this.recorded[this.recordedIndex]);
  }

  show(state) {
    this.state = state;
    this.shown = (this.shown || 0) + 1;
    this.host.dataset.sandboxReplies = String(this.shown);
    const names = state.seqs.map((s) => s.name);
    const current = this.prefixSel.value;
    this.prefixSel.replaceChildren(h('option', { value: '' }, 'nothing (fresh tokens)'), ...names.map((n) => h('option', { value: n }, n)));
    if (names.includes(current)) this.prefixSel.value = current;
    const last = state.last || {};
    const parts = Object.entries(last).filter(([k]) => k !== 'op').map(([k, v]) => `${k.replace(/_/g, ' ')} ${v}`);
    this.lastEl.textContent = `${last.op || state.op}${parts.length ? `: ${parts.join(', ')}` : ''} — ${state.num_free} of ${state.num_blocks} blocks free, ${state.num_cached} cached`;
    this.draw();
  }

  setHighlight(name) {
    this.highlight = name;
    this.draw();
  }

  draw() {
    const st = this.state;
    if (!st) return;
    const bs = st.block_size;
    const highlighted = new Set();
    const logical = new Map();
    const hiSeq = st.seqs.find((s) => s.name === this.highlight);
    if (hiSeq) hiSeq.block_table.forEach((b, i) => { highlighted.add(b); logical.set(b, i); });
    const slot = Math.max(6, Math.min(16, Math.floor(120 / bs)));
    const bw = slot * bs + 6;
    const bh = slot + 40;
    const cols = Math.max(1, Math.floor(Math.min(this.el.clientWidth || 700, 900) / (bw + 6)));
    const rows = Math.ceil(st.blocks.length / cols);
    const W = cols * (bw + 6);
    const H = rows * (bh + 6);
    const root = svg('svg', {
      class: 'kvw-svg kvp-sgrid', width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: 'img',
      'aria-label': `Sandbox pool: ${st.num_blocks} blocks of ${bs} slots; ${st.num_blocks - st.num_free} in use, ${st.num_cached} cached`,
    });
    const hatch = uniqueId('kvp-hatch');
    root.append(svg('defs', {}, svg('pattern', { id: hatch, width: 5, height: 5, patternUnits: 'userSpaceOnUse', patternTransform: 'rotate(45)' },
      svg('line', { x1: 0, y1: 0, x2: 0, y2: 5, class: 'kvp-hatchline' }))));
    for (const b of st.blocks) {
      const x = (b.id % cols) * (bw + 6);
      const y = Math.floor(b.id / cols) * (bh + 6);
      const state = b.ref > 0 ? (b.ref > 1 ? 'shared' : 'used') : (b.hash ? 'cached' : 'free');
      const g = svg('g', {
        transform: `translate(${x},${y})`, class: `kvp-sblock kvp-${state}${hiSeq && !highlighted.has(b.id) ? ' kvp-dim' : ''}`,
        'data-block': b.id, 'data-ref': b.ref, 'data-filled': b.filled, 'data-hash': b.hash || '', 'data-owners': b.owners.join(','),
      });
      const frame = svg('rect', { x: 0, y: 0, width: bw, height: bh, rx: 3, class: 'kvp-sframe' });
      if (state === 'cached') frame.style.fill = `url(#${hatch})`;
      g.append(frame);
      g.append(svg('text', { x: 3, y: 10, 'font-size': 9, class: 'kvw-soft' }, `#${b.id}${logical.has(b.id) ? ` ← ${this.highlight}[${logical.get(b.id)}]` : ''}`));
      const colour = b.owners.length ? this.palette.cssColour(b.owners[0]) : null;
      for (let k = 0; k < bs; k += 1) {
        const filled = k < b.filled;
        const r = svg('rect', { x: 3 + k * slot, y: 13, width: slot - 1, height: slot - 1, class: filled ? 'kvp-slot kvp-slot--on' : 'kvp-slot' });
        if (filled && colour) r.style.fill = colour;
        g.append(r);
      }
      const label = b.ref > 0 ? `ref ${b.ref}` : (b.hash ? 'cached' : 'free');
      g.append(svg('text', { x: 3, y: bh - 15, 'font-size': 9, class: b.ref > 1 ? 'kvp-reflabel' : '' }, label));
      if (b.hash) g.append(svg('text', { x: 3, y: bh - 4, 'font-size': 9, class: 'kvw-soft' }, `hash ${b.hash}`));
      g.append(svg('title', {}, `block ${b.id}: ${label}${b.hash ? `, hash ${b.hash}` : ''}; owners ${b.owners.join(', ') || 'none'}; ${b.filled}/${bs} slots`));
      root.append(g);
    }
    this.gridEl.replaceChildren(root);

    this.seqsEl.replaceChildren(...st.seqs.map((s) => {
      const li = h('li', { tabindex: '0', 'data-seq': s.name, 'aria-label': `${s.name}: ${s.num_tokens} tokens in blocks ${s.block_table.join(', ')}; ${s.cached_tokens} cached` },
        h('strong', { style: `color:${this.palette.cssColour(s.name)}` }, `■ ${s.name}`),
        ` ${s.num_tokens} tokens${s.cached_tokens ? ` (${s.cached_tokens} from the cache)` : ''}: `,
        ...s.block_table.map((b, i) => h('span', { class: 'kvp-chip' }, `${i}→${b}`)));
      const on = () => this.setHighlight(s.name);
      const off = () => this.setHighlight(null);
      li.addEventListener('pointerenter', on);
      li.addEventListener('pointerleave', off);
      li.addEventListener('focus', on);
      li.addEventListener('blur', off);
      return li;
    }));

    const p = st.fragmentation.paged;
    const c = st.fragmentation.contiguous;
    const bar = (used, reserved, max) => h('div', { class: 'kvw-bar', 'aria-hidden': 'true' },
      h('span', { style: `width:${max ? (100 * reserved) / max : 0}%;background:var(--kv-free)` }),
      h('span', { style: `width:${max ? (100 * Math.min(used, reserved)) / max : 0}%;background:var(--kv-used)` }));
    const max = Math.max(p.reserved_slots, c.reserved_slots, 1);
    this.fragEl.replaceChildren(
      h('h5', {}, 'Slots reserved vs used'),
      h('p', { 'data-figure': 'paged' }, `Paged: ${formatInt(p.reserved_slots)} reserved, ${formatInt(p.used_slots)} used, ${formatInt(p.shared_slots_saved)} saved by sharing, ${formatInt(p.internal_waste_slots)} empty in last blocks — waste ${(p.waste_fraction * 100).toFixed(1)}%`),
      bar(p.reserved_slots - p.internal_waste_slots, p.reserved_slots, max),
      h('p', { 'data-figure': 'contiguous' }, `Contiguous (max_model_len = ${st.max_model_len} each): ${formatInt(c.reserved_slots)} reserved, ${formatInt(c.used_slots)} used — waste ${(c.waste_fraction * 100).toFixed(1)}%`),
      bar(c.used_slots, c.reserved_slots, max),
    );
  }
}

export const SANDBOX_CSS = `
kv-pages .kvp-field { font-size: .88rem; display: inline-flex; align-items: center; gap: .3rem; }
kv-pages .kvp-sframe { fill: var(--kv-surface); stroke: var(--kv-border); }
kv-pages .kvp-shared .kvp-sframe { stroke: var(--kv-fg); stroke-width: 2.5; }
kv-pages .kvp-cached .kvp-sframe { stroke: var(--kv-cached); }
kv-pages .kvp-hatchline { stroke: var(--kv-cached); stroke-width: 1.5; }
kv-pages .kvp-cached .kvp-slot { fill: color-mix(in srgb, var(--kv-cached) 35%, transparent); }
kv-pages .kvp-slot { fill: var(--kv-free); }
kv-pages .kvp-dim { opacity: .3; }
kv-pages .kvp-reflabel { font-weight: 700; }
kv-pages .kvp-sgrid text { fill: var(--kv-fg); }
kv-pages .kvp-tables { list-style: none; padding: 0; margin: .4rem 0; font-size: .88rem; }
kv-pages .kvp-tables li { padding: .15rem .3rem; border-radius: 4px; }
kv-pages .kvp-tables li:hover, kv-pages .kvp-tables li:focus { background: var(--kv-bg-soft); }
kv-pages .kvp-chip { display: inline-block; font-family: var(--kv-font-mono); font-size: .8rem; border: 1px solid var(--kv-border); border-radius: 3px; padding: 0 .25rem; margin: 0 .15rem; }
kv-pages .kvp-frag p { margin: .3rem 0 .15rem; font-size: .88rem; }
kv-pages .kvp-frag h5 { margin: .5rem 0 .2rem; font-size: .9rem; }
kv-pages .kvp-last { font-family: var(--kv-font-mono); font-size: .85rem; }
`;
