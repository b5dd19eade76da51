// <kv-ring-allreduce>: chapter 19's ring all-reduce. N GPUs (2…8) in a ring, each holding the
// vector to be summed cut into N pieces. Reduce-scatter: N − 1 rounds, in each every GPU
// sends one piece to its neighbour, who adds it to its own; then every GPU holds one piece
// summed over all. All-gather: N − 1 more rounds passing the summed pieces on. Every round
// each GPU sends 1/N of the vector, so over the 2(N − 1) rounds it sends 2(N − 1)/N of it:
// the rounds (each a wait) grow with N, the bytes per GPU hardly do. Beside it, the bytes the
// engine measured between its ranks (`allreduce_bytes` of each `step`, on a server run with
// --tensor-parallel-size 2: live when this server is one, else its recording), taken apart
// into its all-reduces and the logits gather from the model's shape.

import { KvWidget, formatBytes, formatInt, heatColor, heatTextColor } from '../widget-base.js';
import { h, svg } from './lib/svg.js';
import { injectStyle } from './lib/style.js';
import { namedRecordingEvents } from './lib/recording.js';
import { runBusy } from './lib/busy.js';
import { Stepper, controlRow, modeBadge, showMode } from './lib/controls.js';

const RECORDING = 'ring';
const SIZE = 380;
const STYLE = `
kv-ring-allreduce .kra-ring { border: 1px solid var(--kv-border); border-radius: var(--kv-radius, 6px); padding: .5rem .6rem; }
kv-ring-allreduce .kra-layout { display: flex; flex-wrap: wrap; gap: .5rem 1rem; align-items: flex-start; }
kv-ring-allreduce .kra-layout > svg { flex: 0 1 ${SIZE}px; }
kv-ring-allreduce .kra-side { flex: 1 1 16rem; min-width: 0; }
kv-ring-allreduce table { border-collapse: collapse; font-size: .85rem; font-variant-numeric: tabular-nums; width: 100%; }
kv-ring-allreduce th, kv-ring-allreduce td { padding: .15rem .35rem; border-bottom: 1px solid var(--kv-border); text-align: right; }
kv-ring-allreduce th { font-weight: 600; color: var(--kv-fg-soft); font-size: .78rem; }
kv-ring-allreduce tr[aria-current=true] td { font-weight: 700; background: var(--kv-bg-soft); }
kv-ring-allreduce .kra-phase { font-size: .95rem; margin: 0 0 .3rem; }
kv-ring-allreduce .kra-arrow { stroke: var(--kv-fg-soft); stroke-width: 1.5; fill: none; }
kv-ring-allreduce .kra-arrow-label { font-size: 10px; }
`;

const plural = (n, one, many = `${one}s`) => `${formatInt(n)} ${n === 1 ? one : many}`;

/** The sends of round r (0-based) of a ring all-reduce over n ranks: rank i sends piece c
 *  to rank i + 1, adding (reduce-scatter) or copying (all-gather). */
export function roundSends(n, r) {
  const gather = r >= n - 1;
  const k = gather ? r - (n - 1) : r;
  return Array.from({ length: n }, (_, i) => ({ from: i, to: (i + 1) % n, piece: (((gather ? i + 1 : i) - k) % n + n) % n, gather }));
}

/** How many ranks' values each rank's pieces hold after `rounds` rounds: [rank][piece]. */
export function ringState(n, rounds) {
  let state = Array.from({ length: n }, () => Array(n).fill(1));
  for (let r = 0; r < rounds; r += 1) {
    const next = state.map((row) => row.slice());
    for (const s of roundSends(n, r)) next[s.to][s.piece] = s.gather ? state[s.from][s.piece] : state[s.to][s.piece] + state[s.from][s.piece];
    state = next;
  }
  return state;
}

/** The engine's measured bytes of a step, taken apart: (2 × layers + 1) all-reduces of one
 *  hidden vector per token, and each sampled row's logits slice gathered to the others. */
function stepBytes(e, model, ranks) {
  const tokens = e.num_batched_tokens;
  const samples = e.seqs.filter((s) => s.samples).length;
  const reduces = 2 * model.num_layers + 1;
  const payload = tokens * model.hidden_size * model.dtype_bytes;
  const gather = samples * (model.vocab_size / ranks) * model.dtype_bytes * (ranks - 1);
  return { step: e.step, tokens, samples, measured: e.allreduce_bytes, reduces, payload, gather, computed: reduces * payload + gather, ranks };
}

class KvRingAllreduce extends KvWidget {
  static events = ['step'];
  static label = 'Ring all-reduce, round by round';

  setup() {
    injectStyle('kv-ring-allreduce', STYLE);
    this.n = 4;
    this.round = 0;
    this.recorded = [];
    this.live = [];
    this.mine = new Set();
    const uid = this.getAttribute('aria-labelledby');
    this.markerId = `${uid}-head`;
    this.nSelect = h('select', { class: 'kvw-select', id: `${uid}-n`, onchange: () => this.setN(Number(this.nSelect.value)) },
      ...[2, 3, 4, 5, 6, 7, 8].map((n) => h('option', { value: n, selected: n === this.n }, `${n} GPUs`)));
    this.stepper = new Stepper({ earlier: '◀ Round back', later: 'Next round ▶',
      index: () => this.round, count: () => this.rounds + 1, go: (r) => this.setRound(r) });
    this.playButton = h('button', { type: 'button', class: 'kvw-btn', onclick: () => this.play() }, 'Play all rounds');
    this.sendButton = h('button', { type: 'button', class: 'kvw-btn kvw-btn--primary', onclick: () => this.sendLive() }, 'Send a request to the ranks');
    this.modeBadge = modeBadge();
    this.errorEl = h('p', { class: 'kvw-error', role: 'alert' });
    this.phaseEl = h('p', { class: 'kra-phase', 'data-phase': '' });
    this.ringSvg = svg('svg', { class: 'kvw-svg', role: 'img', viewBox: `0 0 ${SIZE} ${SIZE}`, width: SIZE, height: SIZE });
    this.figures = h('dl', { class: 'kvw-figures' });
    this.scaling = h('table', {});
    this.engineEl = h('div', { class: 'kvw-panel' });
    this.ring = this.stepper.panel({ class: 'kra-ring', 'aria-roledescription': 'ring all-reduce',
      'aria-label': 'The ring. Left and right arrows: a round back or forward; Home and End: the start and the end.' },
    this.phaseEl, h('div', { class: 'kra-layout' }, this.ringSvg, h('div', { class: 'kra-side' }, this.figures,
      h('div', { class: 'kvw-scroll' }, this.scaling))));
    this.body.append(
      controlRow('The ring', h('label', { for: this.nSelect.id }, 'Ring of'), this.nSelect, ...this.stepper.buttons, this.playButton),
      this.ring,
      controlRow('Your own run', this.sendButton, this.modeBadge),
      this.errorEl, this.engineEl);
    this.setLegend([
      { label: 'a piece holding one GPU’s own values (light) … summed over all GPUs (dark)', color: heatColor(0.6) },
      { label: 'arrow: the piece each GPU sends its neighbour this round', color: 'var(--kv-fg-soft)', shape: 'line' },
    ]);
    this.updateMode(this.client.mode);
    namedRecordingEvents(RECORDING).then((events) => {
      const hello = events.find((e) => e.type === 'hello');
      this.recordedModel = hello.model;
      const ranks = hello.engine.tensor_parallel_size;
      this.recorded = events.filter((e) => e.type === 'step' && e.allreduce_bytes !== undefined).map((e) => stepBytes(e, hello.model, ranks));
      this.dataset.recordedSteps = String(this.recorded.length);
      this.requestRender();
    });
  }

  get tensorParallel() {
    const hello = this.client.hello;
    return this.isLive && hello && hello.engine && hello.engine.tensor_parallel_size > 1 ? hello : null;
  }

  onModeChange(mode) { this.updateMode(mode); }

  updateMode(mode) {
    showMode(this.modeBadge, mode);
    this.sendButton.disabled = !this.tensorParallel;
    this.requestRender();
  }

  onEvent(event) {
    if (event.type === 'hello') { this.updateMode(this.client.mode); return; }
    const hello = this.tensorParallel;
    if (!hello || event.type !== 'step' || event.allreduce_bytes === undefined || !event.num_batched_tokens) return;
    this.live.push(stepBytes(event, hello.model, hello.engine.tensor_parallel_size));
    if (this.live.length > 200) this.live.shift();
    this.dataset.liveSteps = String(this.live.length);
    this.requestRender();
  }

  sendLive() {
    if (!this.tensorParallel) return;
    runBusy(this, this.sendButton, this.errorEl, async () => {
      const ack = await this.client.command('submit', { prompt: 'Two ranks share one model and every step they', params: { temperature: 0, max_tokens: 8, ignore_eos: true } });
      this.mine.add(ack.request_id);
      this.announce(`Request ${ack.request_id} sent: its steps’ bytes appear below.`);
    });
  }

  // -- the ring ------------------------------------------------------------------------------
  get rounds() { return 2 * (this.n - 1); }

  setN(n) {
    this.n = n;
    this.nSelect.value = String(n);
    this.setRound(0);
  }

  setRound(r) {
    this.stopPlaying();
    this.round = Math.max(0, Math.min(this.rounds, r));
    this.announce(this.phaseText());
    this.requestRender();
  }

  play() {
    if (this.timer) { this.stopPlaying(); return; }
    if (this.round >= this.rounds) this.round = 0;
    if (window.matchMedia('(prefers-reduced-motion: reduce)').matches) { this.setRound(this.rounds); return; }
    this.playButton.textContent = 'Pause';
    this.timer = setInterval(() => {
      this.round += 1;
      this.requestRender();
      if (this.round >= this.rounds) this.stopPlaying();
    }, 900);
  }

  stopPlaying() {
    if (!this.timer) return;
    clearInterval(this.timer);
    this.timer = null;
    this.playButton.textContent = 'Play all rounds';
  }

  phaseText() {
    const n = this.n;
    if (this.round === 0) return `Before the first round: each of the ${n} GPUs holds its own vector, cut into ${n} pieces.`;
    if (this.round < n) return `Reduce-scatter, round ${this.round} of ${n - 1}: each GPU sent one piece to its neighbour, who added it to its own.`
      + (this.round === n - 1 ? ' Now each GPU holds one piece summed over all.' : '');
    const k = this.round - (n - 1);
    return `All-gather, round ${k} of ${n - 1}: each GPU passed a summed piece on.${this.round === this.rounds ? ' Every GPU now holds the whole sum.' : ''}`;
  }

  /** The payload of one all-reduce: the engine's (one hidden vector per token) in its
   *  largest decode step when there is one, else 1 MiB. */
  get payload() {
    const steps = this.live.length ? this.live : this.recorded;
    const decode = steps.filter((s) => s.samples === s.tokens).reduce((a, s) => (!a || s.tokens > a.tokens ? s : a), null)
      || steps[steps.length - 1];
    return decode ? { bytes: decode.payload, from: decode } : { bytes: 1 << 20, from: null };
  }

  render() {
    const n = this.n;
    this.dataset.n = String(n);
    this.dataset.rounds = String(this.rounds);
    this.dataset.round = String(this.round);
    this.stepper.update();
    this.phaseEl.textContent = this.phaseText();
    this.drawRing();
    const { bytes, from } = this.payload;
    const perRound = bytes / n;
    const perGpu = (2 * (n - 1) * bytes) / n;
    this.dataset.perGpu = String(perGpu);
    this.dataset.payload = String(bytes);
    const fig = (label, value, key) => h('div', {}, h('dt', {}, label), h('dd', { [`data-${key}`]: '' }, value));
    this.figures.replaceChildren(
      fig('vector summed', formatBytes(bytes), 'size'),
      fig('rounds, one after another', `2 × (${n} − 1) = ${this.rounds}`, 'rounds'),
      fig('each GPU sends per round', formatBytes(perRound), 'per-round'),
      fig('each GPU sends in all', `${formatBytes(this.round * perRound)} of ${formatBytes(perGpu)}`, 'sent'));
    this.scaling.replaceChildren(
      h('caption', { class: 'kvw-note' }, `The same ${formatBytes(bytes)} summed over more GPUs`),
      h('thead', {}, h('tr', {}, ...['GPUs', 'rounds', 'sent per GPU', '× vector'].map((t) => h('th', { scope: 'col' }, t)))),
      h('tbody', {}, ...[2, 3, 4, 5, 6, 7, 8].map((m) => h('tr', { 'aria-current': m === n ? 'true' : 'false', 'data-n': m, 'data-rounds': 2 * (m - 1), 'data-per-gpu': (2 * (m - 1) * bytes) / m },
        h('td', {}, String(m)), h('td', {}, String(2 * (m - 1))), h('td', {}, formatBytes((2 * (m - 1) * bytes) / m)), h('td', {}, ((2 * (m - 1)) / m).toFixed(2))))));
    this.renderEngine(from);
  }

  drawRing() {
    const n = this.n;
    const state = ringState(n, this.round);
    const sends = this.round > 0 ? roundSends(n, this.round - 1) : [];
    const c = SIZE / 2;
    const radius = SIZE / 2 - 62;
    const cell = Math.min(14, 88 / n);
    const pos = (i) => [c + radius * Math.sin((2 * Math.PI * i) / n), c - radius * Math.cos((2 * Math.PI * i) / n)];
    const nodes = [svg('defs', {}, svg('marker', { id: `${this.markerId}`, viewBox: '0 0 10 10', refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: 'auto-start-reverse' },
      svg('path', { d: 'M0,0 L10,5 L0,10 z', fill: 'var(--kv-fg-soft)' })))];
    for (const s of sends) {   // arrows first, under the GPUs
      const [x1, y1] = pos(s.from);
      const [x2, y2] = pos(s.to);
      const mx = (x1 + x2) / 2 + (c - (x1 + x2) / 2) * -0.25;
      const my = (y1 + y2) / 2 + (c - (y1 + y2) / 2) * -0.25;
      nodes.push(svg('path', { class: 'kra-arrow', d: `M${x1},${y1} Q${mx},${my} ${x2},${y2}`, 'marker-end': `url(#${this.markerId})`, 'data-send': `${s.from}-${s.to}-${s.piece}` }));
      nodes.push(svg('text', { class: 'kra-arrow-label', x: mx, y: my, 'text-anchor': 'middle' }, `piece ${s.piece}${s.gather ? ' (sum)' : ''}`));
    }
    state.forEach((pieces, i) => {
      const [x, y] = pos(i);
      const w = n * cell + 12;
      const g = svg('g', { 'data-rank': i, 'data-pieces': pieces.join(',') });
      g.append(svg('rect', { x: x - w / 2, y: y - 22, width: w, height: 40, rx: 5, fill: 'var(--kv-surface)', stroke: 'var(--kv-border)' }),
        svg('text', { x, y: y - 9, 'text-anchor': 'middle', 'font-size': 11 }, `GPU ${i}`));
      pieces.forEach((count, p) => {
        const t = count / n;
        const px = x - (n * cell) / 2 + p * cell;
        g.append(svg('rect', { x: px, y: y - 4, width: cell - 1, height: cell, fill: heatColor(0.15 + 0.85 * t), stroke: count === n ? 'var(--kv-fg)' : 'none' },
          svg('title', {}, `GPU ${i}, piece ${p}: summed over ${count} of ${n} GPUs`)));
        if (cell >= 11) g.append(svg('text', { x: px + (cell - 1) / 2, y: y + cell - 6, 'text-anchor': 'middle', 'font-size': 9, fill: heatTextColor(0.15 + 0.85 * t) }, String(count)));
      });
      nodes.push(g);
    });
    this.ringSvg.setAttribute('aria-label', `${n} GPUs in a ring after ${this.round} of ${this.rounds} rounds. `
      + state.map((p, i) => `GPU ${i}: pieces summed over ${p.join(', ')} GPUs`).join('; ') + '.');
    this.ringSvg.replaceChildren(...nodes);
  }

  renderEngine(payloadStep) {
    const live = this.live.length > 0;
    const steps = live ? this.live : this.recorded;
    const model = live ? this.client.hello.model : this.recordedModel;
    if (!steps.length || !model) {
      this.engineEl.replaceChildren(h('h4', {}, 'Measured by the engine'), h('p', { class: 'kvw-note' }, 'Loading the recorded steps…'));
      return;
    }
    const prefill = steps.reduce((a, s) => (s.tokens > a.tokens ? s : a), steps[0]);
    const shown = [prefill, payloadStep].filter((s, i, all) => s && all.indexOf(s) === i);
    const ranks = steps[0].ranks;
    const source = live ? `the live engine, ${ranks} ranks` : `a recording of the engine run with --tensor-parallel-size ${ranks}`
      + (this.isLive ? ' (this server runs one rank; start it with --tensor-parallel-size 2 to measure it live)' : '');
    this.engineEl.replaceChildren(
      h('h4', {}, 'Measured by the engine'),
      h('p', { class: 'kvw-note' }, `From ${source}: the bytes rank 0 handed to all-reduces and to the logits gather in one step (allreduce_bytes), `
        + `and the same figure from the model’s shape: ${2 * model.num_layers + 1} all-reduces (two per layer and the embedding’s) of `
        + `${formatInt(model.hidden_size)} numbers × ${model.dtype_bytes} bytes per token, plus each sampled row’s slice of the logits (gather). “One” is a single all-reduce; “ring, per GPU” what each of the ${ranks} ranks sends for it in a ring.`),
      h('div', { class: 'kvw-scroll' }, h('table', {},
        h('thead', {}, h('tr', {}, ...['step', 'tokens', 'measured', 'all-reduces', 'gather', 'one', `ring, per GPU`].map((t) => h('th', { scope: 'col' }, t)))),
        h('tbody', {}, ...shown.map((s) => h('tr', { 'data-step': s.step, 'data-measured': s.measured, 'data-computed': s.computed },
          h('td', {}, String(s.step)), h('td', {}, formatInt(s.tokens)), h('td', {}, formatBytes(s.measured)),
          h('td', {}, `${s.reduces} × ${formatBytes(s.payload)}`), h('td', {}, formatBytes(s.gather)), h('td', {}, formatBytes(s.payload)),
          h('td', {}, formatBytes((2 * (ranks - 1) * s.payload) / ranks))))))),
      h('p', { class: 'kvw-note' }, `The ring above sums ${formatBytes(this.payload.bytes)}: one all-reduce of step ${payloadStep ? payloadStep.step : '—'}.`
        + ` With ${ranks} ranks, ${plural(2 * (ranks - 1), 'round')} per all-reduce, ${2 * model.num_layers + 1} all-reduces a step.`));
  }

  exportData() {
    return { n: this.n, round: this.round, rounds: this.rounds, state: ringState(this.n, this.round), payload_bytes: this.payload.bytes,
      engine_steps: this.live.length ? this.live : this.recorded };
  }
}

customElements.define('kv-ring-allreduce', KvRingAllreduce);
