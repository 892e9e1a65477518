// Runs one bundle entry of an MLP chain (GEMM stages) on random inputs and checks it against a
// float64 reference of its first rows; prints the error and the time per run.
//
//   nvcc -O2 -std=c++17 example.cpp tuner_chain.cpp -lcuda -o example && ./example ENTRY_FOLDER
#include <cuda.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "tuner_chain.h"

namespace {

uint16_t to_half(float f) {  // round to nearest even; the inputs here are small and normal
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u, mant = x & 0x7fffffu;
  int exp = int((x >> 23) & 0xff) - 127 + 15;
  if (exp <= 0) return uint16_t(sign);  // flush the tiny ones to zero
  if (exp >= 31) return uint16_t(sign | 0x7c00u);
  uint32_t h = sign | (uint32_t(exp) << 10) | (mant >> 13), rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return uint16_t(h);
}

double from_half(uint16_t h) {
  int exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  double v = exp == 0 ? std::ldexp(mant, -24) : std::ldexp(1024 + mant, exp - 25);
  return (h & 0x8000u) ? -v : v;
}

double epilogue(const std::string& e, double a, double b, bool& folded) {
  folded = e == "silu_mul";
  if (e == "gelu") return 0.5 * a * (1 + std::tanh(0.7978845608028654 * (a + 0.044715 * a * a * a)));
  if (e == "relu") return a > 0 ? a : 0;
  if (e == "silu_mul") return a / (1 + std::exp(-a)) * b;
  return a;
}

void check(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS) throw std::runtime_error(std::string(what) + " failed");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s ENTRY_FOLDER (a folder of a tuner bundle, with entry.txt and chain.cubin)\n",
                 argv[0]);
    return 2;
  }
  try {
    check(cuInit(0), "cuInit");
    CUdevice dev;
    CUcontext ctx;
    check(cuDeviceGet(&dev, 0), "cuDeviceGet");
    check(cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
    check(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
    tuner::Chain chain(argv[1]);
    if (chain.room() >= 0) throw std::runtime_error("this example checks MLP chains; " + chain.label() + " is a decode layer");
    for (const std::string& e : chain.epilogues())
      if (e != "none" && e != "gelu" && e != "relu" && e != "silu_mul")
        throw std::runtime_error("this example checks MLP chains; epilogue " + e + " is not among them");
    // Host copies of x and the weights, fp16, uniform in [-1, 1) (weights scaled by 1/sqrt(K)).
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> uni(-1.f, 1.f);
    std::vector<std::vector<uint16_t>> host;
    std::vector<CUdeviceptr> dev_bufs;
    for (const tuner::Buffer& b : chain.buffers()) {
      if (b.name[0] == 'y') continue;
      float scale = b.name == "x" ? 1.f : 1.f / std::sqrt(float(b.cols));
      std::vector<uint16_t> h(b.rows * b.cols);
      for (auto& v : h) v = to_half(uni(rng) * scale);
      CUdeviceptr d;
      check(cuMemAlloc(&d, h.size() * 2), "cuMemAlloc");
      check(cuMemcpyHtoD(d, h.data(), h.size() * 2), "cuMemcpyHtoD");
      host.push_back(std::move(h));
      dev_bufs.push_back(d);
    }
    std::vector<CUdeviceptr> weights(dev_bufs.begin() + 1, dev_bufs.end());
    CUstream stream;
    check(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    CUdeviceptr y = chain.run(dev_bufs[0], weights, stream);
    if (chain.error_flag(stream)) throw std::runtime_error("a semaphore wait timed out");
    const tuner::Buffer& out = chain.buffers().back();
    std::vector<uint16_t> got(out.rows * out.cols);
    check(cuMemcpyDtoH(got.data(), y, got.size() * 2), "cuMemcpyDtoH");
    // float64 reference of the first rows: each stage is act(a @ w^T), folded pairs for SwiGLU.
    size_t rows = out.rows < 16 ? out.rows : 16;
    const auto& bufs = chain.buffers();
    std::vector<double> a(rows * bufs[0].cols);
    for (size_t i = 0; i < a.size(); ++i) a[i] = from_half(host[0][i]);
    size_t k = bufs[0].cols;
    for (size_t s = 0; s < weights.size(); ++s) {
      const tuner::Buffer& w = bufs[1 + 2 * s];
      // The weights decoded once: decoding a half per multiply made GPT-3's 2.4e9 of them take
      // longer than the run itself by orders of magnitude.
      std::vector<float> wf(host[1 + s].size());
      for (size_t i = 0; i < wf.size(); ++i) wf[i] = float(from_half(host[1 + s][i]));
      std::vector<double> acc(rows * w.rows, 0.0);
      for (size_t r = 0; r < rows; ++r)
        for (size_t n = 0; n < w.rows; ++n) {
          const double* ar = &a[r * k];
          const float* wn = &wf[n * k];
          double sum = 0;
          for (size_t c = 0; c < k; ++c) sum += ar[c] * wn[c];
          acc[r * w.rows + n] = sum;
        }
      bool folded = false;
      epilogue(chain.epilogues()[s], 0, 0, folded);
      size_t width = folded ? w.rows / 2 : w.rows;
      std::vector<double> next(rows * width);
      for (size_t r = 0; r < rows; ++r)
        for (size_t n = 0; n < width; ++n)
          next[r * width + n] = folded ? epilogue("silu_mul", acc[r * w.rows + 2 * n], acc[r * w.rows + 2 * n + 1], folded)
                                       : epilogue(chain.epilogues()[s], acc[r * w.rows + n], 0, folded);
      a.swap(next);
      k = width;
    }
    double diff = 0, norm = 0;
    for (size_t i = 0; i < rows * out.cols; ++i) {
      double d = from_half(got[i]) - a[i];
      diff += d * d;
      norm += a[i] * a[i];
    }
    double err = std::sqrt(diff / (norm > 0 ? norm : 1));
    // Time: 20 runs to warm up, then 100 back to back between two events.
    for (int i = 0; i < 20; ++i) chain.run(dev_bufs[0], weights, stream);
    CUevent t0, t1;
    check(cuEventCreate(&t0, CU_EVENT_DEFAULT), "cuEventCreate");
    check(cuEventCreate(&t1, CU_EVENT_DEFAULT), "cuEventCreate");
    check(cuEventRecord(t0, stream), "cuEventRecord");
    for (int i = 0; i < 100; ++i) chain.run(dev_bufs[0], weights, stream);
    check(cuEventRecord(t1, stream), "cuEventRecord");
    check(cuEventSynchronize(t1), "cuEventSynchronize");
    float ms = 0;
    check(cuEventElapsedTime(&ms, t0, t1), "cuEventElapsedTime");
    if (chain.error_flag(stream)) throw std::runtime_error("a semaphore wait timed out");
    std::printf("%s: relative error %.3g over the first %zu rows (limit 1e-2); %.2f us per run "
                "(100 back to back; tuned: %.2f us)\n", chain.label().c_str(), err, rows, ms * 10.0, chain.tuned_us());
    return err < 1e-2 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "example: %s\n", e.what());
    return 1;
  }
}
