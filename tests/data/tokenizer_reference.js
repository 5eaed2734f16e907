// Reference side of the tokenizer tests, on the npm package gpt-3-encoder's own encoder.
//   node tokenizer_reference.js encode FILE         ids of FILE (read as UTF-8), one line
//   node tokenizer_reference.js random SEED BYTES OUT [invalid]
//       writes about BYTES of random text mixing letters of many scripts, digits, punctuation,
//       contractions, whitespace of every kind, emoji and code; with "invalid", also random
//       bytes that are not valid UTF-8
'use strict';
const fs = require('fs');
const path = require('path');
const encoderDir = path.join(__dirname, '..', '..', 'data', 'npm', 'node_modules', 'gpt-3-encoder');

function encode(file) {
  const { encode } = require(encoderDir);
  console.log(encode(fs.readFileSync(file, 'utf8')).join(' '));
}

// xorshift32, seeded: the same seed gives the same text
function rng(seed) {
  let s = seed >>> 0 || 1;
  return () => {
    s ^= s << 13; s >>>= 0; s ^= s >>> 17; s ^= s << 5; s >>>= 0;
    return s / 4294967296;
  };
}

const POOLS = [
  'abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ',
  '0123456789', '0123456789', '.,;:!?-()[]{}"\'`~@#$%^&*_+=/\\|<>',
  ' ', '  ', '\t', '\n', '\r\n', '\u00a0', '\u2003', '\u3000', '\ufeff', '\u2028', '\u200b', '\u000b\u000c',
  "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL",
  'éèêëàâäôöûüçñßøåæœ', 'ÀÉÎÕÜÇÑ', 'αβγδεζηθλμπσωΑΒΓΔ', 'абвгдежзиклмнопрстуфхцчшщыэюяАБВ',
  '的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年', 'あいうえおかきくけこアイウエオ', '한국어텍스트',
  'مرحباعالم', 'שלוםעולם', 'नमस्तेदुनिया', 'สวัสดีครับ', '①②③½¾²³∑∫√≈≠∞', '٠١٢٣٤٥०१२३',
  ['😀', '👍🏽', '👨‍👩‍👧', '🇺🇸', '❤️', '🚀', '🤖', '\u{1F9EA}'],
  ['def ', 'return ', 'int ', '{', '}', '();', ' == ', ' != ', '->', '//', '/*', '*/', '    ', '\n    ', '#include <x.h>'],
];

function random(seed, bytes, out, invalid) {
  const r = rng(seed);
  const parts = [];
  let size = 0;
  while (size < bytes) {
    const pool = POOLS[Math.floor(r() * POOLS.length)];
    const n = 1 + Math.floor(r() * 8);
    let piece = '';
    for (let i = 0; i < n; i++) {
      const items = Array.isArray(pool) ? pool : Array.from(pool);
      piece += items[Math.floor(r() * items.length)];
    }
    let buf = Buffer.from(piece, 'utf8');
    if (invalid && r() < 0.05) {
      const junk = Buffer.alloc(1 + Math.floor(r() * 4));
      for (let i = 0; i < junk.length; i++) junk[i] = 0x80 + Math.floor(r() * 128);
      buf = Buffer.concat([buf, junk]);
    }
    parts.push(buf);
    size += buf.length;
  }
  fs.writeFileSync(out, Buffer.concat(parts));
}

const [cmd, ...args] = process.argv.slice(2);
if (cmd === 'encode') encode(args[0]);
else if (cmd === 'random') random(Number(args[0]), Number(args[1]), args[2], args[3] === 'invalid');
else { console.error('usage: tokenizer_reference.js encode FILE | random SEED BYTES OUT [invalid]'); process.exit(2); }
