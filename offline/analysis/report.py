"""The `seqrec analyze` report: PNG figures (matplotlib, no pyplot state) and one HTML page linking them.

Every function here draws or formats numbers already in the report dict; nothing is computed
twice, so the JSON and the pictures cannot disagree.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

Plot = Callable[[Mapping[str, Any], Path], bool]


def _figure(n_panels: int, width: float = 5.0, height: float = 3.8, columns: int = 3) -> tuple[Figure, list[Axes]]:
    columns = min(columns, n_panels)
    rows = math.ceil(n_panels / columns)
    figure = Figure(figsize=(width * columns, height * rows), layout="constrained")
    axes = figure.subplots(rows, columns, squeeze=False).ravel().tolist()
    for extra in axes[n_panels:]:
        extra.set_visible(False)
    return figure, axes[:n_panels]


def _save(figure: Figure, path: Path, dpi: int = 110) -> bool:
    figure.savefig(path, dpi=dpi, format="png")
    return True


def plot_spectrum(report: Mapping[str, Any], path: Path) -> bool:
    """Explained-variance ratio per principal component (log scale) and its cumulative sum, one line per model."""
    figure, (decay, cumulative) = _figure(2, columns=2)
    for label, g in report["geometry"].items():
        explained = g["spectrum"]["explained"]
        ranks = np.arange(1, len(explained) + 1)
        decay.semilogy(ranks, np.maximum(explained, 1e-12), label=label)
        cumulative.plot(ranks, g["spectrum"]["cumulative"], label=label)
    decay.set(xlabel="principal component", ylabel="explained variance ratio", title="Eigenvalue spectrum")
    cumulative.set(xlabel="components", ylabel="cumulative explained variance", title="Cumulative explained variance",
                   ylim=(0, 1.02))
    cumulative.axhline(0.9, color="grey", linestyle=":", linewidth=1)
    for axes in (decay, cumulative):
        axes.grid(True, alpha=0.3)
        axes.legend()
    return _save(figure, path)


def plot_hubness(report: Mapping[str, Any], path: Path) -> bool:
    """The k-occurrence histogram of each model (how often an item is among other items' k nearest)."""
    geometry = report["geometry"]
    figure, axes = _figure(len(geometry))
    for ax, (label, g) in zip(axes, geometry.items(), strict=True):
        hub = g["hubness"]
        counts = np.asarray(hub["k_occurrence"])
        ax.hist(counts, bins=min(50, max(int(counts.max()) + 1, 1)), color="tab:blue")
        ax.set(xlabel=f"k-occurrence (k = {hub['k']})", ylabel="items",
               title=f"{label}: skew {hub['skewness']:.2f}, Gini {hub['gini']:.2f}")
        ax.set_yscale("log")
    return _save(figure, path)


def plot_norms(report: Mapping[str, Any], path: Path) -> bool:
    figure, (ax,) = _figure(1, width=6.5)
    for label, g in report["geometry"].items():
        ax.hist(g["norms"]["values"], bins=50, alpha=0.5, label=label)
    ax.set(xlabel="L2 norm of the item vector", ylabel="items", title="Item-vector norms")
    ax.legend()
    return _save(figure, path)


def plot_tsne(report: Mapping[str, Any], path: Path) -> bool:
    """Each model's t-SNE map twice: coloured by the item's main label and by training popularity."""
    tsne = report["tsne"]
    if not tsne["models"]:
        return False
    labels = np.asarray(tsne["label"])
    popularity = np.log1p(np.asarray(tsne["popularity"], dtype=np.float64))
    figure, axes = _figure(2 * len(tsne["models"]), width=5.2, height=4.6, columns=2)
    for i, (label, xy) in enumerate(tsne["models"].items()):
        xy = np.asarray(xy)
        by_label, by_popularity = axes[2 * i], axes[2 * i + 1]
        for name in tsne["legend"]:
            pick = labels == name
            by_label.scatter(xy[pick, 0], xy[pick, 1], s=4, label=name)
        by_label.set_title(f"{label}: by {tsne['colour_by']}")
        by_label.legend(markerscale=3, fontsize="x-small", loc="best")
        points = by_popularity.scatter(xy[:, 0], xy[:, 1], s=4, c=popularity, cmap="viridis")
        figure.colorbar(points, ax=by_popularity, label="log(1 + training interactions)")
        by_popularity.set_title(f"{label}: by popularity")
        for ax in (by_label, by_popularity):
            ax.set_xticks([])
            ax.set_yticks([])
    return _save(figure, path, dpi=80)  # thousands of points per panel: a lower resolution keeps the file small


def plot_cka(report: Mapping[str, Any], path: Path) -> bool:
    cka = report["cka"]
    if len(cka["models"]) < 2:
        return False
    matrix = np.asarray(cka["matrix"])
    n = len(matrix)
    figure, (ax,) = _figure(1, width=1.2 * n + 3, height=1.0 * n + 2)
    image = ax.imshow(matrix, vmin=0, vmax=1, cmap="magma")
    ax.set_xticks(range(n), cka["models"], rotation=45, ha="right")
    ax.set_yticks(range(n), cka["models"])
    for i in range(n):
        for j in range(n):
            ax.text(j, i, f"{matrix[i, j]:.2f}", ha="center", va="center",
                    color="white" if matrix[i, j] < 0.6 else "black")
    figure.colorbar(image, ax=ax, label="linear CKA")
    ax.set_title("Linear CKA of the item vectors")
    return _save(figure, path)


def _group_bars(table: Mapping[str, Any], title: str, k: int, path: Path) -> bool:
    groups, models = table["groups"], table["models"]
    figure, axes = _figure(2, columns=2, width=max(5.0, 0.9 * len(groups) * max(len(models), 1) / 2 + 3))
    width = 0.8 / max(len(models), 1)
    x = np.arange(len(groups))
    for metric, ax in zip((f"NDCG@{k}", f"HR@{k}"), axes, strict=True):
        for i, (label, rows) in enumerate(models.items()):
            values = [r[metric] if r[metric] is not None else 0.0 for r in rows]
            ax.bar(x + (i - (len(models) - 1) / 2) * width, values, width, label=label)
        ax.set_xticks(x, [f"{g}\n({r['users']} users)" for g, r in zip(groups, next(iter(models.values())),
                                                                        strict=True)])
        ax.set(ylabel=metric, title=f"{title}: {metric}")
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize="small")
    return _save(figure, path)


def plot_popularity(report: Mapping[str, Any], path: Path) -> bool:
    b = report["breakdown"]
    return _group_bars(b["popularity"], f"Head vs long-tail targets ({b['split']})", b["k"], path)


def plot_length(report: Mapping[str, Any], path: Path) -> bool:
    b = report["breakdown"]
    return _group_bars(b["length"], f"By history length ({b['split']})", b["k"], path)


def plot_curves(report: Mapping[str, Any], path: Path) -> bool:
    curves = {label: c for label, c in report["curves"].items() if c}
    if not curves:
        return False
    figure, axes = _figure(3)
    for key, ax, title in zip(("loss", "valid_ndcg@10", "lr"), axes, ("training loss", "validation NDCG@10",
                                                                       "learning rate"), strict=True):
        for label, points in curves.items():
            xs = [p["epoch"] for p in points if p.get(key) is not None]
            ax.plot(xs, [p[key] for p in points if p.get(key) is not None], marker=".", label=label)
        ax.set(xlabel="epoch", title=title)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    return _save(figure, path)


PLOTS: dict[str, tuple[str, Plot]] = {
    "spectrum.png": ("Eigenvalue spectrum and cumulative explained variance", plot_spectrum),
    "hubness.png": ("Hubness: k-occurrence histograms", plot_hubness),
    "norms.png": ("L2-norm distributions", plot_norms),
    "tsne.png": ("t-SNE projections", plot_tsne),
    "cka.png": ("Linear CKA between the models", plot_cka),
    "popularity.png": ("Head vs long-tail targets", plot_popularity),
    "length.png": ("By history length", plot_length),
    "curves.png": ("Training curves", plot_curves),
}


def draw_all(report: Mapping[str, Any], folder: Path) -> list[str]:
    """Write every figure that has data; returns the file names written."""
    return [name for name, (_, plot) in PLOTS.items() if plot(report, folder / name)]


def _cell(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.4f}" if abs(value) < 100 else f"{value:,.1f}"
    return html.escape(str(value))


def _table(head: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{_cell(v)}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def _geometry_table(report: Mapping[str, Any]) -> str:
    rows = []
    for label, g in report["geometry"].items():
        hub = g["hubness"]
        rows.append([label, g["n_items"], g["dim"], g["spectrum"]["dims_for_90"], g["participation_ratio"],
                     g["twonn_dimension"], hub["skewness"], hub["gini"], hub["max"], g["anisotropy"],
                     g["norms"]["mean"], g["norms"]["std"]])
    k = next(iter(report["geometry"].values()))["hubness"]["k"]
    return _table(["model", "items", "dim", "components for 90 %", "participation ratio", "TwoNN dimension",
                   f"k-occurrence skew (k={k})", "k-occurrence Gini", "max k-occurrence", "mean pairwise cosine",
                   "mean norm", "norm std"], rows)


def _group_table(table: Mapping[str, Any], k: int) -> str:
    rows = [[label, r["group"], r["users"], r[f"HR@{k}"], r[f"NDCG@{k}"]]
            for label, model_rows in table["models"].items() for r in model_rows]
    return _table(["model", "group", "users", f"HR@{k}", f"NDCG@{k}"], rows)


def _item(entry: Mapping[str, Any]) -> str:
    mark = " <b>← target</b>" if entry.get("is_target") else ""
    meta = f"<br><small>{html.escape(entry['meta'])}</small>" if entry["meta"] else ""
    return f"{html.escape(entry['title'])}{mark}{meta}"


def _predictions(records: Sequence[Mapping[str, Any]]) -> str:
    parts = []
    for user in records:
        history = "".join(f"<li>{_item(e)}</li>" for e in user["recent_history"])
        columns = [(f"{label}: {order}", items) for label, orders in user["lists"].items()
                   for order, items in orders.items()]
        depth = max((len(items) for _, items in columns), default=0)
        head = "".join(f"<th>{html.escape(name)}</th>" for name, _ in columns)
        body = "".join("<tr><td>" + str(i + 1) + "</td>" + "".join(
            f"<td>{_item(items[i]) if i < len(items) else ''}</td>" for _, items in columns) + "</tr>"
            for i in range(depth))
        parts.append(
            f"<h3>user {html.escape(user['user_id'])} ({user['history_length']} items of history)</h3>"
            f"<p>Most recent history, oldest first:</p><ol>{history}</ol>"
            f"<p>Test target: {_item(user['target'])}</p>"
            f"<table><thead><tr><th>#</th>{head}</tr></thead><tbody>{body}</tbody></table>")
    return "".join(parts)


STYLE = ("body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em}"
         "table{border-collapse:collapse;margin:0.5em 0 1.5em}td,th{border:1px solid #ccc;padding:3px 7px;"
         "font-size:0.9em;vertical-align:top;text-align:left}img{max-width:100%}small{color:#666}")


def render_html(report: Mapping[str, Any], images: Sequence[str]) -> str:
    """The report page; ``images`` are the PNG names written beside it."""
    b = report["breakdown"]
    models = _table(["model", "backbone", "similarity", "test NDCG@10", "artifact", "version"],
                    [[m["label"], m["backbone"], m["similarity"],
                      (m.get("metrics") or {}).get("test", {}).get("NDCG@10"), m["path"], m["version"]]
                     for m in report["models"]])
    figure = {name: f"<figure><img src='{name}' alt='{html.escape(PLOTS[name][0])}'></figure>" for name in images}
    head = b["head"]
    sections = [
        f"<h1>seqrec analyze: {html.escape(report['data']['path'])}</h1>",
        f"<p>{report['data']['users']:,} users, {report['data']['items']:,} items. Report JSON: "
        "<a href='report.json'>report.json</a>.</p>", models,
        "<h2>1. Item-embedding geometry</h2>",
        "<p>The encoders' item embeddings (before the cosine projection of models that score by cosine, so the "
        "norms mean something; hubness, anisotropy and t-SNE use cosine similarity, as scoring does).</p>",
        _geometry_table(report),
        *(figure.get(n, "") for n in ("spectrum.png", "hubness.png", "norms.png", "tsne.png", "cka.png")),
        "<h2>2. Where the model wins</h2>",
        f"<p>Split: {b['split']}. Head = the {head['items']:,} most popular items of {head['catalogue']:,}, "
        f"{100 * head['interaction_share']:.1f} % of training interactions (share asked: {100 * head['share']:.0f} "
        "%). Ranks are full-ranking ranks, history excluded, ties against the target.</p>",
        _group_table(b["popularity"], b["k"]), figure.get("popularity.png", ""),
        _group_table(b["length"], b["k"]), figure.get("length.png", ""),
        "<h2>3. Readable predictions</h2>", _predictions(report["predictions"]),
        "<h2>4. Training curves</h2>", figure.get("curves.png", "<p>No training log (history.jsonl) found.</p>"),
    ]
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>seqrec analyze</title>"
            f"<style>{STYLE}</style></head><body>{''.join(sections)}</body></html>\n")
