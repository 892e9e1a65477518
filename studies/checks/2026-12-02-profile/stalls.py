"""Summarize an ncu source-page CSV (SASS): the instructions with the most warp stall samples."""
import csv, sys

for path in sys.argv[1:]:
    rows = list(csv.reader(open(path)))
    hdr_i = next(i for i, r in enumerate(rows) if any("Source" == c for c in r))
    hdr = rows[hdr_i]
    body = [r for r in rows[hdr_i + 1:] if len(r) == len(hdr)]
    print("==", path, "| columns:", [h for h in hdr][:40])
    col = next((i for i, h in enumerate(hdr) if h.startswith("Warp Stall Sampling (All")), None)
    if col is None:
        continue
    def num(x):
        try:
            return float(x.replace(",", ""))
        except ValueError:
            return 0.0
    tot = sum(num(r[col]) for r in body) or 1
    for r in sorted(body, key=lambda r: -num(r[col]))[:25]:
        print(f"{100 * num(r[col]) / tot:5.1f}%  {r[hdr.index('Source')][:90]}")
