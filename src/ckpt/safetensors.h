// A GPT-2 model as a Hugging Face transformers folder: DIR/model.safetensors and DIR/config.json,
// which GPT2LMHeadModel.from_pretrained(DIR) loads.
//
// safetensors (huggingface/safetensors, its format spec): an 8-byte little-endian header length
// N, N bytes of JSON ({"__metadata__": {"format": "pt"}, NAME: {"dtype": "F32" | "BF16", "shape":
// [...], "data_offsets": [BEGIN, END]}, ...}, padded with spaces to a multiple of 8), then the
// tensors' bytes, row-major little-endian, offsets relative to the end of the header.
//
// The tensors are GPT2LMHeadModel's state dict as save_pretrained writes it (transformers'
// models/gpt2/modeling_gpt2.py): transformer.wte.weight (V, C) (the llm.c file's wte without its
// padding rows), transformer.wpe.weight (maxT, C), per layer i transformer.h.i.ln_1.{weight,bias}
// (C), attn.c_attn.weight (C, 3C) and .bias (3C), attn.c_proj.weight (C, C) and .bias, ln_2,
// mlp.c_fc.weight (C, 4C) and .bias (4C), mlp.c_proj.weight (4C, C) and .bias (C), then
// transformer.ln_f.{weight,bias}. GPT-2's Conv1D layers hold their weights as (in, out) and
// compute x W + b, so each of the four matrices is llm.c's (out, in) transposed. lm_head.weight is
// tied to wte (tie_word_embeddings) and left out, as save_pretrained leaves it out. config.json
// names the architecture with GELU's tanh form (activation_function gelu_new, as llm.c and loom
// compute it), LayerNorm's epsilon 1e-5 and no dropout (loom trains without).
#pragma once
#include "model/gpt2_config.h"

#include <stdbool.h>

// Writes DIR/model.safetensors (fp32 tensors, or bf16 rounded to nearest even) and
// DIR/config.json, each atomically; DIR must exist. params: the llm.c file's parameters (fp32,
// loom_gpt2_file_elements of cfg). Errors: LOOM_EIO naming the file.
loom_status loom_safetensors_write_gpt2(const char *dir, const loom_gpt2_config *cfg, const float *params, bool bf16);
