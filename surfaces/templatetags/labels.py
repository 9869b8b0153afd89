"""Labels in people's words for the console's templates: `{{ rec.step_index|step_label:rec.agent_name }}`
("router", "semantic guard", "planner step 2"; the numbering's one reading is
`audit.recorder.facts.step_label`) and `{{ review.verdict|verdict_label }}` (the verdict enum's label)."""

from django import template

from audit.models import ReviewVerdict
from audit.recorder.facts import step_label as _step_label

register = template.Library()


@register.filter
def step_label(step_index, agent_name=""):
    return _step_label(step_index, agent_name or "")


@register.filter
def verdict_label(verdict):
    """A review verdict's label ("needs follow-up"), or the stored word for one it does not know."""
    return dict(ReviewVerdict.choices).get(verdict, verdict)
