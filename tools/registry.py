"""The set of tool contracts a run may use, looked up by name."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from loopwright.tools.contract import ToolContract


class ToolRegistry:
    def __init__(self, contracts: Iterable[ToolContract]) -> None:
        self._contracts: dict[str, ToolContract] = {}
        for contract in contracts:
            if contract.name in self._contracts:
                raise ValueError(f"tool {contract.name} registered twice")
            self._contracts[contract.name] = contract

    def get(self, name: str) -> ToolContract | None:
        return self._contracts.get(name)

    def names(self) -> list[str]:
        return sorted(self._contracts)

    def __iter__(self) -> Iterator[ToolContract]:
        return iter(self._contracts.values())

    def schema_hashes(self) -> dict[str, str]:
        return {c.name: c.schema_hash for c in self}
