#!/usr/bin/env python3
"""The style rules of the developers' guide, counted in C files.

    python3 dev/style_check.py [FILE ...]        (default: transformer.c)
    python3 dev/style_check.py --all             every .c, .h and .cu file of the project

For each file: lines over 100 columns, lines holding two statements (a `for` header aside),
`if`/`while` statements that share their line with their condition's body, functions with more
than 8 and more than 10 parameters (more than 10 fails transformer.c only), and macros that
hide a `return`. For transformer.c also the
lengths of Part I and Part II, each counted from its PART rule comment to the next (Part II to
the end of the file), against their limits (1,900 and 1,100 lines), and the line of the first
`*_forward` function (limit 100). Exit status 1 when any count of a rule is not 0 or a length is
over its limit. Plain Python 3, no dependencies; never part of the build or the tests.
"""
import os
import re
import subprocess
import sys

PART_I_LIMIT = 1900
PART_II_LIMIT = 1100


def strip_strings_and_comments(line):
    """The line with string and character literals emptied and any // comment dropped."""
    out = []
    i = 0
    quote = None
    while i < len(line):
        c = line[i]
        if quote:
            if c == "\\":
                i += 2
                continue
            if c == quote:
                quote = None
                out.append(c)
            i += 1
            continue
        if c in "\"'":
            quote = c
            out.append(c)
        elif line.startswith("//", i):
            break
        elif line.startswith("/*", i):
            end = line.find("*/", i + 2)
            if end < 0:
                break
            i = end + 2
            continue
        else:
            out.append(c)
        i += 1
    return "".join(out)


def two_statements(code):
    """Whether a line of code (literals and comments stripped) holds two statements."""
    text = code.strip()
    if not text or text.startswith("#"):
        return False
    # a for header's two semicolons are one statement
    text = re.sub(r"\bfor\s*\(.*?;.*?;", "for(", text)
    parts = [p for p in text.split(";") if p.strip()]
    if len(parts) >= 2 and text.count(";") >= 2:
        return True
    # `if (x) y;` or `while (x) y;` on one line (not `} while (x);` of a do loop)
    match = re.match(r"^(\}\s*else\s+)?(if|while|else)\b", text)
    if match and not text.startswith("}") and text.endswith(";"):
        depth = 0
        start = text.find("(")
        if match.group(2) == "else":
            rest = text[4:].strip()
            return bool(rest) and not rest.startswith("if")
        for j in range(start, len(text)):
            depth += text[j] == "("
            depth -= text[j] == ")"
            if depth == 0:
                return bool(text[j + 1:].strip(" ;"))
    return False


FUNCTION = re.compile(r"^(?:static\s+|inline\s+|const\s+)*[A-Za-z_][\w\s\*]*?\b(\w+)\s*\(([^;{}]*)\)\s*\{",
                      re.S)


def functions(text):
    """(name, parameter count, line) of each function definition."""
    found = []
    for match in re.finditer(r"^[A-Za-z_][^\n;{}#]*\([^;{}]*\)\s*\{", text, re.M):
        head = match.group(0)
        m = FUNCTION.match(head)
        if not m or m.group(1) in ("if", "for", "while", "switch"):
            continue
        params = m.group(2).strip()
        count = 0 if params in ("", "void") else params.count(",") + 1
        line = text.count("\n", 0, match.start()) + 1
        found.append((m.group(1), count, line))
    return found


def check(path):
    text = open(path, encoding="utf-8").read()
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    long_lines = [i + 1 for i, line in enumerate(lines) if len(line) > 100]
    shared = []
    in_block_comment = False
    for i, line in enumerate(lines):
        if in_block_comment:
            if "*/" in line:
                in_block_comment = False
            continue
        if line.strip().startswith("/*") and "*/" not in line:
            in_block_comment = True
            continue
        if line.strip().startswith("*"):
            continue
        if two_statements(strip_strings_and_comments(line)):
            shared.append(i + 1)
    macro_returns = [i + 1 for i, line in enumerate(lines)
                     if line.startswith("#define") and re.search(r"\breturn\b", line)]
    x_macros = [i + 1 for i, line in enumerate(lines)
                if line.startswith("#define") and line.rstrip().endswith("\\")
                and re.search(r"\bX\s*\(", "\n".join(lines[i:i + 3]))]
    funcs = functions(text)
    over8 = [(n, c, l) for n, c, l in funcs if c > 8]
    over10 = [(n, c, l) for n, c, l in funcs if c > 10]
    most = max((c for _, c, _ in funcs), default=0)
    print(f"{path}: {len(lines)} lines")
    print(f"  lines over 100 columns: {len(long_lines)} {long_lines[:10]}")
    print(f"  lines with two statements: {len(shared)} {shared[:10]}")
    print(f"  macros with a return: {len(macro_returns)}; X-macros: {len(x_macros)}")
    print(f"  functions: {len(funcs)}, most parameters {most}; over 8: "
          f"{', '.join(f'{n} {c}' for n, c, _ in over8) or 'none'}; over 10: {len(over10)}")
    # More than 10 parameters fails transformer.c; elsewhere it is reported (cuda/cuda_on_cpu.h
    # copies cuBLAS's signatures, of up to 23).
    is_reference = os.path.basename(path) == "transformer.c"
    failed = bool(long_lines or shared or macro_returns or x_macros or (over10 and is_reference))
    if os.path.basename(path) == "transformer.c":
        part_i = next((i for i, line in enumerate(lines) if "######## PART I " in line), None)
        part_ii = next((i for i, line in enumerate(lines) if "######## PART II" in line), None)
        if part_i is None or part_ii is None:
            print("  no PART I and PART II rule comments")
            failed = True
        else:
            size_i = part_ii - part_i
            size_ii = len(lines) - part_ii
            print(f"  Part I {size_i} lines (limit {PART_I_LIMIT:,}), Part II {size_ii} "
                  f"(limit {PART_II_LIMIT:,})")
            failed = failed or size_i > PART_I_LIMIT or size_ii > PART_II_LIMIT
        first = next((l for n, _, l in funcs if n.endswith("_forward")), None)
        print(f"  first *_forward function at line {first} (limit 100)")
        failed = failed or first is None or first > 100
    return failed


def project_files():
    """Every .c, .h and .cu file git knows of in the project (dev/ included)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    listed = subprocess.run(["git", "-C", root, "ls-files", "*.c", "*.h", "*.cu"],
                            capture_output=True, text=True, check=True).stdout.split()
    return [os.path.join(root, name) for name in listed]


def main():
    paths = sys.argv[1:] or ["transformer.c"]
    if paths == ["--all"]:
        paths = project_files()
    failed = [check(path) for path in paths]
    sys.exit(1 if any(failed) else 0)


if __name__ == "__main__":
    main()
