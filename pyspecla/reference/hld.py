"""The heavy-light (HLD) schedule of a draft tree, in plain Python: the oracle of the native builder
(native/src/hld_schedule.c) and a reader of its packed int32 layout (specla.h, docs/hld-layout.md).

`build_schedule(parents, capacity)` returns the packed array the native `specla_hld_build` writes,
int for int; the tests compare the two. `ScheduleView` parses a packed array (from either builder)
into named numpy views for tests and tools.

The rules, restated from docs/specla.md §3 item 3:
  - the tree is a parent array in topological order: parents[0] = -1, 0 <= parents[t] < t;
  - a node's heavy child is the child with the largest subtree, ties to the lowest index;
  - a chain starts at the root and at every node that is not its parent's heavy child (chains are
    numbered by their first node) and follows heavy children down to a leaf;
  - wave(root chain) = 0, wave(chain) = wave(chain holding its first node's parent) + 1; the chains
    are stable-sorted by wave, and that sorted position is the chain index in the schedule;
  - each distinct parent node of a non-root chain gets a boundary slot (the only intermediate states
    a verify materialises), slots in increasing node order.

No recursion anywhere: trees may be thousands of nodes deep."""

from __future__ import annotations

import operator

import numpy as np

from ..errors import UsageError

MAGIC = 0x534C4844  # SPECLA_HLD_MAGIC
VERSION = 1  # SPECLA_HLD_VERSION
HEADER_INTS = 20  # SPECLA_HLD_HEADER_INTS

# The ten arrays after the header, in layout order; every one has `capacity` entries except
# chain_offsets, which has capacity + 1.
ARRAY_NAMES = (
    "parents",
    "order",
    "chain_offsets",
    "chain_parent_boundary",
    "chain_wave",
    "node_boundary",
    "node_depth",
    "chain_parent_node",
    "node_chain",
    "node_position",
)
# Which count each array's used part has (the rest of its `capacity` entries is -1).
_USED_LENGTH = {
    "parents": "n_nodes",
    "order": "n_nodes",
    "chain_offsets": "n_chains + 1",
    "chain_parent_boundary": "n_chains",
    "chain_wave": "n_chains",
    "node_boundary": "n_nodes",
    "node_depth": "n_nodes",
    "chain_parent_node": "n_chains",
    "node_chain": "n_nodes",
    "node_position": "n_nodes",
}
HEADER_FIELDS = (
    "magic",
    "version",
    "n_nodes",
    "n_chains",
    "n_waves",
    "n_boundaries",
    "max_chains_per_wave",
    "max_depth",
    "capacity",
    "total",
)
_INT32_MAX = 2**31 - 1
MAX_CAPACITY = (_INT32_MAX - HEADER_INTS - 1) // len(ARRAY_NAMES)


def schedule_size(capacity: int) -> int:
    """Ints of a schedule padded to `capacity` (specla_hld_size); -1 when capacity is out of range."""
    capacity = operator.index(capacity)
    if capacity < 1 or capacity > MAX_CAPACITY:
        return -1
    return HEADER_INTS + len(ARRAY_NAMES) * capacity + 1


def array_offsets(capacity: int) -> dict[str, int]:
    """Offset (in ints from the start) of each array of a schedule padded to `capacity`."""
    offsets, at = {}, HEADER_INTS
    for name in ARRAY_NAMES:
        offsets[name] = at
        at += capacity + (1 if name == "chain_offsets" else 0)
    return offsets


def parent_array(parents, what: str = "build_schedule") -> np.ndarray:
    """`parents` as a 1-D int64 array; rejects what is not a sequence of integers (the values
    themselves are checked by the builders)."""
    array = np.asarray(parents)
    if array.ndim != 1:
        raise UsageError(f"{what}: parents must be a 1-D sequence of node indices, got shape {array.shape}")
    if array.size == 0:
        return np.zeros(0, dtype=np.int64)
    if array.dtype.kind not in "iu":
        raise UsageError(f"{what}: parents must be integers, got dtype {array.dtype}")
    return array.astype(np.int64)


def capacity_value(capacity, n_nodes: int, what: str = "build_schedule") -> int:
    """`capacity` as an int (default: the tree's size, at least 1 so that an empty tree is reported
    as such); rejects what is not an integer."""
    if capacity is None:
        return max(n_nodes, 1)
    try:
        return operator.index(capacity)
    except TypeError:
        raise UsageError(f"{what}: capacity must be an integer, got {capacity!r}") from None


def check_parents(parents: np.ndarray, capacity: int, what: str = "build_schedule") -> None:
    """The builder's argument checks, with the native builder's messages."""
    if capacity < 1 or capacity > MAX_CAPACITY:
        raise UsageError(f"{what}: capacity = {capacity} is not in [1, {MAX_CAPACITY}]")
    n = len(parents)
    if n < 1 or n > capacity:
        raise UsageError(f"{what}: n_nodes = {n} is not in [1, capacity = {capacity}]")
    if parents[0] != -1:
        raise UsageError(f"{what}: parents[0] = {parents[0]} must be -1 (node 0 is the root)")
    for t in range(1, n):
        if not 0 <= parents[t] < t:
            raise UsageError(f"{what}: parents[{t}] = {parents[t]} is not in [0, {t}) "
                             "(parents must be in topological order)")


def build_schedule(parents, capacity: int | None = None) -> np.ndarray:
    """The packed HLD schedule of the tree `parents`, padded to `capacity` (default: the tree's size).
    Raises UsageError for an invalid parent array or capacity."""
    parents = parent_array(parents)
    n = len(parents)
    capacity = capacity_value(capacity, n)
    check_parents(parents, capacity)
    parent = [int(p) for p in parents]

    children: list[list[int]] = [[] for _ in range(n)]
    for node in range(1, n):
        children[parent[node]].append(node)  # appended in increasing index

    # Subtree sizes: every child has a larger index than its parent, so visiting nodes from the
    # last to the first sees each subtree complete before its parent is summed.
    subtree_size = [1] * n
    for node in reversed(range(n)):
        for child in children[node]:
            subtree_size[node] += subtree_size[child]

    # Largest subtree first, then lowest index.
    heavy_child = [max(kids, key=lambda c: (subtree_size[c], -c)) if kids else None for kids in children]

    # Chains by first node (increasing index), each followed down its heavy children.
    chains: list[list[int]] = []
    chain_of_node = [None] * n
    for node in range(n):
        if node != 0 and heavy_child[parent[node]] == node:
            continue
        chain = [node]
        while heavy_child[chain[-1]] is not None:
            chain.append(heavy_child[chain[-1]])
        for member in chain:
            chain_of_node[member] = len(chains)
        chains.append(chain)

    # Waves: a chain's parent node lies in a chain with a smaller first node, already numbered.
    wave_by_first_node_number = []
    for chain in chains:
        first = chain[0]
        if first == 0:
            wave_by_first_node_number.append(0)
        else:
            wave_by_first_node_number.append(wave_by_first_node_number[chain_of_node[parent[first]]] + 1)
    schedule_order = sorted(range(len(chains)), key=lambda c: wave_by_first_node_number[c])  # stable
    chains = [chains[c] for c in schedule_order]
    chain_waves = [wave_by_first_node_number[c] for c in schedule_order]

    boundary_nodes = sorted({parent[chain[0]] for chain in chains if chain[0] != 0})
    slot_of_node = {node: slot for slot, node in enumerate(boundary_nodes)}

    depth = [0] * n
    for node in range(1, n):
        depth[node] = depth[parent[node]] + 1

    arrays = {name: np.full(capacity + (1 if name == "chain_offsets" else 0), -1, dtype=np.int64)
              for name in ARRAY_NAMES}
    arrays["parents"][:n] = parent
    arrays["node_depth"][:n] = depth
    position = 0
    for index, chain in enumerate(chains):
        first = chain[0]
        arrays["chain_offsets"][index] = position
        arrays["chain_wave"][index] = chain_waves[index]
        if first != 0:
            arrays["chain_parent_node"][index] = parent[first]
            arrays["chain_parent_boundary"][index] = slot_of_node[parent[first]]
        for node in chain:
            arrays["order"][position] = node
            arrays["node_position"][node] = position
            arrays["node_chain"][node] = index
            position += 1
    arrays["chain_offsets"][len(chains)] = position
    for node, slot in slot_of_node.items():
        arrays["node_boundary"][node] = slot

    chains_per_wave = [chain_waves.count(w) for w in range(max(chain_waves) + 1)]
    offsets = array_offsets(capacity)
    header = [MAGIC, VERSION, n, len(chains), len(chains_per_wave), len(boundary_nodes), max(chains_per_wave),
              max(depth), capacity, schedule_size(capacity)] + [offsets[name] for name in ARRAY_NAMES]
    packed = np.concatenate([np.array(header, dtype=np.int64)] + [arrays[name] for name in ARRAY_NAMES])
    assert len(packed) == schedule_size(capacity)
    return packed.astype(np.int32)


class ScheduleView:
    """Named read-only views of a packed schedule (from either builder).

    Header fields are ints (`n_nodes`, `n_chains`, `n_waves`, `n_boundaries`, `max_chains_per_wave`,
    `max_depth`, `capacity`, `total`, `magic`, `version`, `offsets`); each array is an attribute
    holding its used entries only (e.g. `order[:n_nodes]`, `chain_offsets[:n_chains + 1]`), and
    `padded[name]` holds all of its entries. Derived: `chains` (node lists, schedule order),
    `waves` (chain-index lists), `boundary_nodes` (slot -> node)."""

    def __init__(self, schedule):
        packed = np.asarray(schedule)
        if packed.ndim != 1 or packed.dtype != np.int32:
            raise UsageError(f"ScheduleView: expected a 1-D int32 array, got {packed.dtype} of shape {packed.shape}")
        if len(packed) < HEADER_INTS:
            raise UsageError(f"ScheduleView: {len(packed)} ints is shorter than the {HEADER_INTS}-int header")
        if int(packed[0]) != MAGIC or int(packed[1]) != VERSION:
            raise UsageError(f"ScheduleView: magic 0x{int(packed[0]) & 0xFFFFFFFF:08x} version {int(packed[1])} "
                             f"is not an HLD schedule (0x{MAGIC:08x} version {VERSION})")
        for index, field in enumerate(HEADER_FIELDS):
            setattr(self, field, int(packed[index]))
        if self.total != schedule_size(self.capacity) or len(packed) < self.total:
            raise UsageError(f"ScheduleView: header says capacity {self.capacity}, total {self.total}; "
                             f"the array has {len(packed)} ints")
        self.offsets = {name: int(packed[10 + i]) for i, name in enumerate(ARRAY_NAMES)}
        if self.offsets != array_offsets(self.capacity):
            raise UsageError(f"ScheduleView: offsets {self.offsets} do not match capacity {self.capacity}")
        view = packed[: self.total].view()
        view.flags.writeable = False
        self.packed = view
        self.header = view[:HEADER_INTS]
        self.padded = {}
        lengths = {"n_nodes": self.n_nodes, "n_chains": self.n_chains, "n_chains + 1": self.n_chains + 1}
        for name in ARRAY_NAMES:
            start = self.offsets[name]
            full = view[start: start + self.capacity + (1 if name == "chain_offsets" else 0)]
            self.padded[name] = full
            setattr(self, name, full[: lengths[_USED_LENGTH[name]]])

    def padding(self, name: str) -> np.ndarray:
        """The entries of array `name` beyond its used ones (all -1 in a valid schedule)."""
        used = len(getattr(self, name))
        return self.padded[name][used:]

    @property
    def chains(self) -> list[list[int]]:
        return [self.order[self.chain_offsets[c]: self.chain_offsets[c + 1]].tolist() for c in range(self.n_chains)]

    @property
    def waves(self) -> list[list[int]]:
        waves: list[list[int]] = [[] for _ in range(self.n_waves)]
        for c in range(self.n_chains):
            waves[int(self.chain_wave[c])].append(c)
        return waves

    @property
    def boundary_nodes(self) -> np.ndarray:
        """Node whose state each boundary slot holds, by slot."""
        nodes = np.full(self.n_boundaries, -1, dtype=np.int32)
        for node in np.flatnonzero(self.node_boundary >= 0):
            nodes[self.node_boundary[node]] = node
        return nodes

    def __repr__(self) -> str:
        return (f"ScheduleView(n_nodes={self.n_nodes}, n_chains={self.n_chains}, n_waves={self.n_waves}, "
                f"n_boundaries={self.n_boundaries}, capacity={self.capacity}, chains={self.chains})")
