// Colours for widgets: categorical (Okabe–Ito, distinguishable with the common colour-vision
// deficiencies) and sequential (viridis, which stays ordered in greyscale too). The CSS
// variables live in css/theme.css so dark mode can adjust them in one place.

/** Categorical colours as CSS variables, in the order widgets should use them. */
export const CATEGORICAL = [
  'var(--kv-cat-1)', 'var(--kv-cat-2)', 'var(--kv-cat-3)', 'var(--kv-cat-4)',
  'var(--kv-cat-5)', 'var(--kv-cat-6)', 'var(--kv-cat-7)', 'var(--kv-cat-8)',
];

/** The i-th categorical colour (wraps around). */
export function categoricalColor(index) {
  return CATEGORICAL[((index % CATEGORICAL.length) + CATEGORICAL.length) % CATEGORICAL.length];
}

/** Resolves a CSS variable (or any `var(...)` string) to a concrete colour, for canvas drawing. */
export function cssVar(nameOrVar, element = document.documentElement) {
  const match = /^var\((--[^),\s]+)/.exec(String(nameOrVar));
  const name = match ? match[1] : nameOrVar;
  if (!String(name).startsWith('--')) return String(nameOrVar);
  return getComputedStyle(element).getPropertyValue(name).trim();
}

// Sequential ramps whose zero is the page background, so near-zero weights recede and the
// few large ones stand out. Light pages: white to deep blue (ColorBrewer "Blues"); dark
// pages: the background to yellow along viridis. Both change in lightness monotonically,
// so they stay ordered for every colour-vision deficiency and in greyscale.
const LIGHT_RAMP = [[255, 255, 255], [222, 235, 247], [158, 202, 225], [66, 146, 198], [8, 81, 156], [8, 48, 107]];
const DARK_RAMP = [[21, 23, 27], [59, 58, 110], [44, 113, 142], [33, 160, 135], [124, 210, 80], [253, 231, 37]];

export function prefersDark() {
  return typeof window !== 'undefined' && window.matchMedia?.('(prefers-color-scheme: dark)').matches;
}

/** Sequential colour for t in [0, 1]: 0 is the page background, 1 the strongest ink. */
export function heatColor(t) {
  const ramp = prefersDark() ? DARK_RAMP : LIGHT_RAMP;
  const x = Math.min(1, Math.max(0, Number(t) || 0)) * (ramp.length - 1);
  const i = Math.min(ramp.length - 2, Math.floor(x));
  const f = x - i;
  const [a, b] = [ramp[i], ramp[i + 1]];
  const mix = (k) => Math.round(a[k] + (b[k] - a[k]) * f);
  return `rgb(${mix(0)}, ${mix(1)}, ${mix(2)})`;
}

/** Black or white, whichever reads better on `heatColor(t)`. */
export function heatTextColor(t) {
  const strong = Number(t) > 0.55;
  return strong === prefersDark() ? '#000' : '#fff';
}
