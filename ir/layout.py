"""Layout algebra: how a reshape groups dims, and when a chain of layout ops is a strided view.

A view reads its root tensor (a row-major buffer) at `offset + sum(index[d] * strides[d])`. A
transpose permutes strides, a slice moves the offset, a broadcast gives stride 0 to the dims it
expands, and a row-major reshape regroups dims: splitting a dim is always a view, merging dims is
one only where they are laid out one after the other (numpy's no-copy reshape rule), or where the
inner one is a broadcast (jnp.repeat: a divisor, `StridedView.divisors`). A chain with a merge
that is neither (a head merge after a transpose) is no view: it must be copied (`copies`).

The other direction: a kernel's output read only by transposes and reshapes that end in a graph
output is written through them (`output_views`), so a head merge of attention's result is no copy.
`materialised` says which nodes a launch plan gives buffers (codegen's planner uses it; the cost
model should charge exactly `copies`).
"""
from __future__ import annotations

from dataclasses import dataclass

from mugraph.ir.ops import KOp


def reshape_groups(old: tuple, new: tuple) -> list[tuple[tuple, tuple]]:
    """The dims of `old` and `new` in matching groups of equal product, in order:
    [(old dims, new dims), ...]. Each group starts with one dim of each side and takes more from
    the side whose product is smaller until the products agree; unit dims left at the end join
    the last group, so every dim is in exactly one group."""
    groups, i, j = [], 0, 0
    while i < len(old) and j < len(new):
        gi, gj, pi, pj = [i], [j], old[i], new[j]
        i, j = i + 1, j + 1
        while pi != pj:
            if pi < pj:
                pi, i = pi * old[i], i + 1
                gi.append(i - 1)
            else:
                pj, j = pj * new[j], j + 1
                gj.append(j - 1)
        groups.append((gi, gj))
    if groups:
        groups[-1][0].extend(range(i, len(old)))
        groups[-1][1].extend(range(j, len(new)))
    return [(tuple(a), tuple(b)) for a, b in groups]


def reshape_strides(old: tuple, strides: tuple, new: tuple) -> tuple | None:
    """Strides that read `new` from a view of shape `old` with `strides`, or None where the
    reshape needs a copy (it merges dims that are not laid out one after the other)."""
    out = [0] * len(new)
    for gi, gj in reshape_groups(old, new):
        wide = [d for d in gi if old[d] != 1]
        for a, b in zip(wide, wide[1:]):
            if strides[a] != strides[b] * old[b]:
                return None
        step = strides[wide[-1]] if wide else 0
        for d in reversed(gj):
            out[d] = step if new[d] != 1 else 0
            step *= new[d]
    return tuple(out)


def row_major(shape) -> tuple:
    strides, s = [], 1
    for d in reversed(tuple(shape)):
        strides.append(s)
        s *= d
    return tuple(reversed(strides))


@dataclass(frozen=True)
class StridedView:
    """`root` read at `offset + sum(index[d] // divisors[d] * strides[d])` for every index of the
    view's shape. A divisor other than 1 is a repeat: jnp.repeat(k, r, axis) (a broadcast of a
    new dim merged into the dim before it, GQA's K/V heads) reads element i of the repeated dim
    from element i // r of the source."""

    root: object
    offset: int
    strides: tuple
    divisors: tuple = ()

    @property
    def repeats(self) -> tuple:
        return self.divisors or (1,) * len(self.strides)

    @property
    def plain(self) -> bool:
        """No repeated dim: an affine map of indices."""
        return all(d == 1 for d in self.repeats)


def strided_view(node, materialised=lambda n: False) -> StridedView | None:
    """How `node` reads the buffer of the first non-layout node under it (or of a layout node
    for which `materialised(n)` holds), or None where the chain is no strided view."""
    if node.op not in LAYOUT_STRIDES or materialised(node):
        return StridedView(node, 0, row_major(node.shape))
    inner = strided_view(node.srcs[0], materialised)
    if inner is None:
        return None
    return LAYOUT_STRIDES[node.op](node, inner)


def _transpose(node, v: StridedView) -> StridedView:
    return StridedView(v.root, v.offset, tuple(v.strides[p] for p in node.arg),
                       tuple(v.repeats[p] for p in node.arg))


def _reshape(node, v: StridedView) -> StridedView | None:
    """Group by group (`reshape_groups`): a dim that keeps its extent keeps its stride and
    divisor; a dim merged with the broadcast dim after it is a repeat (jnp.repeat); other
    groups follow `reshape_strides`, and none may hold a repeated dim."""
    old, new = node.srcs[0].shape, node.shape
    strides, divisors = [0] * len(new), [1] * len(new)
    for gi, gj in reshape_groups(old, new):
        wide_i, wide_j = [i for i in gi if old[i] != 1], [j for j in gj if new[j] != 1]
        if len(wide_i) == 1 and len(wide_j) == 1:
            strides[wide_j[0]], divisors[wide_j[0]] = v.strides[wide_i[0]], v.repeats[wide_i[0]]
        elif any(v.repeats[i] != 1 for i in wide_i):
            return None
        elif len(wide_j) == 1 and len(wide_i) == 2 and v.strides[wide_i[1]] == 0:
            strides[wide_j[0]], divisors[wide_j[0]] = v.strides[wide_i[0]], old[wide_i[1]]
        else:
            found = reshape_strides(tuple(old[i] for i in gi), tuple(v.strides[i] for i in gi),
                                    tuple(new[j] for j in gj))
            if found is None:
                return None
            for j, st in zip(gj, found):
                strides[j] = st
    plain = all(d == 1 for d in divisors)
    return StridedView(v.root, v.offset, tuple(strides), () if plain else tuple(divisors))


def _broadcast(node, v: StridedView) -> StridedView:
    old = node.srcs[0].shape
    return StridedView(v.root, v.offset, tuple(0 if o == 1 and n != 1 else s
                                               for o, n, s in zip(old, node.arg, v.strides)),
                       v.divisors)


def _slice(node, v: StridedView) -> StridedView | None:
    starts = node.arg[0]
    if any(a % r for a, r in zip(starts, v.repeats)):
        return None     # a window that starts inside a repeated element
    return StridedView(v.root, v.offset + sum(a // r * s for a, r, s in
                                              zip(starts, v.repeats, v.strides)),
                       v.strides, v.divisors)


LAYOUT_STRIDES = {KOp.TRANSPOSE: _transpose, KOp.RESHAPE: _reshape,
                  KOp.BROADCAST: _broadcast, KOp.SLICE: _slice}


def written_through(chain: list, shape: tuple) -> tuple | None:
    """Strides at which a tensor of `shape` lands in the row-major buffer of `chain[-1]`, where
    `chain` are transposes and reshapes applied in order (each a bijection of elements): the
    inverse of `strided_view`, for a kernel that writes its output through a view. None where
    some reshape in it is no view of the buffer."""
    strides = row_major(chain[-1].shape) if chain else row_major(shape)
    for node in reversed(chain):
        if node.op is KOp.TRANSPOSE:
            back = [0] * len(strides)
            for d, p in enumerate(node.arg):
                back[p] = strides[d]
            strides = tuple(back)
        elif node.op is KOp.RESHAPE:
            strides = reshape_strides(node.shape, strides, node.srcs[0].shape)
            if strides is None:
                return None
        else:
            return None
    return strides


def output_views(graph) -> dict:
    """{custom op output: (graph output, strides)} for every graph output that is a chain of
    transposes and reshapes of one custom op's output that nothing else reads, where the chain is
    a bijection the kernel can write through (`written_through`): the kernel stores its tile
    straight into the output's buffer, and the chain costs no copy. (A head merge of attention's
    [B, H, S, D] result into [B, S, H*D] is one: strides (S*H*D, D, H*D, 1).)"""
    users: dict = {}
    for node in graph.nodes:
        for src in node.srcs:
            users.setdefault(src, []).append(node)
    outputs = set(graph.outputs)
    found = {}
    for out in dict.fromkeys(graph.outputs):
        chain, node = [], out
        while node.op in (KOp.TRANSPOSE, KOp.RESHAPE):
            chain.append(node)
            node = node.srcs[0]
        if not chain or node.op is not KOp.CUSTOM or node in outputs or node in found:
            continue
        inner = chain[1:] + [node]
        if any(len(users.get(n, ())) != 1 or (n in outputs and n is not out) for n in inner):
            continue
        strides = written_through(chain[::-1], node.shape)
        if strides is not None:
            found[node] = (out, strides)
    return found


def materialised(graph, written=None) -> set:
    """The nodes a launch plan gives a buffer: what a library op or a graph output reads, what a
    custom op reads that is no strided view (a head merge after a transpose), and the sources
    of materialised layout nodes; custom ops read every other layout chain through strides,
    and write the chains of `output_views` in place. A layout node in this set is a copy."""
    written = output_views(graph) if written is None else written
    need = set(graph.outputs)
    for node in graph.nodes:
        if node.op is KOp.CUSTOM:
            tiles = [b.arg.tile_shape for b in node.arg[0].inputs]
            need.update(s for s, t in zip(node.srcs, tiles) if not _readable(s, t))
        elif node.op not in LAYOUT_STRIDES:
            need.update(node.srcs)
    through = set()   # the chains of output views: the kernel writes through them
    for out, _ in written.values():
        while out.op in LAYOUT_STRIDES:
            through.add(out)
            out = out.srcs[0]
    for node in reversed(graph.nodes):  # a materialised layout node reads a materialised source
        if node in need and node.op in LAYOUT_STRIDES and node not in through:
            need.update(node.srcs)
    return need


def _readable(node, tile) -> bool:
    """Whether a custom op can load tiles of `tile` shape of `node` through its strided view: a
    repeated dim's tiles must hold whole repeats or lie inside one."""
    v = strided_view(node)
    if v is None or not v.plain and v.root.op is KOp.IOTA:   # an index tile is computed plainly
        return False
    return all(r == 1 or t % r == 0 or r % t == 0 for r, t in zip(v.repeats, tile))


def copies(graph) -> list:
    """The layout nodes of `graph` that run as copies (library launches), in program order: the
    materialised ones other than the final links of output views and row-major reshapes of a
    buffer (a reshape of a contiguous tensor is the same bytes)."""
    written = output_views(graph)
    need = materialised(graph, written)
    ends = {out for out, _ in written.values()}
    return [n for n in graph.nodes if n.op in LAYOUT_STRIDES and n in need and n not in ends
            and not _same_bytes(n)]


def _same_bytes(node) -> bool:
    """A reshape that reads its buffer row-major from its start: the same bytes, no copy."""
    v = strided_view(node) if node.op is KOp.RESHAPE else None
    return v is not None and v.plain and v.offset == 0 and v.strides == row_major(node.shape)
