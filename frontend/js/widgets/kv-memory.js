// <kv-memory>: where the bytes live and how fast they move. The device's memory levels
// (registers, shared memory/L1, L2, HBM; host RAM over PCIe; peers over NVLink) with sizes
// and bandwidths; every live step's bytes moved (weights read, KV read and written) and the
// bandwidth achieved against the device's peak (`step`); where the device memory goes
// (`memory`); on CPU, what the same step would cost on an H100; and an estimator form.

import { KvWidget, formatBytes, formatInt, formatSeconds, formatFloat } from '../widget-base.js';
import { h } from './lib/svg.js';
import { injectStyle } from './lib/style.js';
import { hierarchy } from './lib/memory-model.js';
import { drawHierarchy, rate, HIERARCHY_CSS } from './lib/hierarchy-svg.js';
import { Estimator, ESTIMATOR_CSS } from './lib/estimator.js';
import { modeBadge, showMode } from './lib/controls.js';

const DEMO_PROMPT = 'The fox ran across the field and';

const STYLE = `${HIERARCHY_CSS}${ESTIMATOR_CSS}
kv-memory .kvm-stack { display: flex; height: 1.4rem; border: 1px solid var(--kv-border); border-radius: 3px; overflow: hidden; background: var(--kv-bg-soft); }
kv-memory .kvm-stack > span { height: 100%; min-width: 1px; }
kv-memory .kvm-w { background: var(--kv-cat-1); }
kv-memory .kvm-kr { background: var(--kv-cat-2); }
kv-memory .kvm-kw { background: var(--kv-cat-3); }
kv-memory .kvm-kvc { background: var(--kv-cat-2); opacity: .45; }
kv-memory .kvm-kvu { background: var(--kv-cat-2); }
kv-memory .kvm-act { background: var(--kv-cat-6); }
kv-memory .kvm-oth { background: var(--kv-cat-8); }
kv-memory .kvm-gauge { background: var(--kv-cat-4); }
kv-memory .kvw-table { border-collapse: collapse; font-variant-numeric: tabular-nums; margin: .4rem 0; }
kv-memory .kvw-table caption { text-align: left; }
kv-memory .kvw-table th, kv-memory .kvw-table td { padding: .15rem .8rem .15rem 0; text-align: right; border-bottom: 1px solid var(--kv-border); }
kv-memory .kvw-table th[scope=row] { text-align: left; font-weight: 400; color: var(--kv-fg-soft); }
`;

class KvMemory extends KvWidget {
  static events = ['step', 'memory'];
  static requires = ['requests', 'memory', 'steps', 'step_rows'];
  static label = 'Memory hierarchy and bytes moved';

  setup() {
    injectStyle('kv-memory', STYLE);
    this.hello = null;
    this.step = null;
    this.memory = null;
    this.modeBadge = modeBadge();
    this.hierEl = h('div', { class: 'kvw-scroll' });
    this.deviceNote = h('p', { class: 'kvw-note' });
    this.runBtn = h('button', { type: 'button', class: 'kvw-btn', onclick: () => this.sendDemo() }, 'Send a prompt to make steps');
    this.stepEl = h('div', { 'aria-live': 'off' });
    this.lastByKind = { prefill: null, decode: null };
    this.compareEl = h('div', { class: 'kvw-scroll' });
    this.memEl = h('div', {});
    this.errorEl = h('p', { class: 'kvw-error', role: 'alert' });
    this.estimator = new Estimator(this);
    this.body.append(
      h('div', { class: 'kvw-row' }, h('strong', {}, 'Memory levels'), this.modeBadge),
      this.hierEl, this.deviceNote,
      h('section', { class: 'kvw-panel', 'aria-label': 'Bytes moved by the last step' },
        h('h4', {}, 'Bytes moved by the last engine step'), h('div', { class: 'kvw-row' }, this.runBtn), this.errorEl, this.stepEl,
        h('h4', {}, 'A prefill step beside a decode step'), this.compareEl),
      h('section', { class: 'kvw-panel', 'aria-label': 'Where device memory goes' }, h('h4', {}, 'Where the memory goes'), this.memEl),
      this.estimator.el,
    );
    this.setLegend([
      { label: 'weights read', color: 'var(--kv-cat-1)' },
      { label: 'KV cache (read, or allocated)', color: 'var(--kv-cat-2)' },
      { label: 'KV written', color: 'var(--kv-cat-3)' },
      { label: 'activations', color: 'var(--kv-cat-6)' },
      { label: 'other memory in use (other programs, the runtime)', color: 'var(--kv-cat-8)' },
      { label: 'this machine’s own figure', color: 'var(--kv-cat-4)' },
    ]);
    this.updateMode(this.client.mode);
    if (this.client.memory) this.onEvent(this.client.memory);
  }

  onModeChange(mode) { this.updateMode(mode); }

  updateMode(mode) {
    showMode(this.modeBadge, mode);
    this.runBtn.disabled = mode === 'replay';
  }

  onEvent(event) {
    if (event.type === 'hello') {
      this.hello = event;
      this.estimator.setHello(event);
    } else if (event.type === 'step') {
      this.step = event;
      this.dataset.step = String(event.step);
      // A step with any prompt tokens counts as prefill: its tokens per weight read are what differ.
      this.lastByKind[event.seqs.some((q) => q.kind === 'prefill') ? 'prefill' : 'decode'] = event;
    } else if (event.type === 'memory') {
      this.memory = event;
    } else return;
    this.requestRender();
  }

  async sendDemo() {
    this.errorEl.textContent = '';
    try {
      await this.client.command('submit', { prompt: DEMO_PROMPT, params: { temperature: 0, max_tokens: 24 } });
    } catch (error) {
      this.errorEl.textContent = this.describeError(error);
    }
  }

  render() {
    this.renderHierarchy();
    this.renderStep();
    this.renderComparison();
    this.renderMemory();
  }

  renderHierarchy() {
    const hello = this.hello;
    if (!hello) {
      this.hierEl.replaceChildren(h('p', { class: 'kvw-note' }, 'Waiting for the engine’s facts…'));
      return;
    }
    if (this.drawnFor === hello.started_at) return;
    this.drawnFor = hello.started_at;
    const d = hello.device;
    const local = {};
    if (d.type === 'cpu') {
      local.host = { label: 'host, measured', bytes: d.total_memory_bytes, bandwidth: d.peak_bandwidth_bytes_per_s };
    } else {
      local.hbm = { label: 'GPU', bytes: d.total_memory_bytes, bandwidth: d.peak_bandwidth_bytes_per_s };
    }
    this.hierEl.replaceChildren(drawHierarchy(hierarchy(hello.h100), local, Math.min(this.hierEl.clientWidth || 640, 760)));
    this.deviceNote.textContent = d.type === 'cpu'
      ? `This engine runs on a CPU (${d.name}): its “device memory” is the host’s ${formatBytes(d.total_memory_bytes)} of RAM, at a measured ${rate(d.peak_bandwidth_bytes_per_s)}. The H100’s figures are public specifications; ≈ marks approximate ones.`
      : `This engine runs on ${d.name}: ${formatBytes(d.total_memory_bytes)} at ${rate(d.peak_bandwidth_bytes_per_s)} (spec sheet). The levels above are an H100’s public figures; ≈ marks approximate ones.`;
  }

  renderStep() {
    const s = this.step;
    const hello = this.hello;
    if (!s || !hello) {
      this.stepEl.replaceChildren(h('p', { class: 'kvw-note' }, 'No step yet: the engine is idle. Send a prompt (or wait for the class’s requests).'));
      return;
    }
    const c = s.cost;
    const peak = hello.device.peak_bandwidth_bytes_per_s;
    const pct = peak ? (100 * c.achieved_bytes_per_s) / peak : 0;
    const total = Math.max(c.bytes, 1);
    const fig = (label, value, key, raw) => h('div', {}, h('dt', {}, label), h('dd', { 'data-figure': key, 'data-value': raw }, value));
    const h100 = c.h100;
    const onCpu = hello.device.type === 'cpu';
    const prefill = s.seqs.filter((q) => q.kind === 'prefill').length;
    this.stepEl.replaceChildren(
      h('p', { class: 'kvw-note' }, `Step ${formatInt(s.step)}: ${s.seqs.length} sequence${s.seqs.length === 1 ? '' : 's'} (${prefill} prefill, ${s.seqs.length - prefill} decode), ${formatInt(s.num_batched_tokens)} token${s.num_batched_tokens === 1 ? '' : 's'}, model time ${formatSeconds(s.model_s)}.`),
      h('div', { class: 'kvm-stack', role: 'img', 'aria-label': `Bytes moved: weights ${formatBytes(c.weight_bytes)}, KV read ${formatBytes(c.kv_read_bytes)}, KV written ${formatBytes(c.kv_write_bytes)}` },
        h('span', { class: 'kvm-w', style: `width:${(100 * c.weight_bytes) / total}%` }),
        h('span', { class: 'kvm-kr', style: `width:${(100 * c.kv_read_bytes) / total}%` }),
        h('span', { class: 'kvm-kw', style: `width:${(100 * c.kv_write_bytes) / total}%` })),
      h('dl', { class: 'kvw-figures' },
        fig('Weights read', formatBytes(c.weight_bytes), 'weight_bytes', c.weight_bytes),
        fig('KV read', formatBytes(c.kv_read_bytes), 'kv_read_bytes', c.kv_read_bytes),
        fig('KV written', formatBytes(c.kv_write_bytes), 'kv_write_bytes', c.kv_write_bytes),
        fig('Total', formatBytes(c.bytes), 'bytes', c.bytes),
        fig('Achieved', rate(c.achieved_bytes_per_s), 'achieved_bytes_per_s', c.achieved_bytes_per_s),
        fig(`Peak (${onCpu ? 'measured' : 'spec'})`, rate(peak), 'peak_bandwidth_bytes_per_s', peak),
        fig('FLOPs per byte', formatFloat(c.arithmetic_intensity, 2), 'arithmetic_intensity', c.arithmetic_intensity)),
      h('div', { class: 'kvm-stack', role: 'img', 'aria-label': `Achieved ${pct.toFixed(1)}% of peak bandwidth` },
        h('span', { class: 'kvm-gauge', style: `width:${Math.min(100, pct)}%` })),
      h('p', { 'data-figure': 'achieved_fraction', 'data-value': pct / 100 }, `${pct.toFixed(1)}% of this device’s peak bandwidth.`),
      h('p', { 'data-figure': 'h100', 'data-value': h100.time_s },
        `${onCpu ? 'The same step on an H100' : 'On an H100'} (bfloat16, at its roofline): ${formatBytes(h100.bytes)} moved, ${formatSeconds(h100.time_s)}, ${h100.bound}-bound`
        + `${s.model_s > 0 ? ` — ${formatFloat(s.model_s / h100.time_s, 2)}× faster than this step took here.` : '.'}`),
    );
  }

  /** The latest prefill step and the latest decode-only step, side by side: about the same
   * bytes read, very different numbers of tokens for them. */
  renderComparison() {
    const { prefill, decode } = this.lastByKind;
    const peak = this.hello ? this.hello.device.peak_bandwidth_bytes_per_s : 0;
    if (!prefill || !decode || !peak) {
      this.compareEl.replaceChildren(h('p', { class: 'kvw-note' }, 'Needs one prefill step and one decode step: send a prompt.'));
      return;
    }
    const rows = [
      ['Step', (s) => formatInt(s.step)],
      ['Tokens in the step', (s) => formatInt(s.num_batched_tokens)],
      ['Bytes moved', (s) => formatBytes(s.cost.bytes)],
      ['FLOPs per byte', (s) => formatFloat(s.cost.arithmetic_intensity, 2)],
      ['Model time', (s) => formatSeconds(s.model_s)],
      ['Time per token', (s) => formatSeconds(s.model_s / Math.max(1, s.num_batched_tokens))],
      ['Share of peak bandwidth', (s) => `${((100 * s.cost.achieved_bytes_per_s) / peak).toFixed(1)}%`],
    ];
    this.compareEl.replaceChildren(h('table', { class: 'kvw-table', 'data-compare': 'prefill-decode' },
      h('caption', { class: 'kvw-note' }, 'The latest step with prompt tokens and the latest decode-only step.'),
      h('thead', {}, h('tr', {}, h('th', { scope: 'col' }, 'figure'), h('th', { scope: 'col' }, 'prefill'), h('th', { scope: 'col' }, 'decode'))),
      h('tbody', {}, ...rows.map(([label, cell]) => h('tr', {}, h('th', { scope: 'row' }, label),
        h('td', {}, cell(prefill)), h('td', {}, cell(decode)))))));
  }

  renderMemory() {
    const m = this.memory;
    if (!m) {
      this.memEl.replaceChildren(h('p', { class: 'kvw-note' }, 'Waiting for the first memory report…'));
      return;
    }
    const total = Math.max(m.device_total_bytes, 1);
    const other = Math.max(0, m.device_total_bytes - m.device_free_bytes - m.weights_bytes - m.kv_cache_bytes - m.activations_bytes);
    const pct = (v) => `${(100 * v) / total}%`;
    const fig = (label, key) => h('div', {}, h('dt', {}, label), h('dd', { 'data-figure': key, 'data-value': m[key] }, key.endsWith('blocks') ? formatInt(m[key]) : formatBytes(m[key])));
    this.memEl.replaceChildren(
      h('div', { class: 'kvm-stack', role: 'img', 'aria-label': `Device memory ${formatBytes(m.device_total_bytes)}: weights ${formatBytes(m.weights_bytes)}, KV cache ${formatBytes(m.kv_cache_bytes)} (${formatBytes(m.kv_used_bytes)} used), activations ${formatBytes(m.activations_bytes)}, free ${formatBytes(m.device_free_bytes)}` },
        h('span', { class: 'kvm-w', style: `width:${pct(m.weights_bytes)}` }),
        h('span', { class: 'kvm-kvu', style: `width:${pct(m.kv_used_bytes)}` }),
        h('span', { class: 'kvm-kvc', style: `width:${pct(Math.max(0, m.kv_cache_bytes - m.kv_used_bytes))}` }),
        h('span', { class: 'kvm-act', style: `width:${pct(m.activations_bytes)}` }),
        h('span', { class: 'kvm-oth', style: `width:${pct(other)}` })),
      h('p', { class: 'kvw-note' }, 'Small parts of a large memory are thin slivers: the figures below are exact.'),
      h('dl', { class: 'kvw-figures' },
        fig('Device total', 'device_total_bytes'), fig('Free', 'device_free_bytes'), fig('Weights', 'weights_bytes'),
        fig('KV cache allocated', 'kv_cache_bytes'), fig('KV cache used', 'kv_used_bytes'), fig('Blocks used', 'kv_used_blocks'),
        fig('Activations (last step)', 'activations_bytes'), fig('Activations (full budget)', 'activations_peak_bytes'),
        fig('This process', 'process_bytes')),
    );
  }

  exportImageElement() { return this.hierEl.querySelector('svg'); }

  exportData() {
    return {
      device: this.hello ? this.hello.device : null, h100: this.hello ? this.hello.h100 : null,
      model: this.hello ? this.hello.model : null,
      levels: this.hello ? hierarchy(this.hello.h100) : [],
      step: this.step ? { step: this.step.step, model_s: this.step.model_s, cost: this.step.cost } : null,
      memory: this.memory, estimate: this.estimator.result,
    };
  }
}

customElements.define('kv-memory', KvMemory);
