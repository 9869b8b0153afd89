"""Agent tools: the registry (`registry.py`), the audited execution boundary (`boundary.py`) and one module
per tool, named after the tool it registers (`lookup_knowledge.py`). Adding a tool is adding a module here
that decorates a function with `@register_tool`; `default_registry()` imports every tool module of this
package."""
