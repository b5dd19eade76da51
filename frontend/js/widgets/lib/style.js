// Widget styles live next to their widget (no build step, no extra stylesheet to link):
// each widget injects its rules once per document, in a <style data-kv-style="name">.
// Rules use the theme's variables (css/theme.css), so dark mode follows prefers-color-scheme.

/** Shared rules every widget in this folder uses (controls, figures, grids). */
const COMMON = `
.kvw-row { display: flex; flex-wrap: wrap; gap: .5rem; align-items: center; margin: .4rem 0; }
.kvw-row > label { font-size: .9rem; color: var(--kv-fg-soft); }
.kvw-input, .kvw-select, .kvw-textarea {
  font: inherit; font-size: .95rem; color: var(--kv-fg); background: var(--kv-surface);
  border: 1px solid var(--kv-border); border-radius: var(--kv-radius, 6px); padding: .3rem .5rem;
  max-width: 100%;
}
.kvw-textarea { width: 100%; min-height: 4.5rem; resize: vertical; font-family: var(--kv-font-mono); }
.kvw-input[type=number] { width: 6.5rem; }
.kvw-btn {
  font: inherit; font-size: .92rem; color: var(--kv-fg); background: var(--kv-bg-soft);
  border: 1px solid var(--kv-border); border-radius: var(--kv-radius, 6px); padding: .3rem .75rem;
  cursor: pointer; min-height: 2rem;
}
.kvw-btn:hover:not(:disabled) { border-color: var(--kv-focus); }
.kvw-btn:disabled { opacity: .55; cursor: not-allowed; }
.kvw-btn[aria-disabled="true"] { opacity: .55; cursor: progress; }   /* busy: keeps focus (lib/busy.js) */
.kvw-btn--primary { background: var(--kv-cat-1); border-color: var(--kv-cat-1); color: #fff; }
.kvw-figures { display: flex; flex-wrap: wrap; gap: .4rem 1.2rem; margin: .5rem 0; padding: 0; }
.kvw-figures > div { display: flex; flex-direction: column; min-width: 6.5rem; }
.kvw-figures dt { font-size: .78rem; color: var(--kv-fg-soft); text-transform: none; }
.kvw-figures dd { margin: 0; font-variant-numeric: tabular-nums; font-weight: 600; }
.kvw-note { font-size: .85rem; color: var(--kv-fg-soft); margin: .3rem 0; }
.kvw-scroll { overflow-x: auto; max-width: 100%; }
.kvw-svg { display: block; max-width: 100%; height: auto; font-family: var(--kv-font); }
.kvw-svg text { fill: var(--kv-fg); }
.kvw-svg .kvw-soft { fill: var(--kv-fg-soft); }
.kvw-keys:focus-visible { outline: 3px solid var(--kv-focus); outline-offset: 2px; }   /* a panel answering keys (lib/controls.js) */
.kvw-mode { font-size: .8rem; padding: .05rem .45rem; border-radius: 999px; border: 1px solid currentColor; }
.kvw-mode--live { color: var(--kv-live); }
.kvw-mode--replay { color: var(--kv-replay); }
.kvw-mode--connecting { color: var(--kv-fg-soft); }
.kvw-error { color: var(--kv-wrong); font-size: .9rem; }
.kvw-panel { border: 1px solid var(--kv-border); border-radius: var(--kv-radius, 6px); padding: .6rem .75rem; margin: .6rem 0; }
.kvw-panel > h4 { margin: 0 0 .4rem; font-size: 1rem; }
.kvw-bar { position: relative; height: 1.1rem; background: var(--kv-bg-soft); border: 1px solid var(--kv-border); border-radius: 3px; overflow: hidden; }
.kvw-bar > span { position: absolute; top: 0; bottom: 0; left: 0; }
.kvw-sr { position: absolute; width: 1px; height: 1px; overflow: hidden; clip: rect(0 0 0 0); white-space: nowrap; }
`;

/** Insert `css` once per document under `name` (and the common rules once). */
export function injectStyle(name, css) {
  for (const [key, text] of [['kvw-common', COMMON], [name, css]]) {
    if (document.querySelector(`style[data-kv-style="${key}"]`)) continue;
    const style = document.createElement('style');
    style.dataset.kvStyle = key;
    style.textContent = text;
    document.head.append(style);
  }
}
