"""(exp8, prepared for the next device session; not run yet) Early slot release. An MMA warp hands
slot it-1 back only after the operands of chunk it have landed and its MMAs are issued; while it
waits for chunk it, slot it-1 (whose MMAs may long have retired) stays held, so the producer
refills it late and a stall feeds the next one. "early": when chunk it's operands are not there
yet, the warp retires its MMAs (wgmma.wait_group 0) and hands slot it-1 back before it waits.
"wait0": each warp retires chunk it's own MMAs (wgmma.wait_group 0) and hands slot it back at
once, giving up the overlap of one chunk's MMAs with the next chunk's issue.
On the product's source as rendered (bounded waits). Verified before and after 3 interleaved rounds of 30."""
import dataclasses, hashlib, time
from statistics import median
import tuner.backends.gpu as gpu
from tuner.config import Config, StageTiles as T
from tuner.workloads import get_workload
from tuner.render import render as real_render

OLD = """      const int slot = it % T::STAGES;
      mbar_wait(full + slot * 8, (it / T::STAGES) & 1, err);
"""
NEW = """      const int slot = it % T::STAGES;
      bool handed_back = false;
      if (it > 0 && !__all_sync(0xffffffffu, mbar_try_wait(full + slot * 8, (it / T::STAGES) & 1))) {
        wgmma_wait<0>();  // operands of chunk it not here yet: retire chunk it-1 and hand its slot back now
        const u32 bar = empty + ((it - 1) % T::STAGES) * 8, lane = threadIdx.x % 32;
        if constexpr (T::CLUSTER > 1) {
          if (lane < T::CLUSTER) mbar_arrive_cluster(bar, lane);
        } else if (lane == 0) {
          mbar_arrive(bar);
        }
        handed_back = true;
      }
      mbar_wait(full + slot * 8, (it / T::STAGES) & 1, err);
"""
OLD2 = "      if (it > 0) {  // one arrival per warp and block: lane r arrives in the block of rank r\n"
NEW2 = "      if (it > 0 && !handed_back) {  // one arrival per warp and block: lane r arrives in the block of rank r\n"
W1 = """      wgmma_wait<1>();  // the MMAs of iteration it-1 have retired: their slot goes back to the producers
      if (it > 0) {  // one arrival per warp and block: lane r arrives in the block of rank r
        const u32 bar = empty + ((it - 1) % T::STAGES) * 8, lane = threadIdx.x % 32;
"""
W0 = """      wgmma_wait<0>();
      {
        const u32 bar = empty + (it % T::STAGES) * 8, lane = threadIdx.x % 32;
"""
cur = {"v": set()}


def patched(chain, config, fault="none"):
    r = real_render(chain, config, fault)
    src = r.source
    if "early" in cur["v"]:
        assert OLD in src and OLD2 in src
        src = src.replace(OLD, NEW).replace(OLD2, NEW2)
    if "wait0" in cur["v"]:
        assert W1 in src
        src = src.replace(W1, W0)
    return dataclasses.replace(r, source=src, hash=hashlib.sha256(src.encode()).hexdigest())


PLAN = [(256, 1, T(128, 192, 64, 2, 1, 4, 1, "wgmma_tma", 2, 1), "col"),
        (256, 1, T(128, 192, 64, 2, 1, 5, 1, "wgmma_tma", 2, 1), "col"),
        (256, 0, T(128, 192, 64, 2, 1, 4, 2, "wgmma_tma", 2, 1), "col"),
        (256, 0, T(128, 96, 64, 2, 1, 4, 1, "wgmma_tma", 1, 2), "col"),
        (256, 0, T(128, 96, 64, 2, 1, 8, 1, "wgmma_tma", 1, 2), "col"),
        (2048, 1, T(128, 192, 64, 2, 1, 4, 1, "wgmma_tma", 2, 1), "col")]


def main():
    gpu.render = patched
    b = gpu.GpuBackend(seed=47)
    wl = get_workload("gpt3")
    for tok, j, t, order in PLAN:
        a = wl.chain(tokens=tok).alone(j)
        c = Config((t,), "stream", order, "block", "serial")
        runners = {}
        for v in ((), ("early",), ("wait0",)):
            cur["v"] = set(v)
            runner, m = b.load(a, c)
            if runner is None:
                print(a.label, v, "LOAD FAIL", m.message[:300], flush=True)
                continue
            err, why = b.verify(a, runner)
            if why:
                print(a.label, v, "VERIFY FAIL", why, err, flush=True)
                continue
            runners[v] = runner
        ts = {v: [] for v in runners}
        for _ in range(3):
            for v, runner in runners.items():
                time.sleep(0.3)
                ts[v].append(median(runner.time(5, 30)))
        for v, runner in runners.items():  # and right after timing, many epochs on
            err, why = b.verify(a, runner)
            if why:
                print(a.label, v, "VERIFY FAIL AFTER TIMING", why, err, flush=True)
        for v, x in ts.items():
            print(f"{a.label:42s} {c.short():50s} {'+'.join(v) or 'as built':8s} "
                  f"{median(x):7.1f}  ({' '.join('%.1f' % y for y in x)})", flush=True)
        del runners


if __name__ == "__main__":
    main()
