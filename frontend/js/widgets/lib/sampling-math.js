// The engine's sampling transform in JavaScript, rule for rule as written in
// docs/engine.md ("How a token is drawn") and implemented by
// backend/kvscope/engine/sampler.py; tests/test_sampling_js.py runs both on the same
// logits and compares. No DOM: node imports this module too.

/** Softmax of an array that may hold -Infinity. */
export function softmax(logits) {
  const top = Math.max(...logits);
  const exps = logits.map((x) => (x === -Infinity ? 0 : Math.exp(x - top)));
  const sum = exps.reduce((a, b) => a + b, 0);
  return exps.map((e) => e / sum);
}

/** Indices sorted by value, largest first (ties: lower index first, as a stable sort). */
function order(values) {
  return values.map((v, i) => i).sort((a, b) => (values[b] - values[a]) || (a - b));
}

export function applyTemperature(logits, t) {
  const scale = Math.max(t, 1e-6);
  return logits.map((x) => x / scale);
}

/** Keep the k largest logits (and any tied with the k-th); k <= 0 keeps all. */
export function applyTopK(logits, k) {
  if (k <= 0 || k >= logits.length) return logits.slice();
  const kth = logits[order(logits)[k - 1]];
  return logits.map((x) => (x < kth ? -Infinity : x));
}

/** Keep the smallest set of most likely tokens whose probability reaches p: a token is
 * dropped when the mass strictly above it already reaches p. */
export function applyTopP(logits, p) {
  const idx = order(logits);
  const probs = softmax(idx.map((i) => logits[i]));
  const out = logits.slice();
  let before = 0;
  idx.forEach((i, rank) => {
    if (before >= p) out[i] = -Infinity;
    before += probs[rank];
  });
  return out;
}

/** Drop tokens whose probability is below min_p times the largest probability. */
export function applyMinP(logits, minP) {
  const probs = softmax(logits);
  const threshold = Math.max(...probs) * minP;
  return logits.map((x, i) => (probs[i] < threshold ? -Infinity : x));
}

/**
 * The distribution the engine draws from: temperature, then top-k, top-p, min-p (each
 * only when switched on), then softmax. Temperature 0 is greedy: all mass on the argmax.
 */
export function reshape(logits, { temperature = 1, top_k: topK = 0, top_p: topP = 1, min_p: minP = 0 } = {}) {
  if (temperature === 0) {
    const best = order(logits)[0];
    return logits.map((x, i) => (i === best ? 1 : 0));
  }
  let out = applyTemperature(logits, temperature);
  if (topK > 0) out = applyTopK(out, topK);
  if (topP < 1) out = applyTopP(out, topP);
  if (minP > 0) out = applyMinP(out, minP);
  return softmax(out);
}

/** A small seeded generator (mulberry32): the same seed gives the same draws. */
export function seededRandom(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6D2B79F5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** Index drawn from probabilities with a uniform number u in [0, 1) (inverse CDF, most likely first). */
export function drawIndex(probs, u) {
  const idx = order(probs);
  let acc = 0;
  for (const i of idx) {
    acc += probs[i];
    if (u < acc) return i;
  }
  return idx.find((i) => probs[i] > 0) ?? idx[0];
}
