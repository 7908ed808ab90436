"""Reading `EXPLAIN (ANALYZE, FORMAT JSON)` plans: structural facts, not milliseconds."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def plan_nodes(plan: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every node of the plan, its init plans and subplans included."""
    stack = [plan[0]["Plan"]]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(node.get("Plans", []))


def most_rows_read_by_one_node(plan: list[dict[str, Any]]) -> int:
    """The most rows any one node read over all its loops, those its filters dropped
    included: a scan or a sort of a whole backlog shows here as the backlog's size, on
    any machine at any load (its milliseconds do not)."""

    def rows_read(node: dict[str, Any]) -> float:
        per_loop = (
            node["Actual Rows"]
            + node.get("Rows Removed by Filter", 0)
            + node.get("Rows Removed by Index Recheck", 0)
        )
        return per_loop * node["Actual Loops"]

    return int(max(rows_read(node) for node in plan_nodes(plan)))
