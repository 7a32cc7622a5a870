"""A layered (Sugiyama-style) layout of a small DAG of boxes: ranks by longest path, dummy nodes on
long edges, barycentric crossing reduction, coordinates by isotonic regression, and edge routes
that run only through the gaps between layers and the columns their dummies reserve.
"""
from __future__ import annotations

from dataclasses import dataclass, field

GAP_X, GAP_Y, DUMMY_GAP, SWEEPS = 18.0, 30.0, 8.0, 12


@dataclass(frozen=True)
class Edge:
    """An edge from box `src` to box `dst`; `src_dx` / `dst_dx`: where it leaves / enters, as an
    offset from the box's centre (a port)."""

    src: object
    dst: object
    src_dx: float = 0.0
    dst_dx: float = 0.0


@dataclass
class Layout:
    """Positions (top-left corners) of the boxes, the layers' vertical bands and each edge's path."""

    xy: dict
    layer_top: list
    layer_bottom: list
    width: float
    height: float
    paths: list = field(default_factory=list)   # per edge, in edge order: its segments

    def path_d(self, i: int, dx: float = 0.0, dy: float = 0.0) -> str:
        """Edge `i`'s path as SVG path data, moved by (dx, dy)."""
        return " ".join(f"{cmd} " + ", ".join(f"{x + dx:.1f} {y + dy:.1f}" for x, y in pts)
                        for cmd, *pts in self.paths[i])


def longest_path_ranks(keys, edges, floor=lambda key: 0) -> dict:
    """Each key's rank: at least `floor(key)` and one more than every source's; `keys` must list
    every source before its consumers."""
    srcs: dict = {k: [] for k in keys}
    for e in edges:
        srcs[e.dst].append(e.src)
    rank: dict = {}
    for k in keys:
        rank[k] = max([floor(k)] + [rank[s] + 1 for s in srcs[k]])
    return rank


def sink_leaves(rank: dict, edges, leaves, ceiling=lambda key: None) -> dict:
    """`rank` with each of `leaves` (no sources) moved down to just above its first consumer,
    but no lower than `ceiling(key)` (None: no bound): short edges from constants and tiles."""
    rank = dict(rank)
    for k in leaves:
        below = [rank[e.dst] - 1 for e in edges if e.src == k]
        if below:
            lowest = min(below)
            bound = ceiling(k)
            rank[k] = max(rank[k], lowest if bound is None else min(lowest, bound))
    return rank


# ---- layers and crossing reduction -----------------------------------------------------------------
@dataclass
class _Graph:
    """The layered graph with dummies: layers of ids, and the links between adjacent layers."""

    layers: list
    up: dict        # id -> [(id above, dx of the id above's port, own port dx)]
    down: dict      # id -> [(id below, own port dx, dx of the id below's port)]
    chains: list    # per edge: the ids it passes, source to destination


def _layered(keys, rank: dict, edges) -> _Graph:
    layers = [[] for _ in range(max(rank.values(), default=-1) + 1)]
    for k in keys:
        layers[rank[k]].append(k)
    g = _Graph(layers, {}, {}, [])
    for i, e in enumerate(edges):
        chain = [e.src] + [("dummy", i, r) for r in range(rank[e.src] + 1, rank[e.dst])] + [e.dst]
        for r, d in zip(range(rank[e.src] + 1, rank[e.dst]), chain[1:-1]):
            layers[r].append(d)
        for a, b in zip(chain, chain[1:]):
            a_dx = e.src_dx if a == e.src else 0.0
            b_dx = e.dst_dx if b == e.dst else 0.0
            g.down.setdefault(a, []).append((b, a_dx, b_dx))
            g.up.setdefault(b, []).append((a, a_dx, b_dx))
        g.chains.append(chain)
    return g


def _at(pos: dict, key, dx: float, width) -> float:
    """A port's place in its layer's order: the box's index, moved by the port's offset (within
    half a place), so edges into different ports of one box can be told apart."""
    return pos[key] + max(-0.45, min(0.45, dx / (width(key) + 1.0)))


def _crossings(upper: list, lower: list, down: dict, width) -> int:
    above, below = {k: i for i, k in enumerate(upper)}, {k: i for i, k in enumerate(lower)}
    links = [(_at(above, a, adx, width), _at(below, b, bdx, width))
             for a in upper for b, adx, bdx in down.get(a, ())]
    return sum(1 for x in range(len(links)) for y in range(x + 1, len(links))
               if (links[x][0] - links[y][0]) * (links[x][1] - links[y][1]) < 0)


def _total_crossings(g: _Graph, width) -> int:
    return sum(_crossings(a, b, g.down, width) for a, b in zip(g.layers, g.layers[1:]))


def _reorder(layer: list, neighbours: dict, other: list, width, upward: bool) -> list:
    """`layer` sorted by the mean place of each id's neighbours' ports in the adjacent layer
    `other` (an id without any keeps its relative place)."""
    pos = {k: i for i, k in enumerate(other)}

    def barycentre(item):
        i, k = item
        near = [_at(pos, n, adx if upward else bdx, width)
                for n, adx, bdx in neighbours.get(k, ()) if n in pos]
        return sum(near) / len(near) if near else float(i) * len(other) / max(len(layer), 1)

    return [k for _, k in sorted(enumerate(layer), key=barycentre)]


def reduce_crossings(g: _Graph, width) -> None:
    """Alternate downward and upward barycentre sweeps; keep the order with the fewest crossings."""
    best, best_count = [list(layer) for layer in g.layers], _total_crossings(g, width)
    for sweep in range(SWEEPS):
        if best_count == 0:
            break
        if sweep % 2 == 0:
            for r in range(1, len(g.layers)):
                g.layers[r] = _reorder(g.layers[r], g.up, g.layers[r - 1], width, True)
        else:
            for r in range(len(g.layers) - 2, -1, -1):
                g.layers[r] = _reorder(g.layers[r], g.down, g.layers[r + 1], width, False)
        count = _total_crossings(g, width)
        if count < best_count:
            best, best_count = [list(layer) for layer in g.layers], count
    g.layers = best
    _transpose(g, width)


def _local_crossings(g: _Graph, r: int, width) -> int:
    above = _crossings(g.layers[r - 1], g.layers[r], g.down, width) if r > 0 else 0
    below = _crossings(g.layers[r], g.layers[r + 1], g.down, width) \
        if r + 1 < len(g.layers) else 0
    return above + below


def _transpose(g: _Graph, width) -> None:
    """Swap neighbours in a layer while that removes crossings (a few rounds at most)."""
    for _ in range(4):
        improved = False
        for r, layer in enumerate(g.layers):
            for i in range(len(layer) - 1):
                before = _local_crossings(g, r, width)
                layer[i], layer[i + 1] = layer[i + 1], layer[i]
                if _local_crossings(g, r, width) < before:
                    improved = True
                else:
                    layer[i], layer[i + 1] = layer[i + 1], layer[i]
        if not improved:
            return


# ---- coordinates -----------------------------------------------------------------------------------
def _isotonic(values: list) -> list:
    """The non-decreasing sequence nearest to `values` in least squares (pool adjacent violators)."""
    blocks: list = []
    for v in values:
        blocks.append([v, 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            s, c = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += c
    return [s / c for s, c in blocks for _ in range(c)]


def _spread(desired: list, seps: list) -> list:
    """Centres as near to `desired` as the order and the separations `seps` allow."""
    offsets = [0.0]
    for s in seps:
        offsets.append(offsets[-1] + s)
    fitted = _isotonic([d - o for d, o in zip(desired, offsets)])
    return [f + o for f, o in zip(fitted, offsets)]


def _separations(layer: list, width) -> list:
    seps = []
    for a, b in zip(layer, layer[1:]):
        dummies = isinstance(a, tuple) and a[:1] == ("dummy",) and \
            isinstance(b, tuple) and b[:1] == ("dummy",)
        seps.append((width(a) + width(b)) / 2 + (DUMMY_GAP if dummies else GAP_X))
    return seps


def _centres(g: _Graph, width) -> dict:
    x: dict = {}
    for layer in g.layers:
        seps = _separations(layer, width)
        x.update(zip(layer, _spread([0.0] * len(layer), seps)))
    for sweep in range(8):
        order = range(1, len(g.layers)) if sweep % 2 == 0 else range(len(g.layers) - 2, -1, -1)
        links = g.up if sweep % 2 == 0 else g.down
        for r in order:
            layer = g.layers[r]
            desired = [_pull(k, links, x, upward=sweep % 2 == 0) for k in layer]
            x.update(zip(layer, _spread(desired, _separations(layer, width))))
    return x


def _pull(k, links: dict, x: dict, upward: bool) -> float:
    """Where `k`'s centre would put its ports right below (or above) its neighbours' ports."""
    near = links.get(k, ())
    if not near:
        return x[k]
    if upward:   # (above, above's port, own port)
        return sum(x[n] + ndx - own for n, ndx, own in near) / len(near)
    return sum(x[n] + ndx - own for n, own, ndx in near) / len(near)


# ---- the whole layout ------------------------------------------------------------------------------
def layout(sizes: dict, rank: dict, edges, band_gap=lambda r: 0.0) -> Layout:
    """Lay out boxes `sizes` ({key: (w, h)}, in program order) on `rank`s with `edges`.

    `band_gap(r)`: extra space above layer r (for a region's title)."""
    keys = list(sizes)
    g = _layered(keys, rank, edges)

    def width(k):
        return sizes[k][0] if k in sizes else 0.0

    reduce_crossings(g, width)
    x = _centres(g, width)
    left = min((x[k] - width(k) / 2 for layer in g.layers for k in layer), default=0.0)
    tops, bottoms, y = [], [], 0.0
    for r, layer in enumerate(g.layers):
        y += band_gap(r) + (GAP_Y if r else 0.0)
        tops.append(y)
        y += max((sizes[k][1] for k in layer if k in sizes), default=0.0)
        bottoms.append(y)
    xy = {k: (x[k] - width(k) / 2 - left, tops[rank[k]]) for k in keys}
    right = max((x[k] + width(k) / 2 - left for layer in g.layers for k in layer), default=0.0)
    out = Layout(xy, tops, bottoms, right, y)
    xs = {k: v - left for k, v in x.items()}
    out.paths = [_route(chain, e, xs, sizes, rank, out) for chain, e in zip(g.chains, edges)]
    return out


def _route(chain: list, e: Edge, x: dict, sizes: dict, rank: dict, lay: Layout) -> list:
    """The edge's segments ("M"/"L"/"C", points): down its source's column to the band's bottom,
    curves across each gap between layers, straight through the bands its dummies cross, into the
    destination's top. Nothing but the gaps and the dummies' reserved columns is crossed."""
    sx = x[e.src] + e.src_dx
    y0 = lay.xy[e.src][1] + sizes[e.src][1]
    r = rank[e.src]
    segments = [("M", (sx, y0))]
    if lay.layer_bottom[r] > y0:
        segments.append(("L", (sx, lay.layer_bottom[r])))
    for node in chain[1:]:
        top, bottom = lay.layer_top[r + 1], lay.layer_bottom[r]
        nx = x[node] + (e.dst_dx if node == e.dst else 0.0)
        mid = (top + bottom) / 2
        segments.append(("C", (sx, mid), (nx, mid), (nx, top)))
        r, sx = r + 1, nx
        if node != e.dst:
            segments.append(("L", (sx, lay.layer_bottom[r])))
    return segments
