"""Static budgets of the GPU kernels, checked without a GPU (issue #46): every CUDA kernel of csrc/cuda
compiled for sm_90 and sm_80, and the Triton kernels that bench/gpu_script.py times compiled for sm_90,
then read — ``ptxas -v`` for registers, stack frame and spills, the SASS (``nvdisasm``) for local-memory
instructions (``LDL``/``STL``: a stack frame or a spill in use), subroutine calls (64-bit division),
the kernel's instructions and the instructions of its marked hot loops::

    PYTHONPATH=.:python python bench/kernel_budgets.py                # check against bench/kernel_budgets.json
    PYTHONPATH=.:python python bench/kernel_budgets.py --write        # and rewrite bench/RESULTS_kernel_budgets.md
    PYTHONPATH=.:python python bench/kernel_budgets.py --set-budgets  # the measurements become the budgets

A hot loop is marked in the source by a comment ``sass-loop: NAME`` on its header (``// sass-loop:
top_tau_search`` in csrc/team_rows.h, ``# sass-loop: …`` in sop_kernels/); its instructions are those that
the line information (``nvcc -lineinfo``, Triton's own; it changes no code) places on the loop's source
lines, inlined calls included: the static code of the loop — top_tau's threshold search, sparsemax's Michelot
iteration — with every copy the compiler makes of it (a peeled or unrolled loop counts each copy), so a
bigger step or more copies both show.  (The SASS of such a loop is not one address range: the compiler
lays it out in pieces, with fallback paths for shuffles of a diverged warp.)

Exits 1 when a kernel exceeds a budget, has none, or a budget names a kernel no longer built (run
``--set-budgets`` after a deliberate change and commit the file: the diff shows what moved).  Budgets
from ``--set-budgets``: stack, spills, local-memory instructions and calls exactly as measured (0 stays
0), registers and instructions with a little headroom (:func:`budget_of`).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CUDA_DIR = ROOT / "csrc" / "cuda"
BUDGETS = ROOT / "bench" / "kernel_budgets.json"
RESULTS = ROOT / "bench" / "RESULTS_kernel_budgets.md"
CUDA_ARCHES = ("90", "80")
MARKER = re.compile(r"(?://|#) sass-loop: (\w+)")
EXACT = ("stack", "spill_stores", "spill_loads", "local", "calls")  # budgets as measured
HEADROOM = {"registers": 8, "instructions": 0.05, "loops": 0.05}  # registers +8; instructions, loops +5 %


@dataclass
class Kernel:
    """What the budgets bound, for one kernel on one architecture."""

    registers: int = 0
    stack: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    local: int = 0  # LDL / STL instructions
    calls: int = 0  # CALL instructions (the 64-bit division and remainder subroutines)
    instructions: int = 0
    loops: dict[str, int] = field(default_factory=dict)  # marked hot loop -> its static instructions


def tool(name: str) -> str:
    """``cuobjdump`` / ``nvdisasm``: on PATH, in CUDA's bin, or the copies Triton ships."""
    found = shutil.which(name) or shutil.which(name, path="/usr/local/cuda/bin")
    if found:
        return found
    import triton

    bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
    if bundled.exists():
        return str(bundled)
    raise SystemExit(f"kernel_budgets: {name} not found (CUDA's bin, PATH, or triton/backends/nvidia/bin)")


def marked_range(lines: list[str], first: int) -> int:
    """The last line of the loop whose header is line ``first`` (1-based): the brace that closes it (C++),
    or the last line indented deeper than the header (Python)."""
    header = lines[first - 1]
    if "//" in header:  # C++
        depth = 0
        for number in range(first, len(lines) + 1):
            depth += lines[number - 1].count("{") - lines[number - 1].count("}")
            if depth == 0:
                return number
        return len(lines)
    indent = len(header) - len(header.lstrip())
    last = first
    for number in range(first + 1, len(lines) + 1):
        text = lines[number - 1]
        if text.strip() and len(text) - len(text.lstrip()) <= indent:
            break
        last = number if text.strip() else last
    return last


def markers() -> dict[str, set[tuple[str, int]]]:
    """``loop name -> {(file name, line)}``: the source lines of every loop whose header carries a
    ``sass-loop:`` comment, in csrc/ and sop_kernels/."""
    found = {}
    for path in [*ROOT.glob("csrc/**/*.*"), *ROOT.glob("sop_kernels/*.py")]:
        lines = path.read_text().splitlines()
        for number, line in enumerate(lines, start=1):
            match = MARKER.search(line)
            if match:
                found[match.group(1)] = {(path.name, n) for n in range(number, marked_range(lines, number) + 1)}
    return found


# ----------------------------------------------------------------------------- reading ptxas and SASS


def ptxas_usage(log: str) -> dict[str, dict[str, int]]:
    """Per entry function (mangled name) of a ``ptxas -v`` log: registers, stack and spill bytes."""
    usage: dict[str, dict[str, int]] = {}
    name = None
    for line in log.splitlines():
        match = re.search(r"Function properties for (\S+)", line)
        if match:
            name = match.group(1)
            usage[name] = {}
            continue
        if name is None:
            continue
        for key, pattern in (
            ("stack", r"(\d+) bytes stack frame"),
            ("spill_stores", r"(\d+) bytes spill stores"),
            ("spill_loads", r"(\d+) bytes spill loads"),
            ("registers", r"Used (\d+) registers"),
        ):
            match = re.search(pattern, line)
            if match:
                usage[name][key] = int(match.group(1))
    return usage


@dataclass
class Instruction:
    address: int
    text: str
    lines: frozenset  # (file name, line) of the instruction and of every call it was inlined through


def sass_functions(sass: str) -> dict[str, list[Instruction]]:
    """Per function of ``nvdisasm -gi`` output: its instructions."""
    functions: dict[str, list[Instruction]] = {}
    instructions: list[Instruction] = []
    location: frozenset = frozenset()
    comments: set = set()
    for line in sass.splitlines():
        start = re.match(r"^\.text\.(\S+):$", line)
        if start:
            instructions, location = [], frozenset()
            functions[start.group(1)] = instructions
            continue
        info = re.findall(r'"([^"]+)", line (\d+)', line) if "//##" in line else []
        if info:
            comments.update((Path(file).name, int(number)) for file, number in info)
            continue
        op = re.match(r"^\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if op:
            if comments:
                location, comments = frozenset(comments), set()
            instructions.append(Instruction(int(op.group(1), 16), op.group(2), location))
    return functions


def measure_sass(instructions: list[Instruction], marks: dict[str, set[tuple[str, int]]]) -> dict:
    """Local-memory instructions, calls, instruction count and marked loops of one function: a loop's
    instructions are those the line information places on its source lines, inlined calls included (the
    compiler lays a loop out in pieces, with fallback paths for diverged shuffles: its SASS is not one
    address range)."""
    opcode = [re.sub(r"^@!?U?P\w+\s+", "", ins.text).split()[0] for ins in instructions]
    loops = {name: sum(1 for ins in instructions if ins.lines & lines) for name, lines in marks.items()}
    return dict(
        local=sum(1 for op in opcode if op.split(".")[0] in ("LDL", "STL")),
        calls=sum(1 for op in opcode if op.startswith("CALL")),
        instructions=len(instructions),
        loops={name: count for name, count in loops.items() if count},
    )


def disassemble(objects: list[Path], workdir: Path) -> str:
    """The SASS of ``objects`` (relocatable objects or cubins) with inlined line information."""
    text = []
    for obj in objects:
        cubins = [obj]
        if obj.suffix != ".cubin":
            out = workdir / obj.stem
            out.mkdir(exist_ok=True)
            subprocess.run(
                [tool("cuobjdump"), "-xelf", "all", str(obj.resolve())], cwd=out, check=True, capture_output=True
            )
            cubins = sorted(out.glob("*.cubin"))
        for cubin in cubins:
            text.append(
                subprocess.run(
                    [tool("nvdisasm"), "-gi", "-c", str(cubin)], capture_output=True, text=True, check=True
                ).stdout
            )
    return "\n".join(text)


def short_name(mangled: list[str]) -> list[str]:
    """Demangled names without namespaces and parameter lists: ``top_tau_forward_kernel<WarpTeam<32>, 8, …>``."""
    names = subprocess.run(["c++filt"], input="\n".join(mangled), capture_output=True, text=True, check=True).stdout
    shortened = []
    for name in names.splitlines():
        name = re.sub(r"^void ", "", name)
        name = re.sub(r"sopfast::(cuda::)?(\(anonymous namespace\)::)?", "", name)
        depth, end = 0, len(name)
        for i, char in enumerate(name):  # cut the parameter list: the first '(' outside the template arguments
            depth += char == "<"
            depth -= char == ">"
            if char == "(" and depth == 0:
                end = i
                break
        shortened.append(name[:end])
    return shortened


# ----------------------------------------------------------------------------- CUDA


def compile_cuda(source: Path, arch: str, workdir: Path) -> tuple[Path, str]:
    obj = workdir / f"{source.stem}.sm_{arch}.o"
    command = [
        "nvcc", "-c", "-O3", "-std=c++17", "-lineinfo", "-I", str(ROOT / "csrc"),
        f"-gencode=arch=compute_{arch},code=sm_{arch}", "-Xptxas", "-v", str(source), "-o", str(obj),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"kernel_budgets: nvcc failed on {source.name} for sm_{arch}:\n{done.stderr[-3000:]}")
    return obj, done.stderr


def measure_cuda(workdir: Path, jobs: int) -> dict[str, dict[str, Kernel]]:
    """``{"sm_90": {kernel: Kernel}, "sm_80": …}`` over every csrc/cuda/*.cu."""
    marks = markers()
    sources = sorted(CUDA_DIR.glob("*.cu"))
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        compiled = {(s, a): pool.submit(compile_cuda, s, a, workdir) for a in CUDA_ARCHES for s in sources}
    measured: dict[str, dict[str, Kernel]] = {f"sm_{arch}": {} for arch in CUDA_ARCHES}
    for (_, arch), future in compiled.items():
        obj, log = future.result()
        usage = ptxas_usage(log)
        functions = sass_functions(disassemble([obj], workdir))
        names = list(usage)
        for mangled, name in zip(names, short_name(names), strict=True):
            measured[f"sm_{arch}"][name] = Kernel(**usage[mangled], **measure_sass(functions[mangled], marks))
    return measured


# ----------------------------------------------------------------------------- Triton


def triton_launches() -> list[tuple[str, object]]:
    """``(label, variant)`` of the Triton kernels bench/gpu_script.py times: top_tau forward 65,536 × 196
    (the authors' rule, fp32 and bf16), with a 2-D blur and its backward, sparsemax over 20 columns."""
    sys.path.insert(0, str(ROOT / "bench"))
    import torch
    import triton_compile_check as tcc
    from triton.compiler import make_backend

    calls = {
        "top_tau fp32": lambda: tcc.top_tau_calls(65536, 196, None, torch.float32, True, backward=False),
        "top_tau bf16": lambda: tcc.top_tau_calls(65536, 196, None, torch.bfloat16, True, backward=False),
        "top_tau blur": lambda: tcc.top_tau_calls(65536, 196, (14, 14), torch.float32, True, blur=3),
        "sparsemax 20": lambda: tcc.sparsemax_calls(2**20, 20, torch.float32, backward=True),
    }
    backend = make_backend(tcc.TARGET)
    variants = []
    for label, call in calls.items():
        with tcc.recorded_launches() as launches:
            call()
        variants += [(f"{launch.kernel.fn.__name__} [{label}]", tcc.variant_of(launch, backend)) for launch in launches]
    return variants


def compile_triton(variant, workdir: Path) -> Kernel:
    """One Triton variant for sm_90: ptxas -v on its PTX, nvdisasm on its cubin."""
    import triton
    import triton_compile_check as tcc
    from triton.compiler import ASTSource

    source = ASTSource(variant.kernel, variant.signature, variant.constexprs, variant.attrs)
    compiled = triton.compile(source, target=tcc.TARGET, options=variant.options.__dict__)
    cubin = workdir / f"{variant.name}.{abs(hash(tcc.variant_key(variant)))}.cubin"
    cubin.write_bytes(compiled.asm["cubin"])
    usage = tcc.ptxas_usage(compiled.asm["ptx"])
    instructions, *_ = sass_functions(disassemble([cubin], workdir)).values()
    return Kernel(**usage, **measure_sass(instructions, markers()))


def measure_triton(workdir: Path) -> dict[str, dict[str, Kernel]]:
    os.environ["TRITON_CACHE_DIR"] = str(workdir / "triton-cache")
    measured = {}
    for label, variant in triton_launches():
        measured.setdefault(label, compile_triton(variant, workdir))
    return {"sm_90": measured}


# ----------------------------------------------------------------------------- budgets


def budget_of(kernel: Kernel) -> dict:
    """The budget a measurement sets: see the module docstring."""
    budget = {key: getattr(kernel, key) for key in EXACT}
    budget["registers"] = min(255, kernel.registers + HEADROOM["registers"])
    budget["instructions"] = int(kernel.instructions * (1 + HEADROOM["instructions"])) + 1
    budget["loops"] = {name: int(count * (1 + HEADROOM["loops"])) + 1 for name, count in kernel.loops.items()}
    return budget


def over_budget(kernel: Kernel, budget: dict) -> list[str]:
    found = [
        f"{key} {getattr(kernel, key)} > {budget[key]}"
        for key in (*EXACT, "registers", "instructions")
        if getattr(kernel, key) > budget[key]
    ]
    for name, count in kernel.loops.items():
        if name not in budget["loops"]:
            found.append(f"loop {name}: {count} instructions, no budget")
        elif count > budget["loops"][name]:
            found.append(f"loop {name}: {count} instructions > {budget['loops'][name]}")
    found += [f"loop {name} not found (marker moved?)" for name in budget["loops"] if name not in kernel.loops]
    return found


def check(measured: dict, budgets: dict) -> list[str]:
    """Every measured kernel within its budget, every budget's kernel measured."""
    problems = []
    for kind, arches in measured.items():
        for arch, kernels in arches.items():
            limits = budgets.get(kind, {}).get(arch, {})
            for name, kernel in kernels.items():
                if name not in limits:
                    problems.append(f"{kind} {arch} {name}: no budget (--set-budgets, then commit)")
                    continue
                problems += [f"{kind} {arch} {name}: {p}" for p in over_budget(kernel, limits[name])]
            problems += [f"{kind} {arch} {name}: budgeted but not built" for name in limits if name not in kernels]
    return problems


def table(measured: dict, budgets: dict) -> list[str]:
    lines = [
        "| kind | arch | kernel | registers | stack B | spill st/ld B | LDL/STL | calls | instructions | hot loops "
        "(static instructions) |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for kind, arches in measured.items():
        for arch, kernels in arches.items():
            for name, k in sorted(kernels.items()):
                limit = budgets.get(kind, {}).get(arch, {}).get(name)
                loops = ", ".join(
                    f"{loop} {count}" + (f" (≤ {limit['loops'][loop]})" if limit and loop in limit["loops"] else "")
                    for loop, count in sorted(k.loops.items())
                )
                regs = f"{k.registers}" + (f" (≤ {limit['registers']})" if limit else "")
                lines.append(
                    f"| {kind} | {arch} | `{name}` | {regs} | {k.stack} | {k.spill_stores}/{k.spill_loads} | {k.local} "
                    f"| {k.calls} | {k.instructions} | {loops} |"
                )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help=f"rewrite {RESULTS.relative_to(ROOT)}")
    parser.add_argument("--set-budgets", action="store_true", help=f"write the measurements into {BUDGETS.name}")
    parser.add_argument("--no-triton", action="store_true", help="the CUDA kernels only")
    parser.add_argument("--table", action="store_true", help="print the table of every kernel")
    parser.add_argument("--jobs", type=int, default=2, help="nvcc processes at once")
    args = parser.parse_args(argv)
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        measured = {"cuda": measure_cuda(workdir, args.jobs)}
        if not args.no_triton:
            measured["triton"] = measure_triton(workdir)
    if args.set_budgets:
        budgets = {
            kind: {
                arch: {name: budget_of(k) for name, k in sorted(kernels.items())} for arch, kernels in arches.items()
            }
            for kind, arches in measured.items()
        }
        BUDGETS.write_text(json.dumps(budgets, indent=1) + "\n")
    budgets = json.loads(BUDGETS.read_text()) if BUDGETS.exists() else {}
    if args.no_triton:
        budgets.pop("triton", None)
    problems = check(measured, budgets)
    count = sum(len(kernels) for arches in measured.values() for kernels in arches.values())
    summary = (
        f"{count} kernels measured in {time.monotonic() - started:.0f} s; {len(problems)} over budget "
        f"({BUDGETS.relative_to(ROOT)})."
    )
    if args.write:
        header = [
            "# Static budgets of the GPU kernels (issue #46)",
            "",
            "Generated by `PYTHONPATH=.:python python bench/kernel_budgets.py --write` without a GPU: the CUDA "
            "kernels of csrc/cuda compiled by nvcc for sm_90 and sm_80 (`-O3 -lineinfo`), the Triton kernels that "
            "bench/gpu_script.py times compiled for sm_90; registers, stack and spills from `ptxas -v`; `LDL/STL` "
            "(local memory), `calls` (subroutines: 64-bit division) and instructions from the SASS (`nvdisasm`); a "
            "hot loop's instructions are those the line information places on the source lines of the loop "
            "marked `sass-loop:` (csrc/team_rows.h, sop_kernels/), inlined calls included (every copy of the "
            "loop). The budgets (in parentheses) are bench/kernel_budgets.json; CI (.ci/run) fails when a kernel "
            "exceeds one. Static counts only: how fast a kernel runs needs a GPU.",
            "",
            summary,
            "",
        ]
        RESULTS.write_text("\n".join(header + table(measured, budgets)) + "\n")
    if args.table:
        print("\n".join(table(measured, budgets)))
    print("\n".join(problems) + ("\n" if problems else "") + summary)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
