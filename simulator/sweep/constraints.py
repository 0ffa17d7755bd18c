"""Sweep constraints: boolean expressions over scenario fields (`parallelism.tp * parallelism.pp <= 8`) that a
point must satisfy to be simulated. Parsed once with `ast` and evaluated by a small interpreter that allows only
arithmetic, comparisons, `and`/`or`/`not` and field paths, so a sweep file cannot run arbitrary code."""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import BaseModel

from simulator.config.field_paths import path_problem
from simulator.config.schema import Scenario
from simulator.config.yaml_source import parse_field
from simulator.errors import ScenarioError
from simulator.sweep.fields import value_at

_BINARY: dict[type, Callable] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}
_UNARY: dict[type, Callable] = {ast.Not: operator.not_, ast.USub: operator.neg, ast.UAdd: operator.pos}
_COMPARE: dict[type, Callable] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt,
    ast.GtE: operator.ge, ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b,
}
ALLOWED = "field paths, numbers, strings, + - * / // % **, comparisons, and/or/not, lists"
EVALUABLE = ("a constraint every point can evaluate: fields the point has, numbers within floats and powers of up "
             "to 4,096 bits, texts and lists only joined with +")
"""What a constraint that fails at a point (a field the point lacks, an overflow, a type mismatch) should be."""

DERIVED = {
    ("parallelism", "dp"): ("the cluster's GPUs / (tp x cp x pp)", "write parallelism.dp, or constrain the fields "
                            "it is derived from (cluster.nodes, parallelism.tp, ...)"),
    ("training", "microbatches"): ("training.global_batch / (micro_batch x dp)", "write training.microbatches, or "
                                   "constrain the fields it is derived from (training.global_batch, ...)"),
}
"""Fields a step derives where the scenario leaves them out (null), with how and what to constrain instead: a
constraint sees them as the step derives them (`with_derived`), or is refused at a point that cannot say."""
PS_DP = ("the GPUs of the hosts that do not serve (parameter servers: the cluster's hosts less ps.servers)",
         "constrain the fields it is derived from (cluster.nodes, ps.servers, ...)")
"""How a parameter-server run derives `parallelism.dp` (its workers), in place of `DERIVED`'s, and what to
constrain instead."""


def with_derived(scenario: Scenario, gpus: int | None, host_gpus: tuple[int, ...] | None = None) -> Scenario:
    """``scenario`` with the `DERIVED` fields it leaves out filled in by the functions its run derives them with
    (`resolve_layout`, `microbatch_count`), from the cluster's ``gpus`` (None: not known before the cluster is
    built) and, for parameter servers, the GPUs of each of its hosts ``host_gpus`` (their workers are the GPUs of the
    hosts that do not serve, and dp is their count as the run reports it); a field the run would refuse (a layout
    that does not divide the GPUs, a batch that does not divide, more micro-batches than the run allows, servers
    that leave no worker) stays null. A pp the model's stages refuse raises the run's error (`pipeline_depth`)."""
    from simulator.parameter_server.placement import worker_gpus
    from simulator.workload.training import microbatch_count, pipeline_depth, resolve_layout

    par, training = scenario.parallelism, scenario.training
    if scenario.model is None:
        return scenario
    dp, depth, ps = par.dp, pipeline_depth(scenario), scenario.ps
    if dp is None and gpus is not None:
        if ps is not None:
            dp = _derived(lambda: worker_gpus(ps, host_gpus)) if host_gpus is not None else None
        else:
            dp = _derived(lambda: resolve_layout(scenario, gpus, depth).dp)
    microbatches = training.microbatches
    if microbatches is None and dp is not None:
        microbatches = _derived(lambda: microbatch_count(scenario, dp))
    return scenario.model_copy(update={"parallelism": par.model_copy(update={"dp": dp}),
                                       "training": training.model_copy(update={"microbatches": microbatches})})


def _derived(derive: Callable[[], int]) -> int | None:
    """What ``derive`` gives, or None where the run refuses the point."""
    try:
        return derive()
    except ScenarioError:
        return None


@dataclass(frozen=True)
class Constraint:
    """One constraint: its text (reported as the reason a point was skipped) and its parsed expression."""

    text: str
    tree: ast.Expression

    def holds(self, scenario: BaseModel) -> bool:
        """Whether ``scenario`` satisfies the constraint."""
        return bool(_evaluate(self.tree.body, scenario))


def parse_constraint(text: str) -> Constraint:
    """Parse and check a constraint; every field path it names must exist in the scenario schema."""
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise ScenarioError(f"constraint {text!r} is not an expression ({exc.msg})", allowed=ALLOWED) from None
    for node in ast.walk(tree):
        if isinstance(node, (ast.Attribute, ast.Name)):
            path = _path_of(node)
            if path is None:
                raise ScenarioError(f"constraint {text!r}: {ast.unparse(node)} is not a field path", allowed=ALLOWED)
            problem = path_problem(parse_field(path))
            if problem is not None:
                raise ScenarioError(f"constraint {text!r}: {path}: {problem.problem}",
                                    allowed=problem.allowed or ALLOWED)
        elif not isinstance(node, _NODES):
            raise ScenarioError(f"constraint {text!r} uses {type(node).__name__}", allowed=ALLOWED)
    return Constraint(text, tree)


_NODES = (ast.Expression, ast.BoolOp, ast.BinOp, ast.UnaryOp, ast.Compare, ast.Constant, ast.List, ast.Tuple,
          ast.Load, ast.And, ast.Or, *_UNARY, *_BINARY, *_COMPARE)


def _path_of(node: ast.AST) -> str | None:
    """``a.b.c`` written as nested attributes, or None when the chain does not end in a plain name."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def _evaluate(node: ast.AST, scenario: BaseModel) -> object:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, (ast.Attribute, ast.Name)):
        path = parse_field(_path_of(node) or "")
        value = value_at(scenario, path)
        if value is None and tuple(path) in DERIVED:
            key = tuple(path)
            serving = key == ("parallelism", "dp") and getattr(scenario, "ps", None) is not None
            how, instead = PS_DP if serving else DERIVED[key]
            raise ScenarioError(f"{_path_of(node)} is left out, to be derived from {how}, which this point's "
                                "values do not give", allowed=instead)
        return value
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_evaluate(item, scenario) for item in node.elts]
    if isinstance(node, ast.BoolOp):
        values = (_evaluate(item, scenario) for item in node.values)
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.UnaryOp):
        return _UNARY[type(node.op)](_evaluate(node.operand, scenario))
    if isinstance(node, ast.BinOp):
        return _arithmetic(node, _evaluate(node.left, scenario), _evaluate(node.right, scenario))
    if isinstance(node, ast.Compare):
        left = _evaluate(node.left, scenario)
        for op, right_node in zip(node.ops, node.comparators):
            right = _evaluate(right_node, scenario)
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True
    raise ScenarioError(f"cannot evaluate {ast.unparse(node)}", allowed=ALLOWED)


MAX_POWER_BITS = 4096
"""The largest whole-number power a constraint may compute, in bits, bounded from below as floor(log2 |base|) x
exponent: 2 ** 4096 passes, 2 ** 4097 does not, and a power of another base may reach about twice the bits
(3 ** 4096 has 6,492), still microseconds of work."""


def _arithmetic(node: ast.BinOp, left: object, right: object) -> object:
    """``left op right``, bounded: texts and lists only join (``+``), since a repeated or formatted one
    (``'a' * 10**11``, ``'%999999999s' % 1``) and a power beyond 4,096 bits (``9 ** 9 ** 9``) would take the
    machine's memory or hours; a float overflow becomes a ValueError, so each is one line at the constraint
    instead of a hang or a traceback."""
    if not isinstance(node.op, ast.Add) and (isinstance(left, (str, list)) or isinstance(right, (str, list))):
        raise ValueError(f"{ast.unparse(node)}: texts and lists only join with +")
    if (isinstance(node.op, ast.Pow) and isinstance(left, int) and isinstance(right, int) and right > 0
            and abs(left) > 1 and right * (abs(left).bit_length() - 1) > MAX_POWER_BITS):
        raise ValueError(f"{ast.unparse(node)} is beyond {MAX_POWER_BITS}-bit numbers")
    try:
        return _BINARY[type(node.op)](left, right)
    except OverflowError:
        raise ValueError(f"{ast.unparse(node)} overflows a float") from None
