// The mean next-token loss of a Hugging Face GPT-2 folder (model.safetensors, config.json) on a
// token shard, computed here in float64 the way transformers' GPT2LMHeadModel computes it
// (models/gpt2/modeling_gpt2.py: Conv1D layers y = x W + b with W (in, out), q k v split from
// c_attn's 3C outputs, heads of C/NH consecutive columns, causal softmax attention, gelu_new,
// LayerNorm eps from the config, logits from the tied wte), independently of loom's C code.
// The file is checked against the safetensors format first: header length, JSON, metadata
// format "pt", dtypes, shapes, data offsets that tile the data exactly, and the exact tensor set.
//   node hf_gpt2_forward.js DIR SHARD B T BATCHES   -> prints "loss: X"
"use strict";
const fs = require("fs");
const [dir, shardPath, B, T, batches] = [process.argv[2], process.argv[3], ...process.argv.slice(4).map(Number)];
const die = (msg) => { console.error("hf_gpt2_forward: " + msg); process.exit(1); };

const cfg = JSON.parse(fs.readFileSync(`${dir}/config.json`, "utf8"));
if (cfg.model_type !== "gpt2" || cfg.architectures[0] !== "GPT2LMHeadModel") die("not a GPT2LMHeadModel config");
const C = cfg.n_embd, L = cfg.n_layer, NH = cfg.n_head, V = cfg.vocab_size, maxT = cfg.n_positions;
const eps = cfg.layer_norm_epsilon;
if (cfg.activation_function !== "gelu_new" || !cfg.tie_word_embeddings) die("unexpected activation or untied head");

const file = fs.readFileSync(`${dir}/model.safetensors`);
const n = Number(file.readBigUInt64LE(0));
if (n % 8 !== 0 || 8 + n > file.length) die(`header length ${n}`);
const header = JSON.parse(file.subarray(8, 8 + n).toString("utf8"));
if (!header.__metadata__ || header.__metadata__.format !== "pt") die("metadata format is not pt");
delete header.__metadata__;
const want = { "transformer.wte.weight": [V, C], "transformer.wpe.weight": [maxT, C],
               "transformer.ln_f.weight": [C], "transformer.ln_f.bias": [C] };
const block = { "ln_1.weight": [C], "ln_1.bias": [C], "attn.c_attn.weight": [C, 3 * C], "attn.c_attn.bias": [3 * C],
                "attn.c_proj.weight": [C, C], "attn.c_proj.bias": [C], "ln_2.weight": [C], "ln_2.bias": [C],
                "mlp.c_fc.weight": [C, 4 * C], "mlp.c_fc.bias": [4 * C], "mlp.c_proj.weight": [4 * C, C],
                "mlp.c_proj.bias": [C] };
for (let l = 0; l < L; l++) for (const k in block) want[`transformer.h.${l}.${k}`] = block[k];
const names = Object.keys(header);
if (names.length !== Object.keys(want).length || names.some((k) => !(k in want))) die("tensor names differ");
const data = file.subarray(8 + n), W = {};
const spans = names.map((k) => header[k].data_offsets).sort((a, b) => a[0] - b[0]);
spans.forEach((s, i) => { if (s[0] !== (i ? spans[i - 1][1] : 0)) die("data offsets leave a gap or overlap"); });
if (spans[spans.length - 1][1] !== data.length) die("data offsets do not end at the end of the file");
for (const k of names) {
  const h = header[k], shape = want[k], count = shape.reduce((a, b) => a * b, 1);
  if (JSON.stringify(h.shape) !== JSON.stringify(shape)) die(`${k}: shape ${h.shape}, want ${shape}`);
  const es = h.dtype === "F32" ? 4 : h.dtype === "BF16" ? 2 : die(`${k}: dtype ${h.dtype}`);
  if (h.data_offsets[1] - h.data_offsets[0] !== count * es) die(`${k}: ${h.data_offsets} for ${count} values`);
  const x = new Float64Array(count), at = h.data_offsets[0], f32 = Buffer.alloc(4);
  for (let i = 0; i < count; i++) {
    if (es === 4) x[i] = data.readFloatLE(at + 4 * i);
    else { f32.writeUInt16LE(0, 0); f32.writeUInt16LE(data.readUInt16LE(at + 2 * i), 2); x[i] = f32.readFloatLE(0); }
  }
  W[k] = x;
}

// y (rows, out) = x (rows, in) w (in, out) + b
const linear = (x, rows, w, b, inn, out) => {
  const y = new Float64Array(rows * out);
  for (let r = 0; r < rows; r++)
    for (let o = 0; o < out; o++) {
      let s = b[o];
      for (let i = 0; i < inn; i++) s += x[r * inn + i] * w[i * out + o];
      y[r * out + o] = s;
    }
  return y;
};
const layerNorm = (x, rows, w, b) => {
  const y = new Float64Array(rows * C);
  for (let r = 0; r < rows; r++) {
    let m = 0, v = 0;
    for (let i = 0; i < C; i++) m += x[r * C + i] / C;
    for (let i = 0; i < C; i++) v += (x[r * C + i] - m) ** 2 / C;
    for (let i = 0; i < C; i++) y[r * C + i] = (x[r * C + i] - m) / Math.sqrt(v + eps) * w[i] + b[i];
  }
  return y;
};
const geluNew = (x) => 0.5 * x * (1 + Math.tanh(Math.sqrt(2 / Math.PI) * (x + 0.044715 * x ** 3)));

// the mean loss of one sequence: tokens (T + 1)
const sequenceLoss = (tok) => {
  const hs = C / NH, p = (k) => W[`transformer.${k}`];
  let h = new Float64Array(T * C);
  for (let t = 0; t < T; t++)
    for (let i = 0; i < C; i++) h[t * C + i] = p("wte.weight")[tok[t] * C + i] + p("wpe.weight")[t * C + i];
  for (let l = 0; l < L; l++) {
    const q = (k) => p(`h.${l}.${k}`);
    const qkv = linear(layerNorm(h, T, q("ln_1.weight"), q("ln_1.bias")), T, q("attn.c_attn.weight"),
                       q("attn.c_attn.bias"), C, 3 * C);
    const y = new Float64Array(T * C);
    for (let head = 0; head < NH; head++)
      for (let t = 0; t < T; t++) {
        const s = [];
        for (let u = 0; u <= t; u++) {
          let d = 0;
          for (let i = 0; i < hs; i++) d += qkv[t * 3 * C + head * hs + i] * qkv[u * 3 * C + C + head * hs + i];
          s.push(d / Math.sqrt(hs));
        }
        const mx = Math.max(...s), e = s.map((v) => Math.exp(v - mx)), z = e.reduce((a, b) => a + b, 0);
        for (let i = 0; i < hs; i++) {
          let acc = 0;
          for (let u = 0; u <= t; u++) acc += e[u] / z * qkv[u * 3 * C + 2 * C + head * hs + i];
          y[t * C + head * hs + i] = acc;
        }
      }
    const a = linear(y, T, q("attn.c_proj.weight"), q("attn.c_proj.bias"), C, C);
    h = h.map((v, i) => v + a[i]);
    const f = linear(layerNorm(h, T, q("ln_2.weight"), q("ln_2.bias")), T, q("mlp.c_fc.weight"), q("mlp.c_fc.bias"),
                     C, 4 * C).map(geluNew);
    const m = linear(f, T, q("mlp.c_proj.weight"), q("mlp.c_proj.bias"), 4 * C, C);
    h = h.map((v, i) => v + m[i]);
  }
  h = layerNorm(h, T, p("ln_f.weight"), p("ln_f.bias"));
  let loss = 0;
  for (let t = 0; t < T; t++) {
    const logits = new Float64Array(V);
    for (let v = 0; v < V; v++) {
      let d = 0;
      for (let i = 0; i < C; i++) d += h[t * C + i] * p("wte.weight")[v * C + i];
      logits[v] = d;
    }
    const mx = Math.max(...logits);
    const lse = mx + Math.log(logits.reduce((a, v) => a + Math.exp(v - mx), 0));
    loss += (lse - logits[tok[t + 1]]) / T;
  }
  return loss;
};

// llm.c's token shard: a 256 int32 header, then uint16 tokens; micro-batch j of B x T starts at
// token j B T, its row b at j B T + b T (loom eval's deterministic order)
const shard = fs.readFileSync(shardPath);
const tokens = (start, count) => Array.from({ length: count }, (_, k) => shard.readUInt16LE(1024 + 2 * (start + k)));
let total = 0;
for (let j = 0; j < batches; j++)
  for (let b = 0; b < B; b++) total += sequenceLoss(tokens(j * B * T + b * T, T + 1)) / (B * batches);
console.log(`loss: ${total.toFixed(9)}`);
