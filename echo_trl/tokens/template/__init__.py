"""The model's chat template: which template, what it does with tools, and every character's role."""
