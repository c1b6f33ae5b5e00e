"""A small mixed corpus from text every machine has: the Python standard library.

code: the source files; prose: their docstrings; math: generated arithmetic. Deterministic.
"""
import ast
import os
import random
import sysconfig
from collections.abc import Iterator


def stdlib_files(limit: int) -> list[str]:
    """The first ``limit`` .py files of the standard library, in sorted order (tests and sites skipped)."""
    root = sysconfig.get_paths()['stdlib']
    found = []
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = sorted(d for d in subfolders if d not in ('test', 'tests', 'site-packages', 'idlelib'))
        found.extend(os.path.join(folder, name) for name in sorted(files) if name.endswith('.py'))
    return found[:limit]


def read_text(path: str) -> str | None:
    try:
        with open(path, encoding='utf-8') as file:
            return file.read()
    except (UnicodeDecodeError, OSError):
        return None


def code_documents(files: list[str]) -> Iterator[str]:
    for path in files:
        text = read_text(path)
        if text and text.strip():
            yield text


def prose_documents(files: list[str]) -> Iterator[str]:
    """All docstrings of one module, joined by blank lines, as one document."""
    for path in files:
        text = read_text(path)
        try:
            tree = ast.parse(text or '')
        except SyntaxError:
            continue
        nodes = [tree] + [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
        docstrings = [ast.get_docstring(node) for node in nodes]
        joined = '\n\n'.join(d for d in docstrings if d)
        if joined:
            yield joined


def math_documents(count: int, problems_per_document: int = 40, seed: int = 0) -> Iterator[str]:
    """Worked arithmetic: 'a op b = c' lines with + - * over small integers."""
    rng = random.Random(seed)
    for _ in range(count):
        lines = []
        for _ in range(problems_per_document):
            a, b = rng.randint(0, 999), rng.randint(0, 99)
            op = rng.choice('+-*')
            result = a + b if op == '+' else a - b if op == '-' else a * b
            lines.append(f'{a} {op} {b} = {result}')
        yield '\n'.join(lines)


def demo_corpus(files: int = 600, math_docs: int = 600) -> dict[str, list[str]]:
    """{'code': [...], 'prose': [...], 'math': [...]} documents."""
    paths = stdlib_files(files)
    return {'code': list(code_documents(paths)), 'prose': list(prose_documents(paths)),
            'math': list(math_documents(math_docs))}
