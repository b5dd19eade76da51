// Number and value formatting shared by <kv-value>, the widgets and the page shell,
// so a figure reads the same wherever it appears.

const intFormat = new Intl.NumberFormat('en-US', { maximumFractionDigits: 0 });
const BYTE_UNITS = ['bytes', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];

/** 151936 → "151,936". */
export function formatInt(value) {
  return intFormat.format(Math.round(Number(value)));
}

/** Up to `digits` significant decimals, no trailing zeros: 10000.0 → "10,000", 0.25 → "0.25". */
export function formatFloat(value, digits = 3) {
  const n = Number(value);
  if (!Number.isFinite(n)) return String(value);
  if (Math.abs(n) >= 1e15 || (n !== 0 && Math.abs(n) < 1e-4)) return n.toExponential(2);
  const decimals = Math.abs(n) >= 100 ? 1 : digits;
  return new Intl.NumberFormat('en-US', { maximumFractionDigits: decimals }).format(n);
}

/** Binary units, as the chapters use them: 2048 → "2 KiB", 114688 → "112 KiB". */
export function formatBytes(value) {
  let n = Number(value);
  if (!Number.isFinite(n)) return String(value);
  let unit = 0;
  while (Math.abs(n) >= 1024 && unit < BYTE_UNITS.length - 1) {
    n /= 1024;
    unit += 1;
  }
  if (unit === 0) return `${formatInt(n)} ${n === 1 ? 'byte' : 'bytes'}`;
  const digits = Math.abs(n) >= 100 ? 0 : Math.abs(n) >= 10 ? 1 : 2;
  const shown = new Intl.NumberFormat('en-US', { maximumFractionDigits: digits }).format(n);
  return `${shown} ${BYTE_UNITS[unit]}`;
}

/** Seconds to a readable duration: 0.0123 → "12.3 ms". */
export function formatSeconds(value) {
  const s = Number(value);
  if (!Number.isFinite(s)) return String(value);
  if (Math.abs(s) >= 1) return `${formatFloat(s, 2)} s`;
  if (Math.abs(s) >= 1e-3) return `${formatFloat(s * 1e3, 1)} ms`;
  return `${formatFloat(s * 1e6, 1)} µs`;
}

/** Decimal SI prefixes for rates: 9.8e9 → "9.8 G". Pair with a unit: `${formatSI(x)}B/s`. */
export function formatSI(value, digits = 1) {
  const n = Number(value);
  if (!Number.isFinite(n)) return String(value);
  const prefixes = ['', 'k', 'M', 'G', 'T', 'P'];
  let scaled = n;
  let i = 0;
  while (Math.abs(scaled) >= 1000 && i < prefixes.length - 1) {
    scaled /= 1000;
    i += 1;
  }
  const shown = new Intl.NumberFormat('en-US', { maximumFractionDigits: digits }).format(scaled);
  return `${shown} ${prefixes[i]}`;
}

/**
 * Formats one value the way the authoring contract names formats:
 * 'int' (default), 'bytes', 'float', 'text', 'seconds', 'si' (decimal prefix; the unit follows in the text). Booleans read as yes/no.
 */
export function formatValue(value, format = 'int') {
  if (value === undefined || value === null) return '—';
  if (typeof value === 'boolean') return value ? 'yes' : 'no';
  switch (format) {
    case 'text':
      return String(value);
    case 'bytes':
      return formatBytes(value);
    case 'float':
      return formatFloat(value);
    case 'seconds':
      return formatSeconds(value);
    case 'si':
      return formatSI(value);
    case 'int':
    default:
      if (typeof value !== 'number') return String(value);
      return Number.isInteger(value) ? formatInt(value) : formatFloat(value);
  }
}

/** Reads "model.num_layers" out of an object; undefined when any part is missing. */
export function getPath(object, path) {
  let current = object;
  for (const part of String(path).split('.')) {
    if (current === null || current === undefined || typeof current !== 'object') return undefined;
    current = current[part];
  }
  return current;
}

/** What a page says while the instructor has paused the live engine (`engine` event). */
export function pausedText(engine) {
  return `Paused by the instructor · step ${formatInt(engine.step)}`;
}

/** The banner while the instructor's slow motion spaces the engine's steps. */
export function slowMotionText(seconds) {
  return `Slow motion · at least ${seconds} s between engine steps (set by the instructor)`;
}
