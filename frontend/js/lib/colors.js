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

// Viridis at nine evenly spaced points (public colormap values).
const VIRIDIS = [
  [68, 1, 84], [71, 44, 122], [59, 81, 139], [44, 113, 142], [33, 144, 141],
  [39, 173, 129], [92, 200, 99], [170, 220, 50], [253, 231, 37],
];

/** Sequential colour for t in [0, 1] (0 = dark purple, 1 = yellow), as `rgb(...)`. */
export function heatColor(t) {
  const x = Math.min(1, Math.max(0, Number(t) || 0)) * (VIRIDIS.length - 1);
  const i = Math.min(VIRIDIS.length - 2, Math.floor(x));
  const f = x - i;
  const [a, b] = [VIRIDIS[i], VIRIDIS[i + 1]];
  const mix = (k) => Math.round(a[k] + (b[k] - a[k]) * f);
  return `rgb(${mix(0)}, ${mix(1)}, ${mix(2)})`;
}

/** Black or white, whichever reads better on `heatColor(t)`. */
export function heatTextColor(t) {
  return Number(t) > 0.55 ? '#000' : '#fff';
}
