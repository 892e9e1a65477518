"""Compile the coverage configs for the GPU tests' sizes into a cache dir (CPU or GPU host)."""
import sys
from pathlib import Path
from tuner.cases import coverage
from tuner.compile import compile_many
from tuner.render import render
from tuner.workloads import get_workload
def main():
  out, which = Path(sys.argv[1]), sys.argv[2]
  sizes = [("gpt3", dict(tokens=1000, hidden=1032, ffn=776))]
  if which != "odd":
      sizes += [("gpt3", dict(tokens=t)) for t in (1, 64, 1000, 2048)] + [("llama", dict(tokens=100, hidden=1032, ffn=776))]
  items = []
  for wl, size in sizes:
      ch = get_workload(wl).chain(**size)
      items += [((ch.label, c.short()), render(ch, c).source) for c in coverage(ch)]
  n = sum(1 for k, m in compile_many(items, "sm_90", int(sys.argv[3]) if len(sys.argv) > 3 else 2, cache_dir=out)
          if not isinstance(m, Exception))
  print(f"cache {out}: {n} of {len(items)} compiled")

if __name__ == "__main__":
  main()
