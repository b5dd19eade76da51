// The CPU implementations of kvscope's two custom operators, in C++ against PyTorch's
// stable ABI (headers only: it builds in about a second, with no PyTorch sources).
//
// A compiled decode step (engine/compiled_decode.py) runs inductor's C++ wrapper, which
// lets go of the GIL and calls each operator through the dispatcher. With the Python
// implementations, every call (21 a step on the embedded model) took the GIL back and ran
// Python: a few microseconds each, and a wait whenever another thread (the server's event
// loop) held it. These implementations keep the whole step in C++, without the GIL.
//
// The arithmetic is not here: the matmul is MKL's cblas_sgemm_compute and attention is
// cpu_paged_attention.c; Python passes their addresses to kvscope_bind once, after loading.
// The operators' schemas are defined in Python (packed_linear.py, cpu_paged_attention.py),
// which registers its own implementations instead when this library cannot be built.
#include <cstdint>

#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

using torch::headeronly::ScalarType;
using torch::stable::Tensor;

namespace {

using SgemmCompute = void (*)(int, int, int, int, int, int, const float *, int, const void *, int, float,
                              float *, int);
using PagedDecode = void (*)(const void *, const void *, const void *, const int32_t *, const int32_t *, void *,
                             int, int, int, int, int, int, float, int);

SgemmCompute sgemm_compute = nullptr;
PagedDecode paged_decode_f32 = nullptr;
PagedDecode paged_decode_bf16 = nullptr;

constexpr int kRowMajor = 101, kNoTrans = 111, kPacked = 151;

// x [..., k] float32 times a weight packed by cblas_sgemm_pack (packed_linear.pack) → [..., n]
Tensor packed_linear(Tensor x, Tensor packed, int64_t out_features) {
  STD_TORCH_CHECK(sgemm_compute != nullptr, "kvscope::packed_linear: MKL's sgemm_compute is not bound");
  STD_TORCH_CHECK(x.scalar_type() == ScalarType::Float, "kvscope::packed_linear takes float32");
  const int64_t k = x.size(x.dim() - 1);
  Tensor rows = torch::stable::contiguous(torch::stable::reshape(x, {-1, k}));
  const int64_t m = rows.size(0);
  Tensor out = torch::stable::new_empty(rows, {m, out_features});
  if (m > 0) {
    sgemm_compute(kRowMajor, kNoTrans, kPacked, static_cast<int>(m), static_cast<int>(out_features),
                  static_cast<int>(k), static_cast<const float *>(rows.data_ptr()), static_cast<int>(k),
                  packed.data_ptr(), static_cast<int>(out_features), 0.f,
                  static_cast<float *>(out.mutable_data_ptr()), static_cast<int>(out_features));
  }
  if (x.dim() == 2) {
    return out;
  }
  std::vector<int64_t> shape;
  for (int64_t d = 0; d + 1 < x.dim(); d++) {
    shape.push_back(x.size(d));
  }
  shape.push_back(out_features);
  return torch::stable::view(out, shape);
}

// q [B, H, D]; caches [num_blocks, block_size, KVH, D]; block_tables [B, width] int32;
// context_lens [B] int32 → [B, H, D]: the layouts cpu_paged_attention.c trusts, checked here
Tensor paged_decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables,
                              Tensor context_lens, double scale) {
  const bool bf16 = q.scalar_type() == ScalarType::BFloat16;
  STD_TORCH_CHECK(bf16 || q.scalar_type() == ScalarType::Float,
                  "kvscope::paged_decode_attention takes float32 or bfloat16");
  PagedDecode kernel = bf16 ? paged_decode_bf16 : paged_decode_f32;
  STD_TORCH_CHECK(kernel != nullptr, "kvscope::paged_decode_attention: the kernel is not bound");
  STD_TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && block_tables.is_contiguous() &&
                      context_lens.is_contiguous(),
                  "kvscope::paged_decode_attention: caches, block tables and lengths must be contiguous");
  STD_TORCH_CHECK(block_tables.scalar_type() == ScalarType::Int && context_lens.scalar_type() == ScalarType::Int,
                  "kvscope::paged_decode_attention: block tables and lengths must be int32");
  STD_TORCH_CHECK(k_cache.scalar_type() == q.scalar_type() && v_cache.scalar_type() == q.scalar_type(),
                  "kvscope::paged_decode_attention: the caches must have the query's dtype");
  Tensor query = torch::stable::contiguous(q);
  Tensor out = torch::stable::empty_like(query);
  kernel(query.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(),
         static_cast<const int32_t *>(block_tables.data_ptr()), static_cast<const int32_t *>(context_lens.data_ptr()),
         out.mutable_data_ptr(), static_cast<int>(query.size(0)), static_cast<int>(query.size(1)),
         static_cast<int>(k_cache.size(2)), static_cast<int>(query.size(2)), static_cast<int>(k_cache.size(1)),
         static_cast<int>(block_tables.size(1)), static_cast<float>(scale),
         static_cast<int>(torch::stable::get_num_threads()));
  return out;
}

}  // namespace

extern "C" void kvscope_bind(void *sgemm, void *attention_f32, void *attention_bf16) {
  sgemm_compute = reinterpret_cast<SgemmCompute>(sgemm);
  paged_decode_f32 = reinterpret_cast<PagedDecode>(attention_f32);
  paged_decode_bf16 = reinterpret_cast<PagedDecode>(attention_bf16);
}

STABLE_TORCH_LIBRARY_IMPL(kvscope, CPU, m) {
  m.impl("packed_linear", TORCH_BOX(&packed_linear));
  m.impl("paged_decode_attention", TORCH_BOX(&paged_decode_attention));
}
