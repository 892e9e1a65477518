// Run one entry of a tuner bundle (python -m tuner export WORKLOAD --format bundle) from C++,
// through the CUDA driver API. The entry's folder holds chain.cubin and entry.txt (what
// manifest.json says, one fact per line). Usage:
//
//   tuner::Chain chain("tuned/gpt3-bundle/NVIDIA-H200/tokens=256-hidden=12288-ffn=6144");
//   chain.run(x, {w1, w2}, stream);        // device pointers, fp16, row-major; returns the output
//
// The chain's semaphores are zeroed once, at load, and never reset: the kernels number their runs
// in them (the epoch argument they take is ignored), so a CUDA graph may replay a captured run.
// Intermediate and final outputs live in buffers the Chain owns; the next run overwrites them.
#pragma once

#include <cuda.h>

#include <string>
#include <vector>

namespace tuner {

struct Launch {
  std::string kernel;
  unsigned grid = 0, threads = 0, smem = 0, stream = 0;
  unsigned pdl = 0;  // 1: a programmatic dependent launch (may start before the kernel ahead of it ends)
  // A persistent stage's largest grid (0: the grid is fixed) and its cluster's blocks: its grid is
  // sized at load to this device's SMs, one block per SM in whole clusters, no more than the cap.
  unsigned grid_cap = 0, cluster = 1;
  CUfunction func = nullptr;
};

struct TensorMapSpec {
  int slot = 0;
  std::string operand;  // x, w<i> or y<i>
  unsigned long long rows = 0, cols = 0;
  unsigned box_rows = 0;
};

struct Buffer {
  std::string name;
  unsigned long long rows = 0, cols = 0;
};

class Chain {
 public:
  // Loads the entry in `folder` on the current context; throws std::runtime_error with one line.
  explicit Chain(const std::string& folder);
  ~Chain();
  Chain(const Chain&) = delete;
  Chain& operator=(const Chain&) = delete;

  // Enqueue one run on `stream` (a second stream forks from it and joins back where the launch
  // mode needs two); `x` and `weights` are device pointers of the manifest's shapes. `cache_len`:
  // where the entry has a room (a decode layer), a device pointer to one int, the cache's length
  // for this run (read by the kernels, clamped to the room), else 0.
  CUdeviceptr run(CUdeviceptr x, const std::vector<CUdeviceptr>& weights, CUstream stream, CUdeviceptr cache_len = 0);

  const std::string& label() const { return label_; }
  const std::vector<Buffer>& buffers() const { return buffers_; }
  const std::vector<std::string>& epilogues() const { return epilogues_; }
  double tuned_us() const { return time_us_; }
  long room() const { return room_; }  // the most cached tokens a run serves; -1: the length is compiled in
  unsigned epoch() const { return epoch_; }
  // The kernels set this word of the state when a spin timed out (a bug, never expected).
  unsigned error_flag(CUstream stream);

 private:
  CUdeviceptr tensor_maps(CUdeviceptr x, const std::vector<CUdeviceptr>& weights);

  std::string label_;
  double time_us_ = 0;
  long room_ = -1;
  unsigned state_words_ = 0, ws_floats_ = 0, err_word_ = 0, epoch_ = 0;
  std::vector<Buffer> buffers_;
  std::vector<std::string> epilogues_;
  std::vector<Launch> launches_;
  std::vector<TensorMapSpec> maps_;
  CUmodule module_ = nullptr;
  CUdeviceptr state_ = 0, ws_ = 0, tmaps_ = 0;
  std::vector<CUdeviceptr> ys_;
  std::vector<CUdeviceptr> tmap_key_;  // the pointers the descriptors in tmaps_ were made for
  CUstream side_ = nullptr;
  CUevent fork_ = nullptr, join_ = nullptr;
};

}  // namespace tuner
