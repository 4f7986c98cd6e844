"""Plot scalars of VisualDL logs, one panel per tag and one line per run, into an image for the docs.

    python benchmarks/plot_curves.py --out docs/images/rollout_correction_gap.png \
        --run "no gap=W0/none/vdl_log" --run "gap, none=W/none/vdl_log" --run "gap, token_tis=W/token_tis/vdl_log" \
        --tags train/rollout_corr/k3_kl,train/rollout_corr/logprob_diff_mean,train/rollout_corr/is_ratio_mean,eval/accuracy

A run is LABEL=FOLDER, the folder a run's `logging_dir` (its VisualDL files); a tag a run did not log is
left out of its panel. Prints, per run and tag, the first, last and mean value it plotted. Needs matplotlib
(installed with visualdl).
"""

import argparse
import os

import matplotlib

matplotlib.use("Agg")  # files only: no display on a server or in CI
import matplotlib.pyplot as plt  # noqa: E402
from visualdl import LogReader  # noqa: E402


def read_scalars(folder):
    """{tag: [(step, value)]} of every scalar in the VisualDL files of `folder`, in step order."""
    curves = {}
    for name in sorted(os.listdir(folder)):
        with LogReader(file_path=os.path.join(folder, name)) as reader:
            for tag in reader.get_tags().get("scalar", []):
                curves.setdefault(tag, []).extend((record.id, record.value) for record in reader.get_data("scalar", tag))
    return {tag: sorted(points) for tag, points in curves.items()}


def parse_run(text):
    label, separator, folder = text.rpartition("=")  # a label may hold "=", a folder seldom
    if not separator or not os.path.isdir(folder):
        raise SystemExit(f"--run {text!r}: give LABEL=FOLDER, FOLDER a run's logging_dir")
    return label, folder


def plot(runs, tags, out, columns=2):
    rows = -(-len(tags) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(6 * columns, 3.6 * rows), squeeze=False)
    for axis, tag in zip(axes.flat, tags):
        for label, curves in runs.items():
            if tag in curves:
                steps, values = zip(*curves[tag])
                axis.plot(steps, values, label=label, marker="." if len(steps) < 20 else None)
                print(f"{label} {tag}: first {values[0]:.4g} last {values[-1]:.4g} mean {sum(values) / len(values):.4g}")
        axis.set_title(tag)
        axis.set_xlabel("RL step")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    for axis in list(axes.flat)[len(tags):]:
        axis.set_visible(False)
    figure.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    figure.savefig(out, dpi=90)
    print(f"wrote {out}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", action="append", required=True, help="LABEL=FOLDER (repeat)")
    parser.add_argument("--tags", required=True, help="comma-separated scalar tags, e.g. train/rollout_corr/k3_kl")
    parser.add_argument("--out", required=True, help="the image to write (.png or .svg)")
    args = parser.parse_args()
    runs = {label: read_scalars(folder) for label, folder in map(parse_run, args.run)}
    tags = [tag.strip() for tag in args.tags.split(",") if tag.strip()]
    missing = [tag for tag in tags if not any(tag in curves for curves in runs.values())]
    if missing:
        known = sorted({tag for curves in runs.values() for tag in curves})
        raise SystemExit(f"no run logged {missing}; the tags they logged: {known}")
    plot(runs, tags, args.out)


if __name__ == "__main__":
    main()
