// Helpers for showing tokens: visible whitespace, byte-fallback pieces, byte <-> char maps.

const ENCODER = new TextEncoder();

/** Visible form of a decoded token text: spaces ␣, newlines ↵, tabs ⇥, other controls as <0xNN>. */
export function visibleText(text) {
  let out = '';
  for (const ch of text) {
    const cp = ch.codePointAt(0);
    if (ch === ' ') out += '␣';
    else if (ch === '\n') out += '↵';
    else if (ch === '\r') out += '␍';
    else if (ch === '\t') out += '⇥';
    else if (cp < 0x20 || cp === 0x7f) out += `<0x${cp.toString(16).toUpperCase().padStart(2, '0')}>`;
    else out += ch;
  }
  return out;
}

/**
 * The label of one token of a `tokens` event. Incomplete tokens (part of a multi-byte
 * character) carry their bytes as `\xNN` escapes in `text`: they are shown `<0xNN>` per byte,
 * as byte-fallback pieces are. Special tokens are shown as stored.
 */
export function tokenLabel(tok) {
  if (tok.special) return tok.piece || tok.text;
  const bytePiece = /^<0x[0-9A-Fa-f]{2}>$/.test(tok.piece || '');
  if (bytePiece) return tok.piece.toUpperCase().replace('<0X', '<0x');
  if (tok.complete === false) {
    return tok.text.replace(/\\x([0-9a-fA-F]{2})/g, (_, hx) => `<0x${hx.toUpperCase()}>`)
      .replace(/[ \n\t\r]/g, (c) => visibleText(c));
  }
  return visibleText(tok.text);
}

/** UTF-8 bytes of a string. */
export function utf8(text) {
  return ENCODER.encode(text);
}

/**
 * Map each UTF-8 byte offset of `text` to the index (in UTF-16 code units) of the character
 * that contains it; element `n` (the end) maps to text.length. Returns {byteToUnit, chars}
 * where chars[i] = {start, end, unit, units} for the i-th code point.
 */
export function byteMap(text) {
  const byteToUnit = [];
  const chars = [];
  let unit = 0;
  let b = 0;
  for (const ch of text) {
    const n = ENCODER.encode(ch).length;
    chars.push({ start: b, end: b + n, unit, units: ch.length, ch });
    for (let k = 0; k < n; k += 1) byteToUnit.push(unit);
    b += n;
    unit += ch.length;
  }
  byteToUnit.push(unit);
  return { byteToUnit, chars, numBytes: b };
}

/** [startUnit, endUnit) of the characters touched by bytes [start, end). */
export function unitSpan(map, start, end) {
  if (end <= start) return [map.byteToUnit[start] ?? 0, map.byteToUnit[start] ?? 0];
  const first = map.chars.find((c) => c.end > start);
  let last = first;
  for (const c of map.chars) if (c.start < end) last = c;
  if (!first) return [0, 0];
  return [first.unit, last.unit + last.units];
}

/** Hex of a byte: 'E2'. */
export function hex2(b) {
  return b.toString(16).toUpperCase().padStart(2, '0');
}

/** A short label for a token id when only the id is known. */
export function idLabel(id) {
  return `#${id}`;
}
