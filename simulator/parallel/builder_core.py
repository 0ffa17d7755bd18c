"""What the ProgramBuilder's mixins (overlap.py, block_passes.py) use of the builder: its plan, whether it
folds, the op emitters and the bookkeeping it shares with them. The mixins subclass this Protocol, so the type
checker knows those members and checks that ProgramBuilder provides each of them with a matching signature."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from simulator.collectives.names import AlgorithmChoice, Primitive, ProtocolChoice
from simulator.parallel.passes import Pass
from simulator.parallel.work import Block
from simulator.program.ops import COMPUTE_STREAM, Category

if TYPE_CHECKING:
    from simulator.parallel.program import StepPlan


class BuilderCore(Protocol):
    """The builder core: ``plan`` and ``fold``; ``_mirror_cache`` holds the folded replicas' copies of a group;
    ``_grad_ready`` maps (rank, virtual stage, id(block)) to the op that finished the block's gradients;
    ``_param_gathers`` the same key to its deferred parameter gathers."""

    plan: StepPlan
    fold: bool
    images: bool
    _mirror_cache: dict[tuple, tuple[tuple[int, ...], ...]]
    _grad_ready: dict[tuple[int, int, int], int]
    _param_gathers: dict[tuple[int, int, int], list[int]]

    def _compute(self, rank: int, name: str, duration: float, deps: list[int], category: Category,
                 flops: float = 0.0, stream: str = COMPUTE_STREAM, mb: int = -1, sm_bound_share: float = 1.0,
                 reserved_sms: int = 0, hbm_bytes: float = 0.0) -> int:
        """Append a compute op (``sm_bound_share``: of its time, what SMs rather than HBM limit;
        ``reserved_sms``: launched without them; ``hbm_bytes``: the HBM traffic it is costed by); returns its id."""
        ...

    def _collective(self, rank: int, stream: str, name: str, op: Primitive, group: tuple[int, ...],
                    nbytes: float, key: str, deps: list[int], category: Category, mb: int = -1,
                    algorithm: AlgorithmChoice = "auto",
                    mirrors: tuple[tuple[int, ...], ...] | None = None,
                    pair_bytes: tuple[tuple[float, ...], ...] = (), sms: int | None = None,
                    protocol: ProtocolChoice = "auto") -> int:
        """Append one rank's part of a collective (mirrors of the folded replicas by default; ``pair_bytes``
        for an uneven all-to-all; ``sms`` the SMs its kernel holds, None: NCCL's channels; ``protocol`` the one
        it runs under, `auto`: the run's default); returns its id."""
        ...

    def _tp_collective(self, rank: int, block: Block, phase: Pass, deps: list[int], mb: int, vstage: int,
                       before: bool) -> list[int]:
        """The blocking TP collective on one side of a block pass; returns what the next op waits for."""
        ...

    def _pass(self, rank: int, block: Block, phase: Pass, name: str, duration: float, flops: float, deps: list[int],
              category: Category, mb: int, vstage: int, sm_bound_s: float, hbm_bytes: float) -> int:
        """The compute of one block pass, ``sm_bound_s`` of its seconds SM-bound, moving ``hbm_bytes`` of HBM
        (block_passes.py); returns its last op."""
        ...

    def _mirrors(self, group: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
        """The folded replicas' copies of ``group`` (folding.mirror_images), cached."""
        ...

    def _dp_size(self) -> int:
        """Ranks that hold replicas of the same parameters (DP x CP)."""
        ...

    def _dp_group(self, rank: int) -> tuple[int, ...]:
        """The DP x CP group of ``rank``."""
        ...
