/* gemv.c's kernels as PyTorch operators: lmforge::int8_gemv (and int8_gemv_n, several weights of one input),
 * lmforge::bf16_gemv and lmforge::f32_gemv.
 *
 * Why operators in C++. A decode step calls these kernels about 70 times. Called through ctypes from a Python
 * function (or from a compiled graph through a Python-registered op), each call paid about as much again in
 * Python as the one-row product itself; the dispatcher calls these directly.
 *
 * Why the kernels are bound at run time (lmforge_gemv_bind) rather than linked in. This file depends only on
 * torch's headers, so it is built once per torch version and stays loaded for the process: the operators can be
 * registered only once. gemv.c, which is rebuilt when its source or the cache changes, is loaded separately
 * and its three functions handed over. lmforge/nn/gemv.py builds, loads and binds both.
 */
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace {

using Int8Fn = int (*)(const float *, int64_t, int64_t, int64_t, const int8_t *const *, const float *const *,
                       float *const *, const int64_t *);
using Bf16Fn = int (*)(const uint16_t *, const uint16_t *, const uint16_t *, uint16_t *, int64_t, int64_t, int64_t);
using F32Fn = int (*)(const float *, const float *, const float *, float *, int64_t, int64_t, int64_t);

Int8Fn int8_kernel = nullptr;
Bf16Fn bf16_kernel = nullptr;
F32Fn f32_kernel = nullptr;

/* x (..., in) -> (..., out), with every leading dimension kept. */
std::vector<int64_t> out_sizes(const at::Tensor &x, int64_t n_out) {
  auto sizes = x.sizes().vec();
  sizes.back() = n_out;
  return sizes;
}

/* The number of rows of x (..., in): the product of its leading dimensions. */
int64_t rows_of(const at::Tensor &x) {
  int64_t rows = 1;
  for (int64_t d = 0; d + 1 < x.dim(); d++) rows *= x.size(d);
  return rows;
}

/* x (..., in) any float dtype @ (qweights[k] int8 (out_k, in) * scales[k] (out_k,)[:, None])^T -> (..., out_k) fp32
 * for each k, with x rounded once */
std::vector<at::Tensor> int8_gemv_n(const at::Tensor &x, at::TensorList qweights, at::TensorList scales) {
  TORCH_CHECK(int8_kernel, "lmforge::int8_gemv: the kernel is not loaded (lmforge.nn.gemv.available())");
  TORCH_CHECK(qweights.size() == scales.size(), "int8_gemv: one scales tensor per weight");
  auto xc = x.to(at::kFloat).contiguous();
  int64_t n_in = x.size(-1), n = static_cast<int64_t>(qweights.size());
  std::vector<at::Tensor> q(n), s(n), y(n);
  std::vector<const int8_t *> qp(n);
  std::vector<const float *> sp(n);
  std::vector<float *> yp(n);
  std::vector<int64_t> n_out(n);
  for (int64_t k = 0; k < n; k++) {
    const at::Tensor &qk = qweights[k];
    TORCH_CHECK(qk.scalar_type() == at::kChar && qk.dim() == 2, "int8_gemv: qweight must be int8 (out, in)");
    TORCH_CHECK(qk.size(1) == n_in && scales[k].numel() == qk.size(0), "int8_gemv: shapes do not match");
    q[k] = qk.contiguous();
    s[k] = scales[k].to(at::kFloat).contiguous();
    n_out[k] = q[k].size(0);
    y[k] = at::empty(out_sizes(x, n_out[k]), x.options().dtype(at::kFloat));
    qp[k] = q[k].data_ptr<int8_t>();
    sp[k] = s[k].data_ptr<float>();
    yp[k] = y[k].data_ptr<float>();
  }
  int failed = int8_kernel(xc.data_ptr<float>(), rows_of(x), n_in, n, qp.data(), sp.data(), yp.data(), n_out.data());
  TORCH_CHECK(!failed, "int8_gemv: out of memory for the rounded activations");
  return y;
}

/* x (..., in) any float dtype @ (qweight int8 (out, in) * scales (out,)[:, None])^T -> (..., out) fp32 */
at::Tensor int8_gemv(const at::Tensor &x, const at::Tensor &qweight, const at::Tensor &scales) {
  return int8_gemv_n(x, {qweight}, {scales})[0];
}

/* x (..., in) @ weight (out, in)^T + bias (out,), all in T's dtype (bf16 as uint16_t, or fp32) -> (..., out) */
template <typename T, typename Fn>
at::Tensor float_gemv(Fn kernel, at::ScalarType dtype, const char *name, const at::Tensor &x,
                      const at::Tensor &weight, const std::optional<at::Tensor> &bias) {
  TORCH_CHECK(kernel, "lmforge::", name, ": the kernel is not loaded (lmforge.nn.gemv.available())");
  TORCH_CHECK(weight.dim() == 2 && x.size(-1) == weight.size(1), name, ": shapes do not match");
  auto xc = x.to(dtype).contiguous();
  auto w = weight.to(dtype).contiguous();
  std::optional<at::Tensor> b;
  if (bias.has_value()) b = bias->to(dtype).contiguous();
  int64_t n_in = w.size(1), n_out = w.size(0);
  auto y = at::empty(out_sizes(x, n_out), x.options().dtype(dtype));
  auto ptr = [](const at::Tensor &t) { return static_cast<T *>(t.data_ptr()); };
  TORCH_CHECK(kernel(ptr(xc), ptr(w), b ? ptr(*b) : nullptr, ptr(y), rows_of(x), n_in, n_out) == 0,
              name, ": out of memory for the widened activations");
  return y;
}

at::Tensor bf16_gemv(const at::Tensor &x, const at::Tensor &weight, const std::optional<at::Tensor> &bias) {
  return float_gemv<uint16_t>(bf16_kernel, at::kBFloat16, "bf16_gemv", x, weight, bias);
}

at::Tensor f32_gemv(const at::Tensor &x, const at::Tensor &weight, const std::optional<at::Tensor> &bias) {
  return float_gemv<float>(f32_kernel, at::kFloat, "f32_gemv", x, weight, bias);
}

}  // namespace

extern "C" void lmforge_gemv_bind(void *int8, void *bf16, void *f32) {
  int8_kernel = reinterpret_cast<Int8Fn>(int8);
  bf16_kernel = reinterpret_cast<Bf16Fn>(bf16);
  f32_kernel = reinterpret_cast<F32Fn>(f32);
}

TORCH_LIBRARY_FRAGMENT(lmforge, m) {
  m.def("int8_gemv(Tensor x, Tensor qweight, Tensor scales) -> Tensor");
  m.def("int8_gemv_n(Tensor x, Tensor[] qweights, Tensor[] scales) -> Tensor[]");
  m.def("bf16_gemv(Tensor x, Tensor weight, Tensor? bias=None) -> Tensor");
  m.def("f32_gemv(Tensor x, Tensor weight, Tensor? bias=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(lmforge, CPU, m) {
  m.impl("int8_gemv", int8_gemv);
  m.impl("int8_gemv_n", int8_gemv_n);
  m.impl("bf16_gemv", bf16_gemv);
  m.impl("f32_gemv", f32_gemv);
}
