"""Draw docs/halo-regions.png from real halo plans (no MPI): the padded block of one rank of
a 3x3 mesh, each ghost cell coloured by the rank it comes from, for a box and a star stencil.

    .venv/bin/python scripts/halo_picture.py [docs/halo-regions.png]
"""

from __future__ import annotations

import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.colors import ListedColormap  # noqa: E402

from pyshard import Layout, Shard, halo_plan, halo_spec  # noqa: E402


def owner_map(corners: bool) -> tuple:
    layout = Layout((12, 15), "float64", (3, 3), [Shard(0), Shard(1)], sizes={0: (3, 4, 5)})
    spec = halo_spec(layout, (2, 2), periodic=(False, True), corners=corners)
    p = halo_plan(layout, spec, (0, 0))
    m = np.full(p.padded_shape, -2)  # -2: never written (outside a non-periodic edge)
    w = spec.width
    box = layout.box((0, 0))
    m[w[0]: w[0] + box[0].stop - box[0].start, w[1]: w[1] + box[1].stop - box[1].start] = -1
    for r, _, boxes in p.recvs:
        for start, ext in boxes:
            m[tuple(slice(s, s + e) for s, e in zip(start, ext))] = r
    for _, dst, ext in p.local:
        m[tuple(slice(s, s + e) for s, e in zip(dst, ext))] = p.rank
    return m, p


def main() -> int:
    out = sys.argv[1] if len(sys.argv) > 1 else "docs/halo-regions.png"
    colors = ["#ffffff", "#bbbbbb"] + list(plt.get_cmap("tab10").colors[:9])
    cmap = ListedColormap(colors)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    for ax, corners in zip(axes, (True, False)):
        m, p = owner_map(corners)
        ax.imshow(m + 2, cmap=cmap, vmin=0, vmax=len(colors) - 1)
        for (i, j), v in np.ndenumerate(m):
            label = {-2: "", -1: "."}.get(int(v), str(int(v)))
            ax.text(j, i, label, ha="center", va="center", fontsize=8)
        ax.set_xticks(np.arange(-0.5, m.shape[1], 1), minor=True)
        ax.set_yticks(np.arange(-0.5, m.shape[0], 1), minor=True)
        ax.grid(which="minor", color="#888888", linewidth=0.3)
        ax.tick_params(which="both", length=0, labelbottom=False, labelleft=False)
        kind = "box stencil (corners=True)" if corners else "star stencil (corners=False)"
        ax.set_title(f"rank {p.rank} at (0, 0): {kind}", fontsize=10)
    fig.suptitle(
        "The padded block of the rank at mesh coords (0, 0) of a 3x3 mesh, 12x15 grid "
        "(rows split 3, 4, 5), width 2, periodic along dim 1 only", fontsize=9,
    )
    fig.text(
        0.5, 0.02,
        "grey '.': the owned interior; a number: the rank a ghost cell comes from (across the "
        "periodic edge for the left columns); white: never written (outside the non-periodic "
        "edge, or a corner of a star stencil)",
        ha="center", fontsize=8,
    )
    fig.savefig(out, dpi=110, bbox_inches="tight")
    return 0


if __name__ == "__main__":
    sys.exit(main())
