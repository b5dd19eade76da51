// The memory estimator form of <kv-memory>: a model (the live one, public presets, or a
// custom shape), context length, batch and dtypes → weights + KV cache against a device's
// memory, drawn as one bar.

import { h, svg } from './svg.js';
import { formatBytes, formatInt } from '../../widget-base.js';
import { specBytes } from './hierarchy-svg.js';
import { PRESETS, DEVICES, DTYPES, estimate, paramCount } from './memory-model.js';

const LIVE = '__live__';
const LIVE_DEVICE = '__device__';
const FIELDS = [
  ['num_layers', 'Layers', 1, 200],
  ['num_kv_heads', 'KV heads', 1, 128],
  ['head_dim', 'Head dim', 8, 512],
  ['params_b', 'Parameters (billions)', 0.0001, 2000],
];

export class Estimator {
  constructor(host) {
    this.host = host;
    this.hello = null;
    this.result = null;
    const uid = `${host.getAttribute('aria-labelledby')}-est`;
    const labelled = (id, text, input, cls = 'kvm-field') => h('label', { class: cls, for: id }, h('span', {}, text), input);
    this.presetSel = h('select', { class: 'kvw-select', id: `${uid}-preset` },
      h('option', { value: LIVE }, 'the live model'),
      ...Object.keys(PRESETS).map((k) => h('option', { value: k }, k)),
      h('option', { value: 'custom' }, 'custom'));
    this.presetSel.value = 'Qwen3-0.6B';
    this.inputs = {};
    const shape = FIELDS.map(([key, text, min, max]) => {
      const input = h('input', { class: 'kvw-input', type: 'number', id: `${uid}-${key}`, min, max, step: key === 'params_b' ? 'any' : 1 });
      input.addEventListener('input', () => { this.presetSel.value = 'custom'; this.update(); });
      this.inputs[key] = input;
      return labelled(input.id, text, input);
    });
    const dtypeSel = (id) => h('select', { class: 'kvw-select', id }, ...Object.keys(DTYPES).map((d) => h('option', { value: d }, d)));
    this.wDtype = dtypeSel(`${uid}-wd`);
    this.kvDtype = dtypeSel(`${uid}-kd`);
    this.wDtype.value = 'bfloat16';
    this.kvDtype.value = 'bfloat16';
    this.context = h('input', { class: 'kvw-input', type: 'number', id: `${uid}-ctx`, min: 1, max: 10000000, value: 4096 });
    this.batch = h('input', { class: 'kvw-input', type: 'number', id: `${uid}-batch`, min: 1, max: 100000, value: 16 });
    this.deviceSel = h('select', { class: 'kvw-select', id: `${uid}-dev` },
      ...Object.keys(DEVICES).map((k) => h('option', { value: k }, k)), h('option', { value: LIVE_DEVICE }, 'this engine’s device'));
    this.barEl = h('div', { class: 'kvm-estbar' });
    this.outEl = h('dl', { class: 'kvw-figures', 'aria-label': 'Estimate', 'aria-live': 'polite' });
    this.el = h('section', { class: 'kvw-panel', 'aria-label': 'Memory estimator' },
      h('h4', {}, 'Memory estimator'),
      h('div', { class: 'kvm-form' },
        labelled(this.presetSel.id, 'Model', this.presetSel), ...shape,
        labelled(this.wDtype.id, 'Weights dtype', this.wDtype), labelled(this.kvDtype.id, 'KV dtype', this.kvDtype),
        labelled(this.context.id, 'Context length (tokens)', this.context), labelled(this.batch.id, 'Batch (sequences)', this.batch),
        labelled(this.deviceSel.id, 'Device', this.deviceSel, 'kvm-field kvm-form__wide')),
      this.barEl, this.outEl,
      h('p', { class: 'kvw-note' }, 'KV per token = 2 (K and V) × layers × KV heads × head dim × bytes per element. Weights = parameters × bytes per weight. Activations and the runtime’s own overhead come on top.'));
    for (const el of [this.presetSel, this.wDtype, this.kvDtype, this.context, this.batch, this.deviceSel]) {
      el.addEventListener('input', () => { if (el === this.presetSel) this.loadPreset(); this.update(); });
    }
    this.loadPreset();
    this.update();
  }

  setHello(hello) {
    this.hello = hello;
    this.presetSel.querySelector(`option[value="${LIVE}"]`).textContent = `the live model (${hello.model.name})`;
    if (this.presetSel.value === LIVE) this.loadPreset();
    this.update();
  }

  config() {
    const key = this.presetSel.value;
    if (key === LIVE && this.hello) return { ...this.hello.model };
    if (PRESETS[key]) return { ...PRESETS[key] };
    return null;
  }

  loadPreset() {
    const cfg = this.config();
    if (!cfg) return;
    this.inputs.num_layers.value = cfg.num_layers;
    this.inputs.num_kv_heads.value = cfg.num_kv_heads;
    this.inputs.head_dim.value = cfg.head_dim;
    const params = cfg.num_params || paramCount(cfg);
    this.inputs.params_b.value = +(params / 1e9).toPrecision(4);
    if (this.presetSel.value === LIVE && this.hello && DTYPES[this.hello.model.dtype]) {
      this.wDtype.value = this.hello.model.dtype;
      this.kvDtype.value = this.hello.model.dtype;
    }
  }

  deviceBytes() {
    if (this.deviceSel.value === LIVE_DEVICE) return this.hello ? this.hello.device.total_memory_bytes : 0;
    if (this.deviceSel.value.startsWith('NVIDIA H100') && this.hello) return this.hello.h100.memory_bytes;
    return DEVICES[this.deviceSel.value];
  }

  update() {
    const preset = this.config();
    const num = (k) => Number(this.inputs[k].value) || 0;
    const cfg = {
      num_layers: num('num_layers'), num_kv_heads: num('num_kv_heads'), head_dim: num('head_dim'),
      // A preset's exact count; an edited field's rounded billions.
      num_params: preset && this.presetSel.value !== 'custom' ? (preset.num_params || paramCount(preset)) : Math.round(num('params_b') * 1e9),
    };
    const r = estimate(cfg, {
      weightDtype: this.wDtype.value, kvDtype: this.kvDtype.value,
      context: Math.max(1, Number(this.context.value) || 1), batch: Math.max(1, Number(this.batch.value) || 1),
      deviceBytes: this.deviceBytes(),
    });
    r.model = this.presetSel.value === LIVE ? (this.hello ? this.hello.model.name : 'live') : this.presetSel.value;
    r.device = this.deviceSel.value === LIVE_DEVICE ? (this.hello ? this.hello.device.name : 'this device') : this.deviceSel.value;
    r.context = Number(this.context.value);
    r.batch = Number(this.batch.value);
    this.result = r;
    this.draw(r);
  }

  draw(r) {
    const W = 600;
    const scale = Math.max(r.total_bytes, r.device_bytes, 1);
    const wx = (W * r.weight_bytes) / scale;
    const kx = (W * r.kv_bytes) / scale;
    const dx = (W * r.device_bytes) / scale;
    this.barEl.replaceChildren(svg('svg', {
      class: 'kvw-svg kvm-est', width: W + 20, height: 58, viewBox: `0 0 ${W + 20} 58`, role: 'img',
      'aria-label': `Weights ${formatBytes(r.weight_bytes)} plus KV cache ${formatBytes(r.kv_bytes)} is ${formatBytes(r.total_bytes)} of ${formatBytes(r.device_bytes)} device memory: ${r.fits ? 'fits' : 'does not fit'}`,
    },
    svg('rect', { x: 0, y: 8, width: dx, height: 26, class: 'kvm-device' }),
    svg('rect', { x: 0, y: 12, width: wx, height: 18, class: 'kvm-weights' }),
    svg('rect', { x: wx, y: 12, width: kx, height: 18, class: 'kvm-kv' }),
    svg('line', { x1: dx, y1: 2, x2: dx, y2: 40, class: 'kvm-limit' }),
    svg('text', { x: Math.min(dx, W - 4), y: 52, 'text-anchor': dx > W / 2 ? 'end' : 'start', 'font-size': 11 }, `device: ${specBytes(r.device_bytes)}`),
    svg('text', { x: 2, y: 52, 'font-size': 11, class: r.fits ? 'kvm-ok' : 'kvm-bad' }, r.fits ? `fits (${(r.fraction * 100).toFixed(0)}%)` : `does not fit (${(r.fraction * 100).toFixed(0)}%)`)));
    const fig = (label, value, key, raw) => h('div', {}, h('dt', {}, label), h('dd', { 'data-figure': key, 'data-value': raw }, value));
    this.outEl.replaceChildren(
      fig('Parameters', formatInt(r.num_params), 'num_params', r.num_params),
      fig('Weights', formatBytes(r.weight_bytes), 'weight_bytes', r.weight_bytes),
      fig('KV per token', formatBytes(r.kv_bytes_per_token), 'kv_bytes_per_token', r.kv_bytes_per_token),
      fig('KV cache', formatBytes(r.kv_bytes), 'kv_bytes', r.kv_bytes),
      fig('Total', formatBytes(r.total_bytes), 'total_bytes', r.total_bytes),
      fig(`Max batch at ${formatInt(r.context)} tokens`, formatInt(r.max_batch_at_context), 'max_batch', r.max_batch_at_context),
    );
  }
}

export const ESTIMATOR_CSS = `
kv-memory .kvm-form { display: grid; grid-template-columns: repeat(auto-fill, minmax(11rem, 1fr)); gap: .4rem .8rem; }
kv-memory .kvm-form__wide { grid-column: span 2; }   /* device names are long */
kv-memory .kvm-field { display: flex; flex-direction: column; font-size: .82rem; color: var(--kv-fg-soft); gap: .15rem; }
kv-memory .kvm-field .kvw-input, kv-memory .kvm-field .kvw-select { width: 100%; color: var(--kv-fg); }
kv-memory .kvm-device { fill: var(--kv-bg-soft); stroke: var(--kv-border); }
kv-memory .kvm-weights { fill: var(--kv-cat-1); }
kv-memory .kvm-kv { fill: var(--kv-cat-2); }
kv-memory .kvm-limit { stroke: var(--kv-fg); stroke-width: 2; stroke-dasharray: 4 2; }
kv-memory .kvm-ok { fill: var(--kv-correct); font-weight: 700; }
kv-memory .kvm-bad { fill: var(--kv-wrong); font-weight: 700; }
`;
