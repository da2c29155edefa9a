"""Rule-based reward functions, referenced from the job spec as ``"package.module:function"``."""
