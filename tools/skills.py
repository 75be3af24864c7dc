"""Skills."""

SKILL_TOOL = "load_skill"
