// The memory estimator's arithmetic and the public figures of the memory hierarchy.
// Model shapes are public configs (Hugging Face config.json); parameter counts are derived
// from the shape, so the estimator and the presets use one formula.

export const DTYPES = {
  float32: 4,
  bfloat16: 2,
  float16: 2,
  fp8: 1,
  int4: 0.5,
};

/** Public configs. `qk_norm`: Qwen3 normalises q and k per head (two extra vectors a layer). */
export const PRESETS = {
  'Qwen3-0.6B': {
    num_layers: 28, hidden_size: 1024, num_heads: 16, num_kv_heads: 8, head_dim: 128,
    intermediate_size: 3072, vocab_size: 151936, tie_word_embeddings: true, qk_norm: true,
  },
  'Qwen3-8B': {
    num_layers: 36, hidden_size: 4096, num_heads: 32, num_kv_heads: 8, head_dim: 128,
    intermediate_size: 12288, vocab_size: 151936, tie_word_embeddings: false, qk_norm: true,
  },
  'Llama-3-8B': {
    num_layers: 32, hidden_size: 4096, num_heads: 32, num_kv_heads: 8, head_dim: 128,
    intermediate_size: 14336, vocab_size: 128256, tie_word_embeddings: false, qk_norm: false,
  },
};

/** Parameters of a dense Qwen/Llama-style decoder from its shape. */
export function paramCount(c) {
  const h = c.hidden_size;
  const q = c.num_heads * c.head_dim;
  const kv = c.num_kv_heads * c.head_dim;
  const attn = h * q + 2 * h * kv + q * h;
  const mlp = 3 * h * c.intermediate_size;
  const norms = 2 * h + (c.qk_norm ? 2 * c.head_dim : 0);
  const embed = c.vocab_size * h;
  return c.num_layers * (attn + mlp + norms) + h + embed * (c.tie_word_embeddings ? 1 : 2);
}

/** Bytes of K and V one token keeps, over all layers. */
export function kvBytesPerToken(c, dtypeBytes) {
  return 2 * c.num_layers * c.num_kv_heads * c.head_dim * dtypeBytes;
}

/**
 * weights + KV for `batch` sequences of `context` tokens.
 * cfg: a shape (num_params optional: else derived); returns all the figures the form shows.
 */
export function estimate(cfg, { weightDtype, kvDtype, context, batch, deviceBytes }) {
  const params = cfg.num_params || paramCount(cfg);
  const weights = params * DTYPES[weightDtype];
  const perToken = kvBytesPerToken(cfg, DTYPES[kvDtype]);
  const kv = perToken * context * batch;
  const total = weights + kv;
  const room = deviceBytes - weights;
  const maxTokens = room > 0 ? Math.floor(room / perToken) : 0;
  return {
    num_params: params,
    weight_bytes: weights,
    kv_bytes_per_token: perToken,
    kv_bytes: kv,
    total_bytes: total,
    device_bytes: deviceBytes,
    fits: total <= deviceBytes,
    fraction: deviceBytes > 0 ? total / deviceBytes : Infinity,
    max_tokens_in_memory: maxTokens,
    max_batch_at_context: context > 0 ? Math.floor(maxTokens / context) : 0,
  };
}

/** Devices offered by the estimator (public figures). */
export const DEVICES = {
  'NVIDIA H100 SXM (80 GB)': 80e9,
  'NVIDIA H200 (141 GB)': 141e9,
  'NVIDIA A100 (80 GB)': 80e9,
  'NVIDIA L4 (24 GB)': 24e9,
  'GeForce RTX 4090 (24 GB)': 24e9,
};

/**
 * The levels of an H100 SXM's memory hierarchy, fastest first. Figures from `hello.h100`
 * where it has them; the rest are public approximations, marked `approx`.
 */
export function hierarchy(h100) {
  const sms = h100.num_sms;
  return [
    {
      key: 'registers', name: 'Registers', scope: 'per thread, inside each SM',
      bytes: 256 * 1024 * sms, per: `256 KiB × ${sms} SMs`, bandwidth: null, approx: true,
      note: 'operands for every instruction, read each cycle',
    },
    {
      key: 'smem', name: 'Shared memory / L1', scope: 'per SM',
      bytes: h100.smem_per_sm_bytes * sms, per: `${Math.round(h100.smem_per_sm_bytes / 1024)} KiB × ${sms} SMs`,
      bandwidth: 33e12, approx: true, note: 'a tile of K/V staged here by attention kernels',
    },
    {
      key: 'l2', name: 'L2 cache', scope: 'whole chip',
      bytes: h100.l2_bytes, per: 'shared by all SMs', bandwidth: 12e12, approx: true,
      note: 'too small to hold the weights: each decode step streams them through',
    },
    {
      key: 'hbm', name: 'HBM3', scope: 'device memory',
      bytes: h100.memory_bytes, per: 'weights + KV cache live here', bandwidth: h100.bandwidth_bytes_per_s,
      approx: false, note: 'every decode step reads all weights and the KV cache from here',
    },
    {
      key: 'host', name: 'Host RAM over PCIe', scope: 'the CPU side',
      bytes: null, per: 'PCIe Gen5 x16', bandwidth: h100.pcie_bytes_per_s, approx: false,
      note: 'offloaded KV or weights cross this link',
    },
    {
      key: 'nvlink', name: 'Peer GPUs over NVLink', scope: 'other GPUs in the node',
      bytes: null, per: 'NVLink 4', bandwidth: h100.nvlink_bytes_per_s, approx: false,
      note: 'tensor parallelism exchanges activations here',
    },
  ];
}
