"""Random torch programs through ``hyper_ac.backend`` in every mode (issue 14).

A seeded generator writes small programs as Python source: pointwise ops,
matmuls, reductions, views, chunk/cat, multi-output ops, dropout and in-place
writes through views. Half of them stack one block in an ``nn.ModuleList`` of
identical blocks (so the core finds units); the other half are one flat module
(no units). Each program is compiled with ``hyper_ac.backend`` in every mode;
the loss and every gradient must be ``torch.equal`` to the same program
compiled with ``ac_mode: off`` (same pipeline, nothing checkpointed) under the
same seed.

Size per run: ``HYPER_AC_RANDOM_PROGRAMS`` programs (default 24, seeds
0..N-1; ``HYPER_AC_RANDOM_SEED0`` shifts the range). A failing seed prints the
program it generated and a shrunk program that still fails, as source.
Reproduce one seed with ``HYPER_AC_RANDOM_SEED0=S HYPER_AC_RANDOM_PROGRAMS=1``.
"""

from __future__ import annotations

import copy
import os
import random
import warnings
from dataclasses import dataclass, field

import pytest
import torch
import torch.nn.functional as F  # noqa: F401  (used by the generated source)
from torch import nn

import hyper_ac

D = 8  # feature width of every value the generator makes (shape (B, D))
H = D // 2
B = 4
N_PROGRAMS = int(os.environ.get("HYPER_AC_RANDOM_PROGRAMS", "24"))
SEED0 = int(os.environ.get("HYPER_AC_RANDOM_SEED0", "0"))
MODES = ["full", "selective", "auto", "budget"]

# Each template makes `{o}` (shape (B, D)) from `{a}` and `{b}` (shape (B, D)).
# `{p}` names a parameter the op owns: "linear" → nn.Linear(D, D), "matrix" →
# a (D, D) nn.Parameter. Statements are joined with "; " on one line.
OPS: list[tuple[str, str, str | None]] = [
    # pointwise
    ("tanh", "{o} = torch.tanh({a})", None),
    ("relu", "{o} = torch.relu({a})", None),
    ("silu", "{o} = torch.sigmoid({a}) * {a}", None),
    ("gelu", "{o} = F.gelu({a})", None),
    ("sin", "{o} = torch.sin({a})", None),
    ("square", "{o} = {a} * {a}", None),
    ("add", "{o} = {a} + {b}", None),
    ("mul", "{o} = {a} * {b}", None),
    ("axpy", "{o} = {a} - 0.5 * {b}", None),
    # matmuls
    ("linear", "{o} = self.{p}({a})", "linear"),
    ("matmul", "{o} = {a} @ self.{p}", "matrix"),
    ("bmm", "{o} = torch.bmm({a}.view(-1, 2, {H}), {b}.view(-1, 2, {H}).transpose(1, 2)).reshape(-1, 4).repeat(1, {D} // 4)", None),
    # reductions
    ("center", "{o} = {a} - {a}.mean(-1, keepdim=True)", None),
    ("rowsum", "{o} = {a} * {b}.sum(-1, keepdim=True)", None),
    ("softmax", "{o} = torch.softmax({a}, -1)", None),
    ("normalize", "{o} = {a} / ({a}.norm(dim=-1, keepdim=True) + 1)", None),
    ("logsumexp", "{o} = {a}.logsumexp(-1, keepdim=True) + {b}", None),
    # views
    ("transpose", "{o} = {a}.view(-1, 2, {H}).transpose(1, 2).reshape(-1, {D})", None),
    ("tt", "{o} = {a}.t().contiguous().t() * 2", None),
    ("expand", "{o} = {a}.unsqueeze(1).expand(-1, 2, -1).sum(1)", None),
    ("swap", "{o} = torch.cat([{a}[:, {H}:], {a}[:, :{H}]], -1)", None),
    # chunk / cat / split
    ("chunk", "{o}_0, {o}_1 = {a}.chunk(2, -1); {o} = torch.cat([{o}_1 * {b}[:, :{H}], {o}_0], -1)", None),
    ("split", "{o}_0, {o}_1 = torch.split({a}, [3, {D} - 3], -1); {o} = torch.cat([torch.tanh({o}_1), {o}_0], -1)", None),
    ("stack", "{o} = torch.stack([{a}, {b}], 0).amax(0)", None),
    # multi-output ops
    ("var_mean", "{o}_v, {o}_m = torch.var_mean({a}, -1, keepdim=True); {o} = ({a} - {o}_m) * torch.rsqrt({o}_v + 1e-5)", None),
    ("max", "{o}_x, {o}_i = {a}.max(-1, keepdim=True); {o} = {a} - {o}_x + {o}_i.to({a}.dtype)", None),
    ("layer_norm", "{o} = F.layer_norm({a}, ({D},))", None),
    ("sort", "{o}_s, {o}_i = torch.sort({a}, -1); {o} = {o}_s * {b}", None),
    ("topk", "{o}_t, _ = torch.topk({a}, 2, -1); {o} = {b} * {o}_t.sum(-1, keepdim=True)", None),
    # dropout
    ("dropout", "{o} = F.dropout({a}, 0.3, self.training)", None),
    # in-place writes through views
    ("slice_mul_", "{o} = {a}.clone(); {o}[:, :{H}].mul_(2)", None),
    ("view_add_", "{o} = {a} * 1; {o}.view(-1, 2, {H})[:, 0].add_({b}[:, :{H}])", None),
    ("narrow_relu_", "{o} = {a} + 0; {o}.narrow(-1, 1, 2).relu_()", None),
    ("column_copy_", "{o} = {a}.clone(); {o}.t()[0].copy_({b}[:, 0])", None),
]
OP_BY_NAME = {name: (name, text, param) for name, text, param in OPS}


@dataclass
class Op:
    name: str
    out: int  # index of the value it makes (0 is the block input x)
    a: int
    b: int


@dataclass
class Program:
    seed: int
    units: bool  # True: nn.ModuleList of identical blocks; False: one flat module
    layers: int
    ops: list[Op] = field(default_factory=list)

    def source(self) -> str:
        """The program as Python source (exec'd to build it; printed when it fails)."""
        params, body = [], []
        var = {0: "x"}
        for k, op in enumerate(self.ops):
            _, text, kind = OP_BY_NAME[op.name]
            p = f"p{k}"
            if kind == "linear":
                params.append(f"self.{p} = nn.Linear({D}, {D})")
            elif kind == "matrix":
                params.append(f"self.{p} = nn.Parameter(torch.randn({D}, {D}) / {D} ** 0.5)")
            o = f"v{op.out}"
            body.append(text.format(o=o, a=var[op.a], b=var[op.b], p=p, D=D, H=H))
            var[op.out] = o
        result = var[self.ops[-1].out] if self.ops else "x"
        init = "".join(f"        {line}\n" for line in params) or ("" if not self.units else "        pass\n")
        lines = "".join(f"        {line}\n" for line in body)
        if self.units:
            return (
                f"# seed {self.seed}: {self.layers} identical blocks in an nn.ModuleList\n"
                "class Block(nn.Module):\n"
                "    def __init__(self):\n        super().__init__()\n" + init +
                "    def forward(self, x):\n" + lines + f"        return {result} + x\n\n"
                "class Model(nn.Module):\n"
                "    def __init__(self):\n        super().__init__()\n"
                f"        self.w_in = nn.Parameter(torch.randn({D}, {D}) / {D} ** 0.5)\n"
                f"        self.layers = nn.ModuleList([Block() for _ in range({self.layers})])\n"
                "    def forward(self, x):\n"
                "        x = x @ self.w_in\n"
                "        for layer in self.layers:\n            x = layer(x)\n"
                "        return x.pow(2).mean()\n"
            )
        return (
            f"# seed {self.seed}: one flat module (no units)\n"
            "class Model(nn.Module):\n"
            "    def __init__(self):\n        super().__init__()\n"
            f"        self.w_in = nn.Parameter(torch.randn({D}, {D}) / {D} ** 0.5)\n" + init +
            "    def forward(self, x):\n        x = x @ self.w_in\n" + lines + f"        return ({result} + x).pow(2).mean()\n"
        )

    def without(self, k: int) -> "Program":
        """The program with op k removed: its readers read its first input instead."""
        gone = self.ops[k]
        ops = []
        for op in self.ops[:k] + self.ops[k + 1:]:
            ops.append(Op(op.name, op.out, gone.a if op.a == gone.out else op.a, gone.a if op.b == gone.out else op.b))
        return Program(self.seed, self.units, self.layers, ops)

    def build(self) -> nn.Module:
        namespace = {"torch": torch, "nn": nn, "F": torch.nn.functional}
        exec(compile(self.source(), f"<random program {self.seed}>", "exec"), namespace)
        torch.manual_seed(self.seed)
        return namespace["Model"]()


def generate(seed: int) -> Program:
    rng = random.Random(seed)
    program = Program(seed, units=seed % 2 == 0, layers=rng.randint(2, 3))
    for k in range(rng.randint(3, 9)):
        out = k + 1
        # Mostly read recent values, sometimes the block input (long-lived values).
        a = rng.choice([out - 1, out - 1, rng.randrange(out)])
        b = rng.randrange(out)
        program.ops.append(Op(rng.choice(OPS)[0], out, a, b))
    return program


def _config(mode: str) -> dict:
    if mode == "budget":
        return {"ac_mode": "budget", "ac_memory_budget": 0.5}
    return {"ac_mode": mode}


def _run(program: Program, model: nn.Module, mode: str):
    """(loss, grads, warnings) of one training step compiled in `mode` (seeded)."""
    model = copy.deepcopy(model)
    x = torch.randn(B, D, generator=torch.Generator().manual_seed(program.seed))
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=hyper_ac.backend(_config(mode)), fullgraph=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.manual_seed(program.seed + 1)  # dropout draws from here
        loss = compiled(x)
        loss.backward()
    torch._dynamo.reset()
    grads = {n: p.grad for n, p in model.named_parameters()}
    return loss.detach(), grads, [str(w.message) for w in caught]


NO_CHECKPOINT_WARNING = "left without activation checkpointing"
# Modes in which a unit-less program (no repeated blocks, no model facts) is
# left uncheckpointed with NO_CHECKPOINT_WARNING today (seed 1 showed `full`
# does it too). When issue 11 lands (unit-less graphs planned as one region),
# shrink this set: the test then demands no warning in those modes.
UNITLESS_FALLBACK_MODES = ("full", "selective")


def check(program: Program, modes=MODES) -> str | None:
    """None if every mode matches `off` bit for bit, else what differs."""
    model = program.build()
    ref_loss, ref_grads, _ = _run(program, model, "off")
    for mode in modes:
        try:
            loss, grads, caught = _run(program, model, mode)
        except Exception as exc:  # noqa: BLE001 - any failure is a finding; the message says which
            return f"mode {mode}: {type(exc).__name__}: {exc}"
        if not torch.equal(loss, ref_loss):
            return f"mode {mode}: loss {loss.item()!r} != {ref_loss.item()!r}"
        for name, ref in ref_grads.items():
            got = grads.get(name)
            if (ref is None) != (got is None) or (ref is not None and not torch.equal(ref, got)):
                return f"mode {mode}: gradient of {name} differs"
        # Today's contract for unit-less graphs (UNITLESS_FALLBACK_MODES; issue 11
        # changes it): scope discovery raises NoUnitsError in every mode, and
        # hyper_ac.backend turns it into this warning and an uncheckpointed step.
        unitless_fallback = not program.units and mode in UNITLESS_FALLBACK_MODES
        warned = any(NO_CHECKPOINT_WARNING in w for w in caught)
        if unitless_fallback and not warned:
            return f"mode {mode}: unit-less program did not warn '{NO_CHECKPOINT_WARNING}' (contract changed? issue 11)"
        if not unitless_fallback and warned:
            return f"mode {mode}: unexpected warning: {[w for w in caught if NO_CHECKPOINT_WARNING in w]}"
    return None


def shrink(program: Program, failure: str) -> Program:
    """Drops ops one at a time while the program still fails the same mode."""
    mode = failure.split(":")[0].removeprefix("mode ")
    modes = [mode] if mode in MODES else MODES
    changed = True
    while changed and len(program.ops) > 1:
        changed = False
        for k in range(len(program.ops)):
            smaller = program.without(k)
            try:
                still = check(smaller, modes)
            except Exception:  # noqa: BLE001 - the reference itself broke: not the same failure
                still = None
            if still is not None:
                program, changed = smaller, True
                break
    return program


# Seeds whose failure is a known product bug (issue, reason): xfail(strict=True).
KNOWN: dict[int, str] = {}


def _params():
    for seed in range(SEED0, SEED0 + N_PROGRAMS):
        marks = [pytest.mark.xfail(strict=True, reason=KNOWN[seed])] if seed in KNOWN else []
        yield pytest.param(seed, id=f"seed{seed}", marks=marks)


def test_generator_is_deterministic_and_covers_every_op():
    assert generate(3).source() == generate(3).source()
    used = {op.name for seed in range(SEED0, SEED0 + max(N_PROGRAMS, 200)) for op in generate(seed).ops}
    assert used == set(OP_BY_NAME), f"ops never generated: {set(OP_BY_NAME) - used}"


def test_shrink_removes_ops_and_keeps_sources_valid():
    program = generate(5)
    smaller = program.without(0)
    assert len(smaller.ops) == len(program.ops) - 1
    smaller.build()  # the rewired source still runs


@pytest.mark.parametrize("seed", list(_params()))
def test_random_program_matches_uncheckpointed(seed):
    program = generate(seed)
    failure = check(program)
    if failure is not None:
        small = shrink(program, failure)
        pytest.fail(
            f"seed {seed}: {failure}\n--- program ---\n{program.source()}\n"
            f"--- shrunk ({len(small.ops)} ops; {check(small) or 'passes?'}) ---\n{small.source()}",
            pytrace=False,
        )
