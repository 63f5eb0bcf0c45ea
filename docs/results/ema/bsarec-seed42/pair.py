"""Side by side: the committed seed-42 run's validation curve (no average) and a run's log with the average.

python docs/results/ema/bsarec-seed42/pair.py docs/results/ema/bsarec-seed42/epochs.txt
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

LINE = re.compile(r"epoch (\d+) loss ([\d.]+) NDCG@10 ([\d.]+)")
WITHOUT = Path(__file__).resolve().parents[2] / "bsarec" / "cpu-seed42-88min" / "epochs.txt"


def curve(path: Path) -> dict[int, tuple[str, float]]:
    """epoch -> (loss as logged, validation NDCG@10)."""
    found = (LINE.search(line) for line in path.read_text().splitlines())
    return {int(m[1]): (m[2], float(m[3])) for m in found if m}


def main() -> None:
    raw, ema = curve(WITHOUT), curve(Path(sys.argv[1]))
    shared = sorted(set(raw) & set(ema))
    print(f"losses equal on every shared epoch: {all(raw[e][0] == ema[e][0] for e in shared)}")
    best_raw = best_ema = 0.0
    for e in shared:
        best_raw, best_ema = max(best_raw, raw[e][1]), max(best_ema, ema[e][1])
        print(f"{e:3d} loss {ema[e][0]}  raw {raw[e][1]:.4f} ema {ema[e][1]:.4f} "
              f"diff {ema[e][1] - raw[e][1]:+.4f}  best so far raw {best_raw:.4f} ema {best_ema:.4f}")


if __name__ == "__main__":
    main()
