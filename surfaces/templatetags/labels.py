"""Labels in people's words for the console's templates: `{{ rec.step_index|step_label:rec.agent_name }}`
("router", "semantic guard", "planner step 2"; the numbering's one reading is
`audit.write.runtime_facts.step_label`), `{{ review.verdict|verdict_label }}` (the verdict enum's label) and
`{{ run.status|enum_label }}` (a stored enum word: `surfaces.admin.display.label`)."""

from django import template

from audit.models import ReviewVerdict
from audit.write.runtime_facts import step_label as _step_label
from surfaces.admin.display import label as _label

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
