# Written by `ashlar bench hetero`: python3 plot.py series.csv accuracy.png TARGET
import csv, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
series = {}
with open(sys.argv[1]) as f:
    for row in csv.DictReader(f):
        series.setdefault(row["policy"], []).append((float(row["seconds"]), float(row["test_accuracy"])))
fig, ax = plt.subplots(figsize=(8, 5))
for name, pts in series.items():
    pts.sort()
    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", label=name)
ax.axhline(float(sys.argv[3]), color="gray", linestyle="--", linewidth=1, label="target")
ax.set_xlabel("wall time (s)")
ax.set_ylabel("test accuracy")
ax.set_ylim(0.5, 0.92)
ax.grid(True, alpha=0.3)
ax.legend(loc="lower right")
ax.set_title(sys.argv[4] if len(sys.argv) > 4 else "test accuracy against wall time")
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=120)
