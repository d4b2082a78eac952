"""app/'s import graph in numbers: modules, edges, levels, cycles (issue 25's before/after figures).

`python scripts/app_graph.py [--squash]`: with --squash every folder of app/ counts as one node (the view
the issue's figures use); without it every module is a node. Levels: the longest chain of imports once
each cycle is folded into one node. Edges in cycles: imports that close a circle (they point upward).
"""
from __future__ import annotations

import argparse

import grimp


def node_of(module: str, squash: bool) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if squash else module


def app_edges(squash: bool) -> set[tuple[str, str]]:
    graph = grimp.build_graph("app", include_external_packages=False, exclude_type_checking_imports=True,
                              cache_dir=None)
    edges = set()
    for importer in graph.modules:
        for imported in graph.find_modules_directly_imported_by(importer):
            if imported.startswith("app"):
                a, b = node_of(importer, squash), node_of(imported, squash)
                if a != b and "app" not in (a, b):
                    edges.add((a, b))
    return edges


def strongly_connected(nodes: set[str], edges: set[tuple[str, str]]) -> list[set[str]]:
    """Tarjan's algorithm, iterative enough for a few hundred nodes."""
    out = {n: [b for a, b in edges if a == n] for n in nodes}
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(n):
        index[n] = low[n] = len(index)
        stack.append(n)
        on_stack.add(n)
        for m in out[n]:
            if m not in index:
                visit(m)
                low[n] = min(low[n], low[m])
            elif m in on_stack:
                low[n] = min(low[n], index[m])
        if low[n] == index[n]:
            component = set()
            while True:
                m = stack.pop()
                on_stack.discard(m)
                component.add(m)
                if m == n:
                    break
            found.append(component)

    for n in sorted(nodes):
        if n not in index:
            visit(n)
    return found


def longest_chain(components: list[set[str]], edges: set[tuple[str, str]]) -> int:
    owner = {n: i for i, c in enumerate(components) for n in c}
    below = {i: set() for i in range(len(components))}
    for a, b in edges:
        if owner[a] != owner[b]:
            below[owner[a]].add(owner[b])
    depth: dict[int, int] = {}

    def level(i):
        if i not in depth:
            depth[i] = 1 + max((level(j) for j in below[i]), default=0)
        return depth[i]

    return max(level(i) for i in below)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--squash", action="store_true", help="one node per folder of app/")
    squash = parser.parse_args().squash
    edges = app_edges(squash)
    nodes = {n for e in edges for n in e}
    cycles = [c for c in strongly_connected(nodes, edges) if len(c) > 1]
    in_cycles = [(a, b) for a, b in edges if any(a in c and b in c for c in cycles)]
    print(f"nodes {len(nodes)}  edges {len(edges)}  levels {longest_chain(strongly_connected(nodes, edges), edges)}")
    print(f"cycles {len(cycles)}  edges in cycles {len(in_cycles)}")
    for c in cycles:
        print("  cycle:", ", ".join(sorted(c)))


if __name__ == "__main__":
    main()
