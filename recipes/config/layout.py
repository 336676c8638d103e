"""The layout of one run: parallel degrees, what follows from them, and where every rank sits.

One pure object (torchtitan's `ParallelDims` is the model) owns the degrees (TP, PP, virtual
stages, CP, EP, expert TP), the derived sizes (DP, expert DP, micro-batches per step, padded
vocabulary, layers per stage and per virtual chunk, a hybrid model's layer symbols per chunk as
Megatron's `|` segments place them) and every process group as global ranks and
as node:GPU. Validation, the machine check, the dry run, the planner and the one translation
into Megatron Core read it; nothing else does this arithmetic.

Rank order is Megatron Core's default, 'tp-cp-ep-dp-pp' (TP varies fastest, PP slowest). Dense
layers use the grid TP x CP x DP x PP; expert layers use their own grid, expert-TP x EP x
expert-DP x PP, over the same ranks (`parallel_state.initialize_model_parallel` builds both).
`tests/unit/test_layout_groups.py` checks every group of every registered recipe, rank for rank,
against the groups Megatron Core itself creates on torch's fake process-group backend.
No torch here: a layout is known and checked before any process group exists.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from recipes.models.hybrid import pattern as hybrid

# Megatron Core's default rank order, fastest-varying axis first.
RANK_ORDER = ("tp", "cp", "ep", "dp", "pp")

GroupKind = Literal[
    "tp", "pp", "dp", "cp", "dp-cp", "tp-pp", "ep", "expert-tp", "expert-dp", "embedding"
]
GROUP_KINDS: tuple[GroupKind, ...] = (
    "tp", "pp", "dp", "cp", "dp-cp", "tp-pp", "ep", "expert-tp", "expert-dp", "embedding",
)

# Group kinds of the dense grid (TP x CP x DP x PP) and of the expert grid, by the axes they span.
_DENSE_GROUPS: dict[str, tuple[str, ...]] = {
    "tp": ("tp",), "pp": ("pp",), "dp": ("dp",), "cp": ("cp",), "dp-cp": ("cp", "dp"),
    "tp-pp": ("tp", "pp"),
}
_EXPERT_GROUPS: dict[str, tuple[str, ...]] = {
    "ep": ("ep",), "expert-tp": ("tp",), "expert-dp": ("dp",),
}


def _orthogonal_groups(sizes: dict[str, int], axes: tuple[str, ...]) -> list[list[int]]:
    """Groups spanning `axes` of a grid whose axes are `sizes` in rank order (first fastest).

    A rank is sum(index[a] * stride[a]); a group fixes every other axis and runs over `axes`.
    Groups come in the order of the other axes' combined index, members in the order of theirs,
    which is the order Megatron Core lists them in.
    """
    strides, stride = {}, 1
    for name, size in sizes.items():
        strides[name] = stride
        stride *= size

    def offsets(members: list[str]) -> list[int]:
        result = [0]
        for name in members:  # earlier members vary fastest
            result = [r + i * strides[name] for i in range(sizes[name]) for r in result]
        return result

    inside = [name for name in sizes if name in axes]
    outside = [name for name in sizes if name not in axes]
    return [[base + offset for offset in offsets(inside)] for base in offsets(outside)]


@dataclass(frozen=True)
class RankCoordinates:
    """Where one rank sits on the dense grid, and its expert-parallel rank."""

    rank: int
    tp: int
    cp: int
    dp: int
    pp: int
    ep: int

    def shard_key(self) -> tuple[int, int, int]:
        """Ranks with equal (PP, TP, EP) coordinates hold the same model shard."""
        return (self.pp, self.tp, self.ep)


@dataclass(frozen=True, kw_only=True)
class Layout:
    """Parallel degrees of a run on `nodes x gpus_per_node` ranks, and the model and batch
    quantities they split. Build it with `Layout.from_config(cfg)`; validation guarantees the
    divisions below are exact before anything else uses them."""

    nodes: int
    gpus_per_node: int
    tensor: int = 1
    pipeline: int = 1
    virtual_pipeline: int | None = None
    context: int = 1
    expert: int = 1
    expert_tensor: int | None = None  # None = same as tensor
    sequence_parallel: bool = False
    num_layers: int = 1
    first_stage_layers: int | None = None  # uneven pipeline: layers on the first stage
    last_stage_layers: int | None = None  # ... and on the last; the middle share the rest
    hybrid_layer_pattern: str | None = None  # a hybrid model's layers (and '|' stage cuts)
    vocab_size: int = 1
    vocab_multiple: int = 128  # Megatron's make_vocab_size_divisible_by (before x TP)
    global_batch: int = 1
    micro_batch: int = 1

    @classmethod
    def from_config(cls, cfg: Any) -> Layout:
        """The layout of a `RunConfig` (typed as Any: the schema imports this module)."""
        p, m, t = cfg.parallel, cfg.model, cfg.train
        return cls(
            nodes=cfg.cluster.nodes, gpus_per_node=cfg.cluster.gpus_per_node,
            tensor=p.tensor, pipeline=p.pipeline, virtual_pipeline=p.virtual_pipeline,
            context=p.context, expert=p.expert, expert_tensor=p.expert_tensor,
            sequence_parallel=p.sequence_parallel, num_layers=m.num_layers,
            first_stage_layers=p.first_stage_layers, last_stage_layers=p.last_stage_layers,
            hybrid_layer_pattern=m.hybrid_layer_pattern, vocab_size=m.vocab_size,
            vocab_multiple=m.make_vocab_size_divisible_by,
            global_batch=t.global_batch_size, micro_batch=t.micro_batch_size,
        )

    # --- derived sizes --------------------------------------------------------------------------

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def model_parallel(self) -> int:
        """Ranks one dense model replica spans: TP x PP x CP."""
        return self.tensor * self.pipeline * self.context

    @property
    def data_parallel(self) -> int:
        """Dense replicas: world / (TP x PP x CP)."""
        return self.world_size // self.model_parallel

    @property
    def expert_tensor_size(self) -> int:
        return self.tensor if self.expert_tensor is None else self.expert_tensor

    @property
    def expert_model_parallel(self) -> int:
        """Ranks one expert replica spans: PP x expert-TP x EP."""
        return self.pipeline * self.expert_tensor_size * self.expert

    @property
    def expert_data_parallel(self) -> int:
        """Replicas of each expert: world / (PP x expert-TP x EP)."""
        return self.world_size // self.expert_model_parallel

    @property
    def virtual_stages(self) -> int:
        return self.virtual_pipeline or 1

    @property
    def model_chunks(self) -> int:
        """Pieces the layer stack is cut into: PP x virtual stages."""
        return self.pipeline * self.virtual_stages

    @property
    def layers_per_stage(self) -> int:
        return self.num_layers // self.pipeline

    def stage_layers(self) -> list[int]:
        """Transformer layers on each pipeline stage, as Megatron assigns them: the first and
        last stage's own counts when set, the rest split evenly over the middle stages."""
        if hybrid.has_pipes(self.hybrid_layer_pattern):
            return [sum(len(chunk) for chunk in stage) for stage in self.chunk_patterns()]
        return hybrid.stage_counts(self.num_layers, self.pipeline, self.first_stage_layers,
                                   self.last_stage_layers)

    def chunk_layers(self) -> list[list[int]]:
        """Layers of every model chunk, [pipeline stage][virtual stage]: a hybrid model's as
        its segments say, else each stage's layers split evenly over its virtual stages."""
        if self.hybrid_layer_pattern is not None:
            return [[len(chunk) for chunk in stage] for stage in self.chunk_patterns()]
        vpp = self.virtual_stages
        return [[count // vpp] * vpp for count in self.stage_layers()]

    def chunk_patterns(self) -> list[list[str]]:
        """A hybrid model's layer symbols of every model chunk, [pipeline stage][virtual
        stage], as Megatron's `select_pipeline_segment` hands them out."""
        if self.hybrid_layer_pattern is None:
            raise ValueError("chunk_patterns needs a hybrid model (model.hybrid_layer_pattern)")
        return hybrid.chunk_patterns(self.hybrid_layer_pattern, self.pipeline,
                                     self.virtual_pipeline, self.first_stage_layers,
                                     self.last_stage_layers)

    @property
    def mtp_depths(self) -> int:
        """A hybrid model's multi-token-prediction depths (its pattern's parts after '/')."""
        return hybrid.mtp_depths(self.hybrid_layer_pattern)

    def mtp_chunk(self) -> tuple[int, int] | None:
        """(pipeline stage, virtual stage) of the model chunk holding the MTP depths: the last
        stage's last virtual stage, where Megatron builds them (`models/hybrid/hybrid_model.py:
        217-229`); None without MTP."""
        return (self.pipeline - 1, self.virtual_stages - 1) if self.mtp_depths else None

    @property
    def layers_per_chunk(self) -> int:
        """Transformer layers in one model chunk (a stage, or a virtual stage)."""
        return self.num_layers // self.model_chunks

    @property
    def samples_per_replica(self) -> int:
        """Samples each DP replica takes of one global batch."""
        return self.global_batch // self.data_parallel

    @property
    def microbatches(self) -> int:
        """Micro-batches per optimizer step on each DP replica (gradient accumulation)."""
        return self.global_batch // (self.micro_batch * self.data_parallel)

    @property
    def vocab_padding_unit(self) -> int:
        return self.vocab_multiple * self.tensor

    @property
    def padded_vocab(self) -> int:
        """Vocabulary padded as Megatron pads it: to a multiple of make_vocab_size_divisible_by
        x TP."""
        unit = self.vocab_padding_unit
        return math.ceil(self.vocab_size / unit) * unit

    # --- groups and placement -------------------------------------------------------------------

    def _dense_grid(self) -> dict[str, int]:
        sizes = {"tp": self.tensor, "cp": self.context, "ep": 1, "dp": self.data_parallel,
                 "pp": self.pipeline}
        return {axis: sizes[axis] for axis in RANK_ORDER}

    def _expert_grid(self) -> dict[str, int]:
        sizes = {"tp": self.expert_tensor_size, "cp": 1, "ep": self.expert,
                 "dp": self.expert_data_parallel, "pp": self.pipeline}
        return {axis: sizes[axis] for axis in RANK_ORDER}

    def groups(self, kind: GroupKind) -> list[list[int]]:
        """Every group of one kind, as global ranks, in Megatron Core's order.

        'embedding' groups join the first and last rank of each pipeline group (where the input
        embedding and the output layer live; one rank without pipelining).
        """
        if kind in _DENSE_GROUPS:
            return _orthogonal_groups(self._dense_grid(), _DENSE_GROUPS[kind])
        if kind in _EXPERT_GROUPS:
            return _orthogonal_groups(self._expert_grid(), _EXPERT_GROUPS[kind])
        if kind == "embedding":
            pipelines = self.groups("pp")
            return [[g[0], g[-1]] if len(g) > 1 else [g[0]] for g in pipelines]
        raise ValueError(f"unknown group kind {kind!r}; known: {', '.join(GROUP_KINDS)}")

    def hierarchical_context_groups(self, sizes: list[int]) -> list[list[list[int]]]:
        """For hierarchical CP (`a2a+p2p`, level sizes multiplying to CP): each level's groups,
        cut from every CP group as Megatron Core's `create_hierarchical_groups` cuts it
        (`parallel_state.py:378-414`): level l joins ranks `prod(sizes[:l])` apart, in runs of
        `sizes[l]`; level 0 holds neighbouring CP ranks (the fast links)."""
        if math.prod(sizes) != self.context:
            raise ValueError(f"hierarchical sizes {sizes} do not multiply to CP {self.context}")
        levels: list[list[list[int]]] = [[] for _ in sizes]
        for ranks in self.groups("cp"):
            for level, size in enumerate(sizes):
                inner = math.prod(sizes[:level])
                outer = self.context // (inner * size)
                for block in range(outer):
                    base = block * inner * size
                    for offset in range(inner):
                        levels[level].append([ranks[base + offset + k * inner]
                                              for k in range(size)])
        return levels

    def group_of(self, kind: GroupKind, rank: int) -> list[int] | None:
        """The group of `kind` that holds `rank` (None: a middle stage has no embedding group)."""
        return next((group for group in self.groups(kind) if rank in group), None)

    def coordinates(self, rank: int) -> RankCoordinates:
        """Dense-grid coordinates of `rank`, and its rank within its expert-parallel group."""
        index, dense = rank, {}
        for axis, size in self._dense_grid().items():
            index, dense[axis] = divmod(index, size)
        stride = self.expert_tensor_size  # EP follows expert-TP in the expert grid
        ep = (rank // stride) % self.expert
        return RankCoordinates(rank=rank, tp=dense["tp"], cp=dense["cp"], dp=dense["dp"],
                               pp=dense["pp"], ep=ep)

    def node_gpu(self, rank: int) -> tuple[int, int]:
        """(node, local GPU) of a rank: ranks fill node 0's GPUs first, then node 1's, ..."""
        return divmod(rank, self.gpus_per_node)

    def place(self, rank: int) -> str:
        node, gpu = self.node_gpu(rank)
        return f"N{node}:G{gpu}"

    def placement(self, ranks: list[int]) -> str:
        """Compact 'N0:G0-G7 N1:G0-G7' for a set of ranks (a group, a stage)."""
        by_node: dict[int, list[int]] = {}
        for rank in sorted(ranks):
            node, gpu = self.node_gpu(rank)
            by_node.setdefault(node, []).append(gpu)
        parts = []
        for node, gpus in by_node.items():
            contiguous = gpus == list(range(gpus[0], gpus[-1] + 1))
            span = f"G{gpus[0]}" if len(gpus) == 1 else f"G{gpus[0]}-G{gpus[-1]}"
            parts.append(f"N{node}:" + (span if contiguous else ",".join(f"G{g}" for g in gpus)))
        return " ".join(parts)

    def any_group_crosses_nodes(self, kind: GroupKind) -> bool:
        """Whether any group of `kind` has ranks on more than one node, without listing every
        group of a 16,384-rank world: an axis whose stride is a whole number of nodes moves a
        group by whole nodes, so an axis outside the group needs only the values of one period
        (gpus_per_node / gcd(stride, gpus_per_node); one value when the stride is whole nodes),
        and an axis inside it whose members lie a node or more apart crosses by itself. What is
        left is a grid of a few nodes."""
        if kind not in _DENSE_GROUPS and kind not in _EXPERT_GROUPS:
            return any(self.crosses_nodes(g) for g in self.groups(kind))
        dense = kind in _DENSE_GROUPS
        grid = self._dense_grid() if dense else self._expert_grid()
        axes = (_DENSE_GROUPS if dense else _EXPERT_GROUPS)[kind]
        gpn = self.gpus_per_node
        inside, outside, stride = [0], [0], 1  # rank offsets: members of a group; group starts
        for name, size in grid.items():
            if name in axes and stride * (size - 1) >= gpn:
                return True
            values = size if name in axes else min(size, gpn // math.gcd(stride, gpn))
            steps = [i * stride for i in range(values)]
            if name in axes:
                inside = [r + step for step in steps for r in inside]
            else:
                outside = [r + step for step in steps for r in outside]
            stride *= size
        return any(self.crosses_nodes([base + r for r in inside]) for base in outside)

    def crosses_nodes(self, group: list[int]) -> bool:
        """Whether a group's ranks sit on more than one node (its traffic leaves the node)."""
        return len({self.node_gpu(rank)[0] for rank in group}) > 1

    def describe(self, *, show_sequence_parallel: bool = False) -> str:
        """'TP8 x PP4 x DP2', with virtual stages, CP and EP when used (and '+SP' if asked)."""
        vpp = f" (VPP{self.virtual_pipeline})" if self.virtual_pipeline else ""
        sp = "+SP" if show_sequence_parallel and self.sequence_parallel else ""
        parts = [f"TP{self.tensor}{sp}", f"PP{self.pipeline}{vpp}"]
        if self.context > 1:
            parts.append(f"CP{self.context}")
        parts.append(f"DP{self.data_parallel}")
        return " x ".join(parts) + (f", EP{self.expert}" if self.expert > 1 else "")
