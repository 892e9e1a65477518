// See tuner_chain.h.
#include "tuner_chain.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace tuner {
namespace {

void check(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS) {
    const char* name = nullptr;
    cuGetErrorName(r, &name);
    throw std::runtime_error(std::string(what) + " failed: " + (name ? name : "unknown CUDA error"));
  }
}

constexpr unsigned kDescriptorBytes = 128;
constexpr unsigned kBoxCols = 64;  // one 128-byte swizzle atom of halves, as the kernels read it

}  // namespace

Chain::Chain(const std::string& folder) {
  std::ifstream in(folder + "/entry.txt");
  if (!in) throw std::runtime_error(folder + ": no entry.txt; export the bundle again with this tuner version");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string key;
    f >> key;
    if (key == "label") {
      f >> label_;
    } else if (key == "time_us") {
      f >> time_us_;
    } else if (key == "state_words") {
      f >> state_words_;
    } else if (key == "ws_floats") {
      f >> ws_floats_;
    } else if (key == "err_word") {
      f >> err_word_;
    } else if (key == "room") {
      f >> room_;
    } else if (key == "buffer") {
      Buffer b;
      f >> b.name >> b.rows >> b.cols;
      buffers_.push_back(b);
    } else if (key == "epilogue") {
      std::string e;
      f >> e;
      epilogues_.push_back(e);
    } else if (key == "launch") {
      Launch l;
      f >> l.kernel >> l.grid >> l.threads >> l.smem >> l.stream >> l.pdl;
      if (!f.fail()) {
        unsigned cap = 0, cluster = 1;
        if (f >> cap >> cluster) {
          l.grid_cap = cap;
          l.cluster = cluster;
        } else if (f.eof() && cap == 0) {
          f.clear();  // an entry exported before grids were sized at load: its grid as is
        }
      }
      launches_.push_back(l);
    } else if (key == "tensor_map") {
      TensorMapSpec m;
      f >> m.slot >> m.operand >> m.rows >> m.cols >> m.box_rows;
      maps_.push_back(m);
    }
    if (!key.empty() && key[0] != '#' && f.fail()) throw std::runtime_error(folder + "/entry.txt: bad line: " + line);
  }
  check(cuModuleLoad(&module_, (folder + "/chain.cubin").c_str()), "cuModuleLoad(chain.cubin)");
  CUdevice dev = 0;
  int sms = 0;
  check(cuCtxGetDevice(&dev), "cuCtxGetDevice");
  check(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev), "cuDeviceGetAttribute(SMs)");
  for (Launch& l : launches_) {
    // As tuner.render.device_grid: a persistent stage runs one block per SM of this device.
    if (l.grid_cap) l.grid = std::min(l.grid_cap, (unsigned)sms / l.cluster * l.cluster);
    check(cuModuleGetFunction(&l.func, module_, l.kernel.c_str()), "cuModuleGetFunction");
    if (l.smem > 48 * 1024)
      check(cuFuncSetAttribute(l.func, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)l.smem),
            "cuFuncSetAttribute(max dynamic shared memory)");
  }
  check(cuMemAlloc(&state_, 4ull * (state_words_ ? state_words_ : 1)), "cuMemAlloc(state)");
  check(cuMemsetD32(state_, 0, state_words_ ? state_words_ : 1), "cuMemsetD32(state)");  // once, never reset
  check(cuMemAlloc(&ws_, 4ull * (ws_floats_ ? ws_floats_ : 1)), "cuMemAlloc(workspace)");
  check(cuMemAlloc(&tmaps_, kDescriptorBytes * (maps_.empty() ? 1 : maps_.size())), "cuMemAlloc(tensor maps)");
  for (const Buffer& b : buffers_) {
    if (b.name[0] != 'y') continue;
    CUdeviceptr y = 0;
    check(cuMemAlloc(&y, 2ull * b.rows * b.cols), "cuMemAlloc(output)");
    ys_.push_back(y);
  }
  check(cuStreamCreate(&side_, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  check(cuEventCreate(&fork_, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
  check(cuEventCreate(&join_, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
  check(cuCtxSynchronize(), "cuCtxSynchronize");  // the zeroed state lands before the first run
}

Chain::~Chain() {
  for (CUdeviceptr y : ys_) cuMemFree(y);
  if (state_) cuMemFree(state_);
  if (ws_) cuMemFree(ws_);
  if (tmaps_) cuMemFree(tmaps_);
  if (fork_) cuEventDestroy(fork_);
  if (join_) cuEventDestroy(join_);
  if (side_) cuStreamDestroy(side_);
  if (module_) cuModuleUnload(module_);
}

CUdeviceptr Chain::tensor_maps(CUdeviceptr x, const std::vector<CUdeviceptr>& weights) {
  std::vector<CUdeviceptr> key{x};
  key.insert(key.end(), weights.begin(), weights.end());
  if (maps_.empty() || key == tmap_key_) return tmaps_;
  std::vector<unsigned char> host(kDescriptorBytes * maps_.size());
  for (const TensorMapSpec& m : maps_) {
    CUdeviceptr base = 0;
    if (m.operand == "x") base = x;
    else if (m.operand[0] == 'w') base = weights.at(std::stoul(m.operand.substr(1)));
    else base = ys_.at(std::stoul(m.operand.substr(1)));
    CUtensorMap desc;
    cuuint64_t dims[2] = {m.cols, m.rows}, strides[1] = {m.cols * 2};
    cuuint32_t box[2] = {kBoxCols, m.box_rows}, elem[2] = {1, 1};
    check(cuTensorMapEncodeTiled(&desc, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, (void*)base, dims, strides, box, elem,
                                 CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                 CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
          "cuTensorMapEncodeTiled");
    std::memcpy(host.data() + kDescriptorBytes * m.slot, &desc, kDescriptorBytes);
  }
  check(cuMemcpyHtoD(tmaps_, host.data(), host.size()), "cuMemcpyHtoD(tensor maps)");
  tmap_key_ = key;
  return tmaps_;
}

CUdeviceptr Chain::run(CUdeviceptr x, const std::vector<CUdeviceptr>& weights, CUstream stream,
                       CUdeviceptr cache_len) {
  if (weights.size() != ys_.size())
    throw std::runtime_error(label_ + ": " + std::to_string(ys_.size()) + " weights are expected, got " +
                             std::to_string(weights.size()));
  if ((room_ >= 0) != (cache_len != 0))
    throw std::runtime_error(label_ + (room_ >= 0 ? ": reads the cache's length at run time: pass a device pointer "
                                                    "to it (one int)"
                                                  : ": its cache length is compiled in: pass no cache_len"));
  CUdeviceptr maps = tensor_maps(x, weights);
  ++epoch_;
  // The kernels' arguments: x, then w<i>, y<i> per stage, then ws, state, epoch, tmaps (and lens).
  std::vector<void*> args;
  args.push_back(&x);
  std::vector<CUdeviceptr> ws(weights);
  for (size_t i = 0; i < ys_.size(); ++i) {
    args.push_back(&ws[i]);
    args.push_back(&ys_[i]);
  }
  args.push_back(&ws_);
  args.push_back(&state_);
  args.push_back(&epoch_);
  args.push_back(&maps);
  if (room_ >= 0) args.push_back(&cache_len);
  bool two = false;
  for (const Launch& l : launches_) two = two || l.stream == 1;
  if (two) {
    check(cuEventRecord(fork_, stream), "cuEventRecord");
    check(cuStreamWaitEvent(side_, fork_, 0), "cuStreamWaitEvent");
  }
  for (const Launch& l : launches_) {
    CUlaunchConfig cfg = {};
    cfg.gridDimX = l.grid;
    cfg.gridDimY = cfg.gridDimZ = 1;
    cfg.blockDimX = l.threads;
    cfg.blockDimY = cfg.blockDimZ = 1;
    cfg.sharedMemBytes = l.smem;
    cfg.hStream = l.stream == 1 ? side_ : stream;
    CUlaunchAttribute attr = {};
    attr.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = l.pdl ? 1 : 0;  // its blocks wait for the kernel ahead of it themselves
    check(cuLaunchKernelEx(&cfg, l.func, args.data(), nullptr), "cuLaunchKernelEx");
  }
  if (two) {
    check(cuEventRecord(join_, side_), "cuEventRecord");
    check(cuStreamWaitEvent(stream, join_, 0), "cuStreamWaitEvent");
  }
  return ys_.back();
}

unsigned Chain::error_flag(CUstream stream) {
  unsigned flag = 0;
  check(cuStreamSynchronize(stream), "cuStreamSynchronize");
  check(cuMemcpyDtoH(&flag, state_ + 4ull * err_word_, 4), "cuMemcpyDtoH(error flag)");
  return flag;
}

}  // namespace tuner
