// Events whose arrays travel as binary (docs/events.md, "Binary frames"): a watched request's
// attention weights, every layer it watches in one event a step. A live binary WebSocket
// frame is a little-endian uint32 N, N bytes of a JSON header (the event without its arrays,
// plus `tensors`: each array's name, dtype and shape), then the arrays, little-endian
// float16, row-major, one after the other (`weights` [layers][heads][rows][context], then
// `mean` [layers][rows][context]). A recording keeps the
// same header with those bytes in base64 (`payload`). Both decode here, once for every
// widget, into the event as it was built: each array a nest of plain arrays whose innermost
// rows are Float32Arrays (index them like lists).

const utf8 = new TextDecoder();
let halfTable = null;   // every float16 bit pattern → its value, built on first use

function halves() {
  if (halfTable) return halfTable;
  halfTable = new Float32Array(65536);
  for (let bits = 0; bits < 65536; bits += 1) {
    const sign = bits & 0x8000 ? -1 : 1;
    const exponent = (bits >> 10) & 0x1f;
    const fraction = bits & 0x3ff;
    if (exponent === 0) halfTable[bits] = sign * fraction * 2 ** -24;   // subnormal
    else if (exponent === 31) halfTable[bits] = fraction ? NaN : sign * Infinity;
    else halfTable[bits] = sign * (1 + fraction / 1024) * 2 ** (exponent - 15);
  }
  return halfTable;
}

function nest(flat, shape) {
  if (shape.length <= 1) return flat;
  const inner = shape.slice(1);
  const size = inner.reduce((a, b) => a * b, 1);
  return Array.from({ length: shape[0] }, (_, i) => nest(flat.subarray(i * size, (i + 1) * size), inner));
}

function base64Bytes(text) {
  const raw = atob(text);
  const bytes = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i += 1) bytes[i] = raw.charCodeAt(i);
  return bytes;
}

/** An event with `tensors` (and, from a recording, a base64 `payload`) → the event with its
 * arrays in place. `bytes`: the payload of a binary frame. Other events come back as they are. */
export function expandTensors(event, bytes = null) {
  if (!event || !Array.isArray(event.tensors)) return event;
  const { tensors, payload, ...out } = event;
  let data = bytes || base64Bytes(payload || '');
  if (data.byteOffset % 2) data = data.slice();   // a Uint16Array view needs 2-byte alignment
  const words = new Uint16Array(data.buffer, data.byteOffset, data.byteLength >> 1);
  const table = halves();
  let offset = 0;
  for (const t of tensors) {
    const count = t.shape.reduce((a, b) => a * b, 1);
    const flat = new Float32Array(count);
    for (let i = 0; i < count; i += 1) flat[i] = table[words[offset + i]];
    out[t.name] = nest(flat, t.shape);
    offset += count;
  }
  return out;
}

/** A binary WebSocket frame (an ArrayBuffer) → its event. */
export function decodeBinaryFrame(buffer) {
  const length = new DataView(buffer).getUint32(0, true);
  const header = JSON.parse(utf8.decode(new Uint8Array(buffer, 4, length)));
  return expandTensors(header, new Uint8Array(buffer, 4 + length));
}
