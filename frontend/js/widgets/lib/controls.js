// The controls many widgets set up alike, built one way so they look, read and answer the
// keyboard the same everywhere:
//   modeBadge() / showMode(badge, mode)   the "live engine" / "recording" badge
//   new SourcePicker({...})               a <select> between a recording and the live engine, with its badge
//   new Stepper({...})                    earlier/later buttons and the arrow, Home and End keys
//   controlRow(label, ...controls)        a row of controls, a labelled group

import { h } from './svg.js';

/** What the badge says for a client mode. */
function modeText(mode) {
  if (mode === 'live') return 'live engine';
  if (mode === 'replay') return 'recording';
  return 'connecting…';
}

/** A small badge saying whether the widget shows the live engine or a recording; the
 *  widget calls showMode(badge, mode) at set-up and on every mode change. */
export function modeBadge() {
  return h('span', { class: 'kvw-mode' });
}

export function showMode(badge, mode) {
  badge.className = `kvw-mode kvw-mode--${mode}`;
  badge.textContent = modeText(mode);
}

/** A labelled row of controls, a group for screen readers. */
export function controlRow(label, ...controls) {
  return h('div', { class: 'kvw-row', role: 'group', 'aria-label': label }, ...controls);
}

/** Where a widget's data comes from: its chapter's recording, or the live engine (offered
 *  only while the page is live), with the badge of the page's mode (`badge`, placed by the
 *  widget). `onChange(source)` runs when the learner picks one, and when the page stops being
 *  live while the live one is shown. */
export class SourcePicker {
  constructor({ id, label, recorded, live, onChange }) {
    this.onChange = onChange;
    this.badge = modeBadge();
    this.liveOption = h('option', { value: 'live' }, live);
    this.select = h('select', { class: 'kvw-select', id, onchange: () => onChange(this.select.value) },
      h('option', { value: 'recorded' }, recorded), this.liveOption);
    this.label = h('label', { for: id }, label);
  }

  get value() { return this.select.value; }

  set value(source) { this.select.value = source; }

  /** A group of the label, the picker and `extra` controls (the step buttons, say). */
  row(groupLabel, ...extra) {
    return controlRow(groupLabel, this.label, this.select, ...extra);
  }

  /** Show `mode` on the badge; offer the live source only when it is live (and `ready`), else
   *  fall back to the recording. */
  followMode(mode, ready = true) {
    showMode(this.badge, mode);
    const live = mode === 'live';
    this.liveOption.disabled = !live || !ready;
    if (!live && this.value === 'live') this.onChange('recorded');
  }
}

const MOVES = { ArrowLeft: -1, ArrowUp: -1, ArrowRight: 1, ArrowDown: 1 };

/** Moving through a sequence (steps, passes, rounds): an earlier and a later button, and on a
 *  focusable element the arrow keys (one back or forward), Home and End (the first, the last).
 *  `index()` and `count()` read where the widget is; `go(i)` shows item i (the widget clamps);
 *  `keys` maps more keys to actions (e.g. { d: draw }). */
export class Stepper {
  constructor({ earlier, later, index, count, go, keys = {} }) {
    Object.assign(this, { index, count, go, keys });
    this.prev = h('button', { type: 'button', class: 'kvw-btn', onclick: () => go(index() - 1) }, earlier);
    this.next = h('button', { type: 'button', class: 'kvw-btn', onclick: () => go(index() + 1) }, later);
  }

  get buttons() { return [this.prev, this.next]; }

  /** A focusable group answering the keys; its `aria-label` should say what they do. */
  panel(attrs, ...children) {
    const el = h('div', { ...attrs, class: [attrs.class, 'kvw-keys'].filter(Boolean).join(' '), tabindex: '0', role: 'group' }, ...children);
    el.addEventListener('keydown', (e) => {
      if (Object.hasOwn(MOVES, e.key)) this.go(this.index() + MOVES[e.key]);
      else if (e.key === 'Home') this.go(0);
      else if (e.key === 'End') this.go(this.count() - 1);
      else if (Object.hasOwn(this.keys, e.key)) this.keys[e.key]();
      else return;
      e.preventDefault();
    });
    return el;
  }

  /** Disable the buttons at the ends (both while there is nothing to show). */
  update() {
    const i = this.index();
    const n = this.count();
    this.prev.disabled = n === 0 || i <= 0;
    this.next.disabled = n === 0 || i >= n - 1;
  }
}
