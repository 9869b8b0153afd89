"""Labels in people's words for the console's templates: `{{ rec.step_index|step_label:rec.agent_name }}`
("router", "semantic guard", "planner step 2"; the numbering's one reading is
`audit.write.runtime_facts.step_label`), `{{ review.verdict|verdict_label }}` (the verdict enum's label) and
`{{ run.status|enum_label }}` (a stored enum word: `surfaces.admin.display.label`)."""

from django import template

from audit.models import ReviewVerdict
from audit.write.runtime_facts import step_label as _step_label
from surfaces.admin.display import label as _label
from surfaces.admin.display import pretty_json as _pretty_json

register = template.Library()


@register.filter
def step_label(step_index, agent_name=""):
    return _step_label(step_index, agent_name or "")


@register.filter
def verdict_label(verdict):
    """A review verdict's label ("needs follow-up"), or the stored word for one it does not know."""
    return dict(ReviewVerdict.choices).get(verdict, verdict)


@register.filter
def enum_label(value):
    """A stored enum word in people's words ("succeeded", "AI Ops analysis"), "—" for none."""
    return _label(value)


@register.filter
def pretty_json(value):
    """A stored JSON value (tool arguments) indented, keys sorted: what a person reads, never a repr."""
    return _pretty_json(value)


@register.filter
def filters_in_use(cl) -> list[str]:
    """The titles of a change list's filters that select something now (the run list's folded
    filters name them)."""
    return [str(spec.title) for spec in cl.filter_specs if getattr(spec, "used_parameters", None)]
