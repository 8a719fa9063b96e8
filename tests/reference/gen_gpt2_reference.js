#!/usr/bin/env node
// Generates tests/data/gpt2_reference.json: texts and the GPT-2 token ids that the reference
// encoder, npm gpt-3-encoder 1.1.4 (its own Encoder.js), gives for them. tests/test_tokenizer.cpp
// checks the C++ tokenizer against this file. Run once; commit the output.
//
//   node tests/reference/gen_gpt2_reference.js                 # npm pack gpt-3-encoder@1.1.4 into a temp dir
//   node tests/reference/gen_gpt2_reference.js /tmp/package    # an unpacked package (…/package/Encoder.js)
//
// Needs node (≥ 16: \p{…} in /u regexes; the committed file was made with node 20, Unicode 17.0),
// npm and tar for the first form, and the corpora in data/corpora (data/README.md). The package's
// encoder.json / vocab.bpe must be byte-identical to data/gpt2/ (checked). Cases:
//   corpus:<name>  a ~3-5 kB slice of data/corpora/<name>/validation.txt.gz around the first
//                  document boundary after the middle, cut at line ends (deterministic);
//   tricky:*       contractions, numbers, accents, CJK, emoji, Unicode spaces, control
//                  characters, letters new in Unicode 15-17, long runs (the C++ heap BPE path);
//   random:<i>     strings drawn by a fixed-seed generator from a mixed alphabet.
// The output is written to a temp file and renamed into place.
'use strict';
const fs = require('fs');
const os = require('os');
const path = require('path');
const zlib = require('zlib');
const crypto = require('crypto');
const { execFileSync } = require('child_process');

const ROOT = path.resolve(__dirname, '..', '..');
const OUT = path.join(ROOT, 'tests', 'data', 'gpt2_reference.json');
const PACKAGE = 'gpt-3-encoder@1.1.4';

function die(msg) {
  process.stderr.write(`gen_gpt2_reference: ${msg}\n`);
  process.exit(2);
}

function packageDir() {
  if (process.argv[2]) return path.resolve(process.argv[2]);
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'gpt3enc-'));
  try {
    const tgz = execFileSync('npm', ['pack', PACKAGE, '--silent'], { cwd: tmp, encoding: 'utf8' }).trim().split('\n').pop();
    execFileSync('tar', ['xzf', tgz], { cwd: tmp });
  } catch (e) {
    die(`cannot npm pack ${PACKAGE}: ${e.message}`);
  }
  return path.join(tmp, 'package');
}

const sha256 = (file) => crypto.createHash('sha256').update(fs.readFileSync(file)).digest('hex');

const pkg = packageDir();
if (!fs.existsSync(path.join(pkg, 'Encoder.js'))) die(`${pkg}: no Encoder.js (expected an unpacked ${PACKAGE})`);
const version = JSON.parse(fs.readFileSync(path.join(pkg, 'package.json'), 'utf8')).version;
if (version !== '1.1.4') die(`${pkg}: gpt-3-encoder ${version}, expected 1.1.4`);
for (const f of ['encoder.json', 'vocab.bpe']) {
  if (sha256(path.join(pkg, f)) !== sha256(path.join(ROOT, 'data', 'gpt2', f))) die(`${f} differs from data/gpt2/${f}`);
}
const { encode, decode } = require(path.join(pkg, 'Encoder.js'));
// Encoder.js reads its files when loaded: a temp dir of our own can go now.
if (!process.argv[2]) fs.rmSync(path.dirname(pkg), { recursive: true, force: true });

const cases = [];

// ---- corpus slices
const corporaDir = path.join(ROOT, 'data', 'corpora');
const corpora = fs.readdirSync(corporaDir).filter((d) => fs.existsSync(path.join(corporaDir, d, 'validation.txt.gz'))).sort();
if (corpora.length === 0) die(`no corpora in ${corporaDir}`);
for (const c of corpora) {
  const t = zlib.gunzipSync(fs.readFileSync(path.join(corporaDir, c, 'validation.txt.gz'))).toString('utf8');
  const b = t.indexOf('\n\n', Math.floor(t.length / 2));
  if (b < 0) die(`${c}: no document boundary after the middle`);
  const start = t.lastIndexOf('\n', Math.max(0, b - 1500)) + 1;
  let end = t.indexOf('\n', b + 1500);
  end = end < 0 ? t.length : end + 1;
  cases.push({ name: `corpus:${c}`, text: t.slice(start, end) });
}

// ---- tricky strings
const tricky = {
  'hello': 'Hello world',
  'spaces-2': 'Hello  world',
  'spaces-trailing': 'Hello   world   ',
  'space-leading': ' leading space',
  'space-only-1': ' ',
  'space-only-3': '   ',
  'empty': '',
  'tabs': '\ttab\tseparated\t\t',
  'newlines': 'line1\nline2\n\nline4\n',
  'newlines-only': '\n\n\n',
  'newline-space-mix': 'a \n b\n  c  \n\n  d \t\n',
  'crlf': 'windows\r\nline\r\n\r\nend\r\n',
  'vt-ff': 'a\u000bb\u000cc \u000b\u000c d',
  'contractions': "I'm you're he's she'd we'll they've don't can't won't isn't it's",
  'contractions-upper': "I'M YOU'RE HE'S SHE'D WE'LL THEY'VE DON'T",
  'contractions-odd': "'s 's 'S ''s '''s 'tis y'all'd've rock'n'roll o'clock 'll've'",
  'apostrophe-end': "dogs' toys' '",
  'numbers': '123 4567 89012345 3.14159 1,000,000 -42 +7 1e10 0x1F 2024-01-01 12:34:56 ¼ ² ³',
  'numbers-unicode': '٣٤٥ ١٢ ½ Ⅻ ① ⅷ 𝟘𝟙 ໑໒ ௰',
  'letters-digits': 'abc123def 4th 1st B2B mp3 H2O',
  'accents': 'café naïve résumé façade coöperate Ærøskøbing Ångström',
  'accents-nfd': 'cafe\u0301 nai\u0308ve A\u030angstro\u0308m',
  'scripts': 'Ελληνικά Русский язык עברית العربية हिन्दी ภาษาไทย ქართული Հայերեն',
  'cjk': '日本語のテキスト、中文文本。한국어 텍스트. 東京都 ＡＢＣ１２３',
  'case-specials': 'Straße ß ẞ İstanbul ı Ǆemal ǅ ǆ ﬁnance Ωmega µ',
  'emoji': '😀 👍🏽 👨‍👩‍👧‍👦 🇺🇸 ❤️ ☃ emoji😀inside 🤖🤖🤖',
  'unicode-spaces': 'a\u00a0b a\u3000b a\u2028b a\u2029b x\u2003\u2003y a \u00a0 b\u202f\u205f\u1680c',
  'not-js-spaces': 'a\u0085b \ufeffBOM a\u200bb a\u180eb a\u2060b',
  'space-then-unicode-space': 'end \u00a0\u00a0word \u3000 x',
  'controls': '\u0000\u0001\u001f\u007f x\u001c\u001d\u001e\u001fy',
  'punctuation': '!!! ??? ... --- ___ *** (parenthesised) [bracketed] {braced} #hash $5 %20 ^_^ ~tilde `tick`',
  'quotes': '"quoted" \'single\' \u201ccurly\u201d \u2018quotes\u2019 \u2014em\u2013dash\u2026 \u00abguillemets\u00bb',
  'url-email': 'email@example.com https://example.com/path?q=1&r=2#frag',
  'code': 'C++ std::vector<int> x = {1, 2}; if (a != b) { return -1; } // comment\n\tint y=0x7f;',
  'json-ish': '{"a": [1, 2, "b"], "c": {"d": null}},"e":"f","],["',
  'endoftext': '<|endoftext|>',
  'endoftext-inline': 'one<|endoftext|>two <|endoftext|> three',
  'unicode-15-17-letters': 'Kawi \u{11F04}\u{11F05}\u{11F06} NagMundari \u{1E4D0}\u{1E4D1} CJK-H \u{31350}\u{31351} Latin \ua7cb\ua7cc\u1c89\u1c8a Kannada \u0cdc Arabic \u088f',
  // Letters new in Unicode 15-17 before a contraction: a Unicode 14 table would make them
  // "other" and swallow the apostrophe into their run.
  'unicode-15-17-contractions': "so\u{139FF}'s0a \u{31E16}\u{333D7}\u{31975}\u{13C69}'m \u{14052}'t\u{32481}2\u{137D3}",
  'unicode-16-digits': 'Garay \u{10D40}\u{10D41}\u{10D42} Sunuwar \u{11BF0}\u{11BF1} digits',
  'private-use-unassigned': '\ue000\uf8ff \u{f0000} \u0378\u0379 \u{10ffff}',
  'long-spaces': ' '.repeat(300) + 'x' + ' '.repeat(301),
  'long-newlines': '\n'.repeat(100) + 'x' + '\n \n'.repeat(20),
  'long-letter-run': 'a'.repeat(500),
  'long-digits': '1234567890'.repeat(40),
  'long-punct': '='.repeat(200) + '-'.repeat(77) + '.'.repeat(64),
  'long-abab': 'ab'.repeat(300),
  'long-words': 'pneumonoultramicroscopicsilicovolcanoconiosis Supercalifragilisticexpialidocious antidisestablishmentarianism Llanfairpwllgwyngyllgogerychwyrndrobwllllantysiliogogogoch',
  'long-cjk': '漢字仮名交じり文は日本語の表記に用いられる。'.repeat(20),
  'long-emoji': '😀👍🏽👨‍👩‍👧‍👦'.repeat(30),
};
for (const [k, v] of Object.entries(tricky)) cases.push({ name: `tricky:${k}`, text: v });

// ---- random strings (fixed-seed LCG; a mixed alphabet of code points)
let state = 0x12345678;
const rnd = (n) => {
  state = (Math.imul(state, 1103515245) + 12345) >>> 0;
  return Math.floor(((state >>> 8) / 16777216) * n);
};
const alphabet = Array.from("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789      \t\n\n\r'''.,;:!?-_\"()[]{}<>/\\|@#$%^&*+=~`" +
  'éèüößñçÅØæœ™€£¥©®°±½²µ¿¡·‐–—“”‘’…' + '日本語中文한국어ΑβγДжЯאבגعربहिं' + '😀👍🏽❤️🇺🇸' +
  '\u00a0\u3000\u2028\u0085\ufeff\u200b\u0301\u0000\u001f' + '\u{11F04}\u{1E4D0}\u{10D40}٣①');
for (let i = 0; i < 150; i++) {
  const n = 1 + rnd(i < 140 ? 40 : 400);
  let s = '';
  for (let j = 0; j < n; j++) s += alphabet[rnd(alphabet.length)];
  cases.push({ name: `random:${i}`, text: s });
}
// Long letter-only words: the C++ heap BPE path on realistic merges.
for (let i = 0; i < 6; i++) {
  let s = i % 2 ? ' ' : '';
  const n = 60 + rnd(600);
  for (let j = 0; j < n; j++) s += 'etaoinshrdlucmfwypvbgkjqxz'[Math.min(25, rnd(12) + rnd(15))];
  cases.push({ name: `random-long-word:${i}`, text: s });
}

// ---- encode, check, write
for (const c of cases) {
  c.ids = encode(c.text);
  if (!c.ids.every((x) => Number.isInteger(x) && x >= 0 && x < 50257)) die(`${c.name}: the reference produced an invalid id`);
  if (decode(c.ids) !== c.text) die(`${c.name}: the reference does not round-trip`);
}
const header = {
  generator: 'tests/reference/gen_gpt2_reference.js',
  encoder: `npm ${PACKAGE} Encoder.js on node ${process.version} (Unicode ${process.versions.unicode})`,
  case_count: cases.length,
  tokens: cases.reduce((a, c) => a + c.ids.length, 0),
};
const body = cases.map((c) => '    ' + JSON.stringify({ name: c.name, text: c.text, ids: c.ids })).join(',\n');
const final = '{\n' + Object.entries(header).map(([k, v]) => `  ${JSON.stringify(k)}: ${JSON.stringify(v)},\n`).join('') +
  '  "cases": [\n' + body + '\n  ]\n}\n';
fs.mkdirSync(path.dirname(OUT), { recursive: true });
const tmp = path.join(path.dirname(OUT), `.${path.basename(OUT)}.${process.pid}.tmp`);
fs.writeFileSync(tmp, final);
fs.renameSync(tmp, OUT);
process.stderr.write(`wrote ${OUT}: ${cases.length} cases, ${header.tokens} tokens, ${final.length} bytes\n`);
