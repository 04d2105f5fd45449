"""import-linter contract types of the project (see [tool.importlinter] in pyproject.toml).

``standard_library_only``: the source packages import nothing outside the standard library and themselves
(and the project packages listed in ``allowed``). The graph must be built with ``include_external_packages``.
"""

from __future__ import annotations

import sys

from grimp import ImportGraph
from importlinter import Contract, ContractCheck, fields, output


class StandardLibraryOnlyContract(Contract):
    """Every import of ``source_modules`` (directly, at any depth of the package) is standard library or allowed."""

    type_name = "standard_library_only"

    source_modules = fields.ListField(subfield=fields.ModuleField())
    allowed = fields.ListField(subfield=fields.ModuleField(), required=False)

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        """Kept when every direct import of the sources is standard library, allowed, or inside the sources."""
        sources = [module.name for module in self.source_modules]  # type: ignore[attr-defined]
        allowed = [module.name for module in (self.allowed or [])]  # type: ignore[attr-defined]
        allowed += sources
        bad: list[tuple[str, str, list[int]]] = []
        for source in sources:
            for importer in sorted({source} | graph.find_descendants(source)):
                for imported in sorted(graph.find_modules_directly_imported_by(importer)):
                    top = imported.split(".")[0]
                    if top in sys.stdlib_module_names or top == "__future__":
                        continue
                    if any(imported == name or imported.startswith(name + ".") for name in allowed):
                        continue
                    details = graph.get_import_details(importer=importer, imported=imported)
                    bad.append((importer, imported, [detail["line_number"] for detail in details]))
        return ContractCheck(kept=not bad, metadata={"bad": bad})

    def render_broken_contract(self, check: ContractCheck) -> None:
        """One line per import outside the standard library, with its line numbers."""
        for importer, imported, lines in check.metadata["bad"]:
            where = ", ".join(f"l.{line}" for line in lines)
            output.print_error(f"{importer} imports {imported} ({where}): not the standard library")
            output.new_line()
