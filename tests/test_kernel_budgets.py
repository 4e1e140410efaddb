"""bench/kernel_budgets.py reads ptxas -v and nvdisasm output and fails a kernel over its budget (issue #46):
its readers and its verdicts on small made-up outputs (compiling needs nvcc: CI's kernel-budget stage)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "kernel_budgets.py"

PTXAS = """ptxas info    : Compiling entry function '_Z6kernelPf' for 'sm_90'
ptxas info    : Function properties for _Z6kernelPf
    64 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 72 registers, used 0 barriers
"""

SASS = """\t.section\t.text._Z6kernelPf,"ax",@progbits
.text._Z6kernelPf:
\t//## File "/src/csrc/team_rows.h", line 10 inlined at "/src/csrc/cuda/k.cu", line 3
\t//## File "/src/csrc/cuda/k.cu", line 3
        /*0000*/                   LDC R1, c[0x0][0x28] ;
.L_x_1:
\t//## File "/src/csrc/team_rows.h", line 21
        /*0010*/                   LDL R2, [R1] ;
        /*0020*/                   FADD R2, R2, 1 ;
\t//## File "/src/csrc/top_tau_row.h", line 5 inlined at "/src/csrc/team_rows.h", line 22
        /*0030*/                   SHFL.BFLY PT, R3, R2, 0x1, 0x1f ;
        /*0040*/              @P0 BRA `(.L_x_1) ;
\t//## File "/src/csrc/team_rows.h", line 30
        /*0050*/                   STL [R1], R2 ;
        /*0060*/                   CALL.REL.NOINC `($__internal_div) ;
        /*0070*/                   EXIT ;
"""


@pytest.fixture
def budgets(monkeypatch):
    spec = importlib.util.spec_from_file_location("kernel_budgets", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "kernel_budgets", module)  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_ptxas_and_sass_are_read(budgets):
    assert budgets.ptxas_usage(PTXAS) == {
        "_Z6kernelPf": {"stack": 64, "spill_stores": 8, "spill_loads": 12, "registers": 72}
    }
    (name, instructions), *_ = budgets.sass_functions(SASS).items()
    assert name == "_Z6kernelPf" and len(instructions) == 8
    assert instructions[0].lines == {("team_rows.h", 10), ("k.cu", 3)}
    assert instructions[2].lines == {("team_rows.h", 21)}  # no comment: the location of the one before
    # the loop of lines 20-23 of team_rows.h: its own instructions and the call inlined at line 22
    measured = budgets.measure_sass(instructions, {"loop": {("team_rows.h", n) for n in range(20, 24)}})
    assert measured == {"local": 2, "calls": 1, "instructions": 8, "loops": {"loop": 4}}


def test_a_marked_loop_spans_its_block(budgets):
    cpp = ["x;", "while (a) {  // sass-loop: l", "  if (b) {", "    c;", "  }", "}", "d;"]
    assert budgets.marked_range(cpp, 2) == 6
    python = ["    while running:  # sass-loop: l", "        a = 1", "", "        b = 2", "    c = 3"]
    assert budgets.marked_range(python, 1) == 4


def test_the_tree_marks_its_hot_loops(budgets):
    assert set(budgets.markers()) == {
        "top_tau_search",
        "sparsemax_michelot",
        "triton_top_tau_search",
        "triton_sparsemax_michelot",
    }


def test_a_kernel_over_budget_fails(budgets):
    kernel = budgets.Kernel(registers=72, stack=0, instructions=1000, loops={"top_tau_search": 300})
    budget = budgets.budget_of(kernel)
    assert budget["registers"] == 80 and budget["stack"] == 0 and budget["loops"] == {"top_tau_search": 316}
    measured = {"cuda": {"sm_90": {"k": kernel}}}
    assert budgets.check(measured, {"cuda": {"sm_90": {"k": budget}}}) == []
    grown = budgets.Kernel(registers=72, stack=64, local=3, instructions=1000, loops={"top_tau_search": 440})
    problems = budgets.check({"cuda": {"sm_90": {"k": grown}}}, {"cuda": {"sm_90": {"k": budget}}})
    assert problems == [
        "cuda sm_90 k: stack 64 > 0",
        "cuda sm_90 k: local 3 > 0",
        "cuda sm_90 k: loop top_tau_search: 440 instructions > 316",
    ]
    assert budgets.check(measured, {}) == ["cuda sm_90 k: no budget (--set-budgets, then commit)"]
    stale = {"cuda": {"sm_90": {"k": budget, "gone": budget}}}
    assert budgets.check(measured, stale) == ["cuda sm_90 gone: budgeted but not built"]
